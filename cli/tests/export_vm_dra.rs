//! `gpuslice export vm --dra`: a ResourceClaimTemplate and a KubeVirt VirtualMachine naming its
//! devices by `claimName` and `requestName`; and the KubeVirt VMs of `examples/dra/kubevirt/`,
//! whose fields are checked here against KubeVirt 1.9's API (kubernetes-validate has no KubeVirt
//! schema; tests/k8s/validate.sh checks the core objects).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use std::collections::BTreeSet;

use export_support::*;
use gpu_core::{
    AllocatedDevice, Allocation, AllocationStatus, MdevUuid, ParentId, VgpuFramework, VgpuTypeId,
};
use serde_json::Value;

/// The VirtualMachine fields gpuslice writes or its examples use, as KubeVirt 1.9's API names
/// them (`VirtualMachineInstanceSpec.resourceClaims` is a list of Kubernetes
/// `PodResourceClaim`; `GPU` and `HostDevice` embed `ClaimRequest` inline).
const KUBEVIRT_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata.name",
    "metadata.namespace",
    "spec.runStrategy",
    "spec.template.spec.nodeSelector.*",
    "spec.template.spec.resourceClaims[].name",
    "spec.template.spec.resourceClaims[].resourceClaimName",
    "spec.template.spec.resourceClaims[].resourceClaimTemplateName",
    "spec.template.spec.domain.devices.gpus[].name",
    "spec.template.spec.domain.devices.gpus[].deviceName",
    "spec.template.spec.domain.devices.gpus[].claimName",
    "spec.template.spec.domain.devices.gpus[].requestName",
    "spec.template.spec.domain.devices.hostDevices[].name",
    "spec.template.spec.domain.devices.hostDevices[].deviceName",
    "spec.template.spec.domain.devices.hostDevices[].claimName",
    "spec.template.spec.domain.devices.hostDevices[].requestName",
    "spec.template.spec.domain.devices.disks[].name",
    "spec.template.spec.domain.devices.disks[].disk.bus",
    "spec.template.spec.domain.resources.requests.memory",
    "spec.template.spec.volumes[].name",
    "spec.template.spec.volumes[].cloudInitNoCloud.userData",
    "spec.template.spec.volumes[].containerDisk.image",
];

fn leaf_paths(v: &Value, prefix: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) if prefix.ends_with("nodeSelector") => {
            out.extend(m.keys().map(|_| format!("{prefix}.*")));
        }
        Value::Object(m) => {
            for (k, x) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaf_paths(x, &p, out);
            }
        }
        Value::Array(items) => {
            for x in items {
                leaf_paths(x, &format!("{prefix}[]"), out);
            }
        }
        _ => out.push(prefix.to_owned()),
    }
}

/// Every field of `vm` is a KubeVirt 1.9 field, and every device names a claim of the VM and a
/// request of that claim (`requests` of the claim's template, by template name).
fn check_vm(vm: &Value, requests: &dyn Fn(&str) -> Option<BTreeSet<String>>) {
    let mut paths = Vec::new();
    leaf_paths(vm, "", &mut paths);
    for p in &paths {
        assert!(
            KUBEVIRT_FIELDS.contains(&p.as_str()),
            "{p} is not a KubeVirt 1.9 VirtualMachine field"
        );
    }
    assert_eq!(vm["apiVersion"], "kubevirt.io/v1");
    assert_eq!(vm["kind"], "VirtualMachine");
    let spec = &vm["spec"]["template"]["spec"];
    let claims = spec["resourceClaims"].as_array().unwrap();
    let mut named = 0;
    for list in ["gpus", "hostDevices"] {
        for d in spec["domain"]["devices"][list]
            .as_array()
            .into_iter()
            .flatten()
        {
            named += 1;
            assert!(
                d.get("deviceName").is_none(),
                "{d}: a DRA device has no deviceName"
            );
            let claim = claims
                .iter()
                .find(|c| c["name"] == d["claimName"])
                .unwrap_or_else(|| panic!("{d}: claimName is no entry of resourceClaims"));
            let template = claim["resourceClaimTemplateName"].as_str().unwrap();
            let names = requests(template).unwrap_or_else(|| panic!("no template {template}"));
            assert!(
                names.contains(d["requestName"].as_str().unwrap()),
                "{d}: requestName is no request of template {template} ({names:?})"
            );
        }
    }
    assert!(named > 0);
}

fn write_json<T: serde::Serialize>(dir: &std::path::Path, name: &str, v: &T) -> String {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p.to_str().unwrap().to_owned()
}

