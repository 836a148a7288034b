//! Writes every DRA export the test suite knows (captures, modelled hosts, example claims) for every
//! supported Kubernetes version into `$GPUSLICE_K8S_OUT/<version>/`, for `tests/k8s/validate.sh` to
//! check with `kubernetes-validate --strict`. Without the variable the files go to a temporary
//! directory and are only checked with `gpuslice dra check`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

#[path = "../../gpu-agent/tests/apiserver/mod.rs"]
mod apiserver;

use export_support::*;

#[test]
fn every_export_is_written_for_every_supported_version() {
    let keep = std::env::var_os("GPUSLICE_K8S_OUT").map(std::path::PathBuf::from);
    let tmp = tempfile::tempdir().unwrap();
    let out = keep.clone().unwrap_or_else(|| tmp.path().to_owned());
    let a2 = a2_root();
    let l40s = l40s_root(false);
    let l40s_busy = l40s_root(true);
    // A virtual mdev parent (the kernel's sample mbochs, with mtty and mdpy beside it).
    let sample = gpu_sysfs::testing::FakeKernel::sample_mdev_drivers().unwrap();
    let inputs = tempfile::tempdir().unwrap();
    let modelled = write_fleet(
        inputs.path(),
        "modelled.json",
        &fleet(vec![h200_node("h200-a", 3), mixed_node("ws-1")]),
    );
    let big = write_fleet(
        inputs.path(),
        "big.json",
        &fleet(vec![h200_node("big", 12)]),
    );
    let state = inputs.path().join("state");
    let state = state.to_str().unwrap();
    for v in ["1.34", "1.35", "1.36", "1.36.2", "1.37"] {
        let dir = out.join(v);
        std::fs::create_dir_all(&dir).unwrap();
        let cases: Vec<(&str, Vec<&str>)> = vec![
            (
                "a2-capture",
                vec!["--root", a2.path().to_str().unwrap(), "--node", "a2-host"],
            ),
            (
                "l40s-capture",
                vec![
                    "--root",
                    l40s.root().to_str().unwrap(),
                    "--node",
                    "l40s-host",
                ],
            ),
            (
                "l40s-busy",
                vec![
                    "--root",
                    l40s_busy.root().to_str().unwrap(),
                    "--node",
                    "l40s-host",
                ],
            ),
            (
                "sample-mdev",
                vec![
                    "--root",
                    sample.root().to_str().unwrap(),
                    "--node",
                    "lab-guest",
                ],
            ),
            (
                "modelled-fleet",
                vec!["--inventory", modelled.to_str().unwrap()],
            ),
            ("big-node", vec!["--inventory", big.to_str().unwrap()]),
            // Before 1.36.2, a size chosen for the mixed-size Ada: one device per vGPU.
            (
                "modelled-fleet-size-for",
                vec![
                    "--inventory",
                    modelled.to_str().unwrap(),
                    "--size-for",
                    "0000:17:00.0=RTX6000-Ada-8Q",
                ],
            ),
        ];
        for (name, source) in cases {
            let mut args: Vec<&str> = source.clone();
            if args[0] == "--inventory" {
                args = [&["export", "dra"][..], &args[..]].concat();
            } else {
                args.extend(["export", "dra"]);
            }
            args.extend(["--k8s-version", v, "--state-dir", state]);
            let yaml = ok(&args);
            let f = dir.join(format!("{name}.yaml"));
            std::fs::write(&f, &yaml).unwrap();
            ok(&["dra", "check", f.to_str().unwrap(), "--k8s-version", v]);
        }
        std::fs::write(
            dir.join("example-claims.yaml"),
            ok(&["export", "dra", "--examples"]),
        )
        .unwrap();
    }
    if keep.is_none() {
        assert_eq!(std::fs::read_dir(out.join("1.37")).unwrap().count(), 8);
    }
}

/// The ResourceSlices `gpuslice dra publish` leaves in an API server of each supported version
/// (the stand-in on loopback, answering `/version` with that release), written as the server
/// holds them (with the metadata it adds) for `kubernetes-validate --strict`.
#[test]
fn every_published_slice_is_written_for_every_supported_version() {
    let keep = std::env::var_os("GPUSLICE_K8S_OUT").map(std::path::PathBuf::from);
    let tmp = tempfile::tempdir().unwrap();
    let out = keep.unwrap_or_else(|| tmp.path().to_owned());
    let inputs = tempfile::tempdir().unwrap();
    let nodes = ["h200-a", "ws-1"];
    let modelled = write_fleet(
        inputs.path(),
        "modelled.json",
        &fleet(vec![h200_node(nodes[0], 3), mixed_node(nodes[1])]),
    );
    for v in ["1.34", "1.35", "1.36", "1.36.2", "1.37"] {
        let release = if v.matches('.').count() == 1 {
            format!("v{v}.0")
        } else {
            format!("v{v}")
        };
        let server = apiserver::ApiServer::start(&release);
        for (i, n) in nodes.iter().enumerate() {
            server.add_node(n, &format!("00000000-0000-4000-8000-00000000000{i}"));
        }
        let kc = server.kubeconfig();
        let run = std::process::Command::new(env!("CARGO_BIN_EXE_gpuslice"))
            .args(["dra", "publish", "--kubeconfig"])
            .arg(&kc)
            .arg("--inventory")
            .arg(&modelled)
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{v}: {}{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        let slices = server.slices();
        assert!(slices.len() >= nodes.len(), "{v}: {slices:?}");
        let dir = out.join(v);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, slice) in slices {
            assert_eq!(slice["kind"], "ResourceSlice", "{v} {name}");
            assert_eq!(slice["apiVersion"], "resource.k8s.io/v1", "{v} {name}");
            // JSON is YAML: validate.sh reads every *.yaml of the version's directory.
            std::fs::write(
                dir.join(format!("published-{name}.yaml")),
                serde_json::to_string_pretty(&slice).unwrap(),
            )
            .unwrap();
        }
    }
}
