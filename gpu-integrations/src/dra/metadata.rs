//! KubeVirt's view of a prepared claim: the KEP-5304 device metadata
//! (`metadata.resource.k8s.io/v1alpha1` `DeviceMetadata`).
//!
//! virt-launcher does not read the claim's status to find the device a VM is given: it reads one
//! metadata file per claim, request and driver, mounted into the pod at
//! `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json`
//! (`resourceclaimtemplates/<pod claim name>/...` for a claim made from a template). The file is a
//! stream of JSON `DeviceMetadata` objects; gpuslice writes one per request, naming the claim and
//! listing the request's devices with their driver, pool, name and attributes, each attribute in
//! the ResourceSlice form (`{"string": "0000:3b:00.0"}`). A PCI device (a whole GPU, a
//! vendor-VFIO VF) carries [`PCI_BUS_ID_ATTRIBUTE`]; an mdev carries [`MDEV_UUID_ATTRIBUTE`].

use serde_json::{Value, json};

use super::claim::PreparedDevice;

/// The API version of the metadata objects.
pub const API_VERSION: &str = "metadata.resource.k8s.io/v1alpha1";
/// Their kind.
pub const KIND: &str = "DeviceMetadata";
/// The standard attribute naming a PCI device's address (KEP-5304).
pub const PCI_BUS_ID_ATTRIBUTE: &str = "resource.kubernetes.io/pciBusID";
/// The attribute naming an mdev's UUID, as KubeVirt 1.9 reads it. Not standardized upstream yet
/// (kubernetes#135552): this is the one place that names it.
pub const MDEV_UUID_ATTRIBUTE: &str = "mdevUUID";
/// Where the metadata files appear inside a pod.
pub const CONTAINER_ROOT: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// The annotation the resource claim controller puts on a claim made from a template: the
/// pod's name for the claim (`spec.resourceClaims[].name`).
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// The claim the metadata names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    /// The claim's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its UID.
    pub uid: String,
    /// The pod's name for it when it was made from a ResourceClaimTemplate.
    pub pod_claim_name: Option<String>,
    /// What the VM's guest needs, as attributes every device of the claim carries (on an
    /// NVSwitch node: `nvswitchPartition` and `guestDriver`,
    /// [`super::partition::guest_attributes`]); empty elsewhere.
    pub guest: serde_json::Map<String, Value>,
}

/// The request a device answers, as a pod names it: `gpu` for the `firstAvailable`
/// alternative `gpu/a2-8q`.
pub fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

/// The attributes KubeVirt reads for `device`: its PCI address, or its mdev UUID.
pub fn attributes(device: &PreparedDevice) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    if let Some(a) = device.pci_address {
        out.insert(
            PCI_BUS_ID_ATTRIBUTE.to_owned(),
            json!({ "string": a.to_string() }),
        );
    }
    if let Some(u) = device.mdev_uuid {
        out.insert(
            MDEV_UUID_ATTRIBUTE.to_owned(),
            json!({ "string": u.to_string() }),
        );
    }
    out
}

/// The `DeviceMetadata` object of `request` (a base request name) of `claim`: the devices of
/// `devices` that answer it.
pub fn device_metadata(
    claim: &ClaimRef,
    driver: &str,
    request: &str,
    devices: &[PreparedDevice],
) -> Value {
    let listed: Vec<Value> = devices
        .iter()
        .filter(|d| base_request(&d.request) == request)
        .map(|d| {
            let mut a = attributes(d);
            a.extend(claim.guest.clone());
            json!({
                "driver": driver,
                "pool": d.pool,
                "name": d.device,
                "attributes": a,
            })
        })
        .collect();
    let mut object = json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": claim.name,
            "namespace": claim.namespace,
            "uid": claim.uid,
            "generation": 1,
        },
        "requests": [{ "name": request, "devices": listed }],
    });
    if let (Some(p), Some(o)) = (&claim.pod_claim_name, object.as_object_mut()) {
        o.insert("podClaimName".to_owned(), Value::String(p.clone()));
    }
    object
}

/// The file's text: the object on one line, then a newline (a JSON stream of one object).
pub fn render(object: &Value) -> String {
    format!("{object}\n")
}