fn request_names(template: &Value) -> BTreeSet<String> {
    template["spec"]["spec"]["devices"]["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect()
}

fn allocation() -> Allocation {
    Allocation {
        machine: "desk-1".into(),
        node: "ws-1".into(),
        status: AllocationStatus::Created,
        devices: vec![
            AllocatedDevice::Gpu {
                request: "whole".into(),
                name: "radeon0".into(),
                address: "0000:3b:00.0".parse().unwrap(),
                functions: vec![],
                memory_mib: None,
            },
            AllocatedDevice::Vgpu {
                request: "desktop".into(),
                index: 0,
                parent: ParentId::Pci("0000:af:00.0".parse().unwrap()),
                gpu: Some("0000:af:00.0".parse().unwrap()),
                framework: VgpuFramework::Mdev,
                profile: VgpuTypeId::from_str_unchecked("nvidia-223"),
                profile_name: "GRID T4-2Q".into(),
                framebuffer_mib: Some(2048),
                mig_slices: None,
                uuid: MdevUuid::for_machine("desk-1", "desktop", 0),
                gpu_instance_start: None,
                placement_id: None,
            },
        ],
    }
}

#[test]
fn export_vm_dra_prints_a_claim_template_and_a_vm_naming_its_requests() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_fleet(dir.path(), "fleet.json", &fleet(vec![mixed_node("ws-1")]));
    let alloc = write_json(dir.path(), "alloc.json", &allocation());
    let base = [
        "export",
        "vm",
        "--dra",
        "--allocation",
        &alloc,
        "--inventory",
        f.to_str().unwrap(),
        "--force",
    ];
    let mut args = vec!["-o", "json"];
    args.extend(base);
    let list: Value = serde_json::from_str(&ok(&args)).unwrap();
    assert_eq!(list["kind"], "List");
    let (template, vm) = (&list["items"][0], &list["items"][1]);
    assert_eq!(template["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(template["kind"], "ResourceClaimTemplate");
    assert_eq!(template["metadata"]["name"], "desk-1-gpus");
    check_vm(vm, &|name| {
        (name == "desk-1-gpus").then(|| request_names(template))
    });
    assert_eq!(
        vm["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"],
        "ws-1"
    );

    // The whole GPU: DeviceClass gpu, that GPU; the vGPU: DeviceClass vgpu, its profile on its
    // GPU, and the profile in the opaque config `dra prepare` reads.
    let requests = template["spec"]["spec"]["devices"]["requests"]
        .as_array()
        .unwrap();
    let by_name = |n: &str| requests.iter().find(|r| r["name"] == n).unwrap();
    let whole = &by_name("whole-0")["exactly"];
    assert_eq!(whole["deviceClassName"], "gpu");
    assert_eq!(
        whole["selectors"][0]["cel"]["expression"],
        "device.attributes[\"resource.kubernetes.io\"].pciBusID == \"0000:3b:00.0\""
    );
    let vgpu = &by_name("desktop-0")["exactly"];
    assert_eq!(vgpu["deviceClassName"], "vgpu");
    let exprs: Vec<&str> = vgpu["selectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["cel"]["expression"].as_str().unwrap())
        .collect();
    assert_eq!(
        exprs,
        [
            "has(device.attributes[\"gpu.gpuslice.dev\"].profile_T4_2Q)",
            "device.attributes[\"gpu.gpuslice.dev\"].gpuPciBusID == \"0000:af:00.0\"",
        ]
    );
    let config = &template["spec"]["spec"]["devices"]["config"][0];
    assert_eq!(config["requests"], serde_json::json!(["desktop-0"]));
    assert_eq!(config["opaque"]["driver"], "gpu.gpuslice.dev");
    assert_eq!(config["opaque"]["parameters"]["profile"], "T4-2Q");
    let devices = &vm["spec"]["template"]["spec"]["domain"]["devices"];
    assert_eq!(devices["gpus"][0]["requestName"], "desktop-0");
    assert_eq!(devices["hostDevices"][0]["requestName"], "whole-0");

    // The YAML form: the same two objects, template first.
    let yaml = ok(&base);
    let docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&yaml)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect();
    assert_eq!(docs, vec![template.clone(), vm.clone()]);
    // tests/k8s/validate.sh checks the template against each version's schema.
    if let Some(out) = std::env::var_os("GPUSLICE_K8S_OUT") {
        let dir = std::path::Path::new(&out).join("export-vm-dra");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("template.yaml"),
            serde_yaml_ng::to_string(template).unwrap(),
        )
        .unwrap();
    }

    // Another driver name goes into the selectors and the config.
    let mut args = vec!["-o", "json"];
    args.extend(base);
    args.extend(["--driver", "vgpu.example.com"]);
    let other: Value = serde_json::from_str(&ok(&args)).unwrap();
    assert_eq!(
        other["items"][0]["spec"]["spec"]["devices"]["config"][0]["opaque"]["driver"],
        "vgpu.example.com"
    );
}

#[test]
fn export_vm_dra_refuses_device_plugin_flags_and_driver_without_dra() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_fleet(dir.path(), "fleet.json", &fleet(vec![mixed_node("ws-1")]));
    let alloc = write_json(dir.path(), "alloc.json", &allocation());
    let inv = f.to_str().unwrap();
    let a = [
        "export",
        "vm",
        "--allocation",
        &alloc,
        "--inventory",
        inv,
        "--force",
    ];
    let mut args = a.to_vec();
    args.extend(["--dra", "--resource-prefix", "example.com"]);
    let out = run(&args);
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
    let mut args = a.to_vec();
    args.extend(["--driver", "x.example.com"]);
    let out = run(&args);
    assert_ne!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
}

fn yaml_docs(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn examples() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/dra")
}

#[test]
fn the_example_vms_use_kubevirt_fields_and_name_the_example_claims() {
    let claims = yaml_docs(&examples().join("30-claims.yaml"));
    let templates = |name: &str| {
        claims
            .iter()
            .find(|c| c["kind"] == "ResourceClaimTemplate" && c["metadata"]["name"] == name)
            .map(request_names)
    };
    let vms = yaml_docs(&examples().join("kubevirt/vm.yaml"));
    assert_eq!(vms.len(), 2);
    for vm in &vms {
        check_vm(vm, &templates);
    }
}

#[test]
fn the_example_device_classes_are_the_ones_gpuslice_publishes() {
    let published: Vec<Value> =
        gpu_integrations::dra::build::device_classes(gpu_integrations::dra::DEFAULT_DRIVER)
            .iter()
            .map(|c| serde_json::to_value(c).unwrap())
            .collect();
    assert_eq!(
        yaml_docs(&examples().join("10-deviceclasses.yaml")),
        published
    );
}

#[test]
fn the_example_daemonset_runs_the_agent_as_the_dra_driver_with_the_host_paths_it_needs() {
    let ds = &yaml_docs(&examples().join("20-daemonset.yaml"))[0];
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for want in [
        "agent",
        "--dra",
        "--dra-driver=gpu.gpuslice.dev",
        "--kubelet-dir=/var/lib/kubelet",
        "--cdi-dir=/var/run/cdi",
        "--node=$(NODE_NAME)",
    ] {
        assert!(args.contains(&want), "{want} missing from {args:?}");
    }
    assert_eq!(
        c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    let host_paths: BTreeSet<&str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    for want in [
        "/sys",
        "/dev/vfio",
        "/var/lib/kubelet/plugins",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        // The claim store (var/lib/gpuslice/dra, gpu_integrations::dra::DEFAULT_STATE_DIR)
        // and the agent's promises live below it.
        "/var/lib/gpuslice",
    ] {
        assert!(
            host_paths.contains(want),
            "{want} missing from {host_paths:?}"
        );
    }
    assert!(gpu_integrations::dra::DEFAULT_STATE_DIR.starts_with("var/lib/gpuslice/"));
    // Each host path is mounted at the same path in the container (CDI specs and sockets name
    // host paths).
    for m in c["volumeMounts"].as_array().unwrap() {
        let v = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap();
        assert_eq!(v["hostPath"]["path"], m["mountPath"], "{m}");
    }
    assert_eq!(pod["serviceAccountName"], "gpuslice-dra");
}

#[test]
fn the_example_rbac_reads_claims_and_writes_slices() {
    let docs = yaml_docs(&examples().join("00-rbac.yaml"));
    let role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    let verbs = |resource: &str| -> BTreeSet<String> {
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| {
                r["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|x| x == resource)
            })
            .flat_map(|r| r["verbs"].as_array().unwrap().iter())
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    let set = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>();
    assert_eq!(verbs("resourceclaims"), set(&["get", "list", "watch"]));
    assert!(
        verbs("resourceslices").is_superset(&set(&["create", "update", "delete", "list", "watch"]))
    );
    assert_eq!(verbs("nodes"), set(&["get"]));
    let sa = docs.iter().find(|d| d["kind"] == "ServiceAccount").unwrap();
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRoleBinding")
        .unwrap();
    assert_eq!(binding["subjects"][0]["name"], sa["metadata"]["name"]);
    assert_eq!(
        binding["subjects"][0]["namespace"],
        sa["metadata"]["namespace"]
    );
}