/// Where the pod finds the metadata file of `request` of `claim` from `driver`.
pub fn container_path(claim: &ClaimRef, request: &str, driver: &str) -> String {
    match &claim.pod_claim_name {
        Some(p) => {
            format!("{CONTAINER_ROOT}/resourceclaimtemplates/{p}/{request}/{driver}-metadata.json")
        }
        None => format!(
            "{CONTAINER_ROOT}/resourceclaims/{}/{request}/{driver}-metadata.json",
            claim.name
        ),
    }
}

/// The base requests of `devices`, each once, in order.
pub fn requests(devices: &[PreparedDevice]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for d in devices {
        let r = base_request(&d.request);
        if !out.iter().any(|o| o == r) {
            out.push(r.to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(request: &str, pci: Option<&str>, mdev: Option<&str>) -> PreparedDevice {
        PreparedDevice {
            request: request.to_owned(),
            pool: "node-a".to_owned(),
            device: "gpu-0000-3b-00-0".to_owned(),
            pci_address: pci.map(|p| p.parse().expect("address")),
            mdev_uuid: mdev.map(|m| m.parse().expect("uuid")),
            iommu_group: Some(12),
            vfio_devices: vec![],
            found: false,
        }
    }

    fn claim(template: Option<&str>) -> ClaimRef {
        ClaimRef {
            name: "vm-gpu".to_owned(),
            namespace: "default".to_owned(),
            uid: "7c4f0a52-0000-4000-8000-000000000001".to_owned(),
            pod_claim_name: template.map(str::to_owned),
            guest: serde_json::Map::new(),
        }
    }

    #[test]
    fn a_whole_gpu_carries_its_pci_bus_id_in_the_resource_slice_form() {
        let d = [device("gpu", Some("0000:3b:00.0"), None)];
        let m = device_metadata(&claim(None), "gpu.gpuslice.dev", "gpu", &d);
        assert_eq!(m["apiVersion"], API_VERSION);
        assert_eq!(m["kind"], "DeviceMetadata");
        assert_eq!(m["metadata"]["name"], "vm-gpu");
        assert_eq!(m["metadata"]["uid"], "7c4f0a52-0000-4000-8000-000000000001");
        let dev = &m["requests"][0]["devices"][0];
        assert_eq!(dev["driver"], "gpu.gpuslice.dev");
        assert_eq!(dev["pool"], "node-a");
        assert_eq!(
            dev["attributes"][PCI_BUS_ID_ATTRIBUTE],
            json!({"string": "0000:3b:00.0"})
        );
        assert!(dev["attributes"].get(MDEV_UUID_ATTRIBUTE).is_none());
        assert!(m.get("podClaimName").is_none());
    }

    #[test]
    fn an_mdev_carries_its_uuid_and_a_subrequest_is_listed_under_its_request() {
        let d = [device(
            "vgpu/a2-8q",
            None,
            Some("5e1b3c2a-1f4d-4a8e-9c6b-2d7e8f9a0b1c"),
        )];
        assert_eq!(requests(&d), vec!["vgpu".to_owned()]);
        let m = device_metadata(&claim(None), "gpu.gpuslice.dev", "vgpu", &d);
        assert_eq!(m["requests"][0]["name"], "vgpu");
        assert_eq!(
            m["requests"][0]["devices"][0]["attributes"][MDEV_UUID_ATTRIBUTE]["string"],
            "5e1b3c2a-1f4d-4a8e-9c6b-2d7e8f9a0b1c"
        );
        assert!(render(&m).ends_with("}\n"));
    }

    #[test]
    fn a_claim_from_a_template_is_found_under_its_pod_claim_name() {
        assert_eq!(
            container_path(&claim(None), "gpu", "gpu.gpuslice.dev"),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-gpu/gpu/gpu.gpuslice.dev-metadata.json"
        );
        let t = claim(Some("gpu"));
        assert_eq!(
            container_path(&t, "gpu", "gpu.gpuslice.dev"),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/gpu/gpu.gpuslice.dev-metadata.json"
        );
        let m = device_metadata(&t, "gpu.gpuslice.dev", "gpu", &[]);
        assert_eq!(m["podClaimName"], "gpu");
    }
}
