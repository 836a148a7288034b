//! `gpuslice agent --dra --no-publish --claims-dir DIR`: the kubelet plugin without a cluster.
//! On a sandbox of the bundled A2 host, with no kubeconfig anywhere, the kubelet's generated
//! gRPC client prepares and unprepares the example allocated claim
//! (`examples/dra/sandbox/allocated-claim.yaml`) read from the directory; a claim name of
//! 3.9 MB is answered and logged cut, never whole.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpu_agent::dra::proto::dra_v1;

const UID: &str = "6f1c2d3e-0000-4000-8000-00000000d001";

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn mdevs(sandbox: &Path) -> usize {
    std::fs::read_dir(sandbox.join("host/sys/bus/mdev/devices")).map_or(0, Iterator::count)
}

fn claim(name: &str, uid: &str) -> dra_v1::Claim {
    dra_v1::Claim {
        namespace: "default".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

#[test]
fn the_plugin_prepares_and_unprepares_a_claim_from_a_directory_with_no_kubeconfig() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = dir.path().join("sandbox");
    let init = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .env_remove("GPUSLICE_ROOT")
        .args(["sandbox", "init", "--from"])
        .arg(repo().join("examples/hosts/a2-sriov-mdev.umockdev"))
        .arg(&sandbox)
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let before = mdevs(&sandbox);
    let claims = dir.path().join("claims");
    std::fs::create_dir(&claims).unwrap();
    std::fs::copy(
        repo().join("examples/dra/sandbox/allocated-claim.yaml"),
        claims.join("allocated-claim.yaml"),
    )
    .unwrap();
    // A link out of the directory is never followed.
    std::os::unix::fs::symlink("/etc/passwd", claims.join("outside.yaml")).unwrap();
    let kubelet = dir.path().join("kubelet");
    let log = dir.path().join("agent.log");
    let _agent = Running(
        Command::new(env!("CARGO_BIN_EXE_gpuslice"))
            .env_remove("GPUSLICE_ROOT")
            .env_remove("KUBECONFIG")
            .env("HOME", dir.path())
            .arg("--root")
            .arg(format!("sandbox:{}", sandbox.display()))
            .args([
                "--node",
                "demo",
                "agent",
                "--uevents",
                "off",
                "--resync",
                "0",
            ])
            .arg("--listen")
            .arg(format!("unix:{}", dir.path().join("a.sock").display()))
            .args(["--dra", "--no-publish", "--claims-dir"])
            .arg(&claims)
            .arg("--kubelet-dir")
            .arg(&kubelet)
            .arg("--cdi-dir")
            .arg(dir.path().join("cdi"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let endpoint = kubelet.join("plugins/gpu.gpuslice.dev/dra.sock");
    let registration = kubelet.join("plugins_registry/gpu.gpuslice.dev-reg.sock");
    let t0 = Instant::now();
    while !registration.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the plugin never registered: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut c = dra_v1::dra_plugin_client::DraPluginClient::new(
        rt.block_on(gpu_agent::dra::socket::channel(endpoint))
            .unwrap(),
    );
    let prepared = rt
        .block_on(
            c.node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                claims: vec![claim("vm1-vgpu", UID), claim("outside", "uid-out")],
            }),
        )
        .unwrap()
        .into_inner();
    let answer = &prepared.claims[UID];
    assert_eq!(answer.error, "", "{answer:?}");
    assert_eq!(answer.devices[0].device_name, "vgpu-0000-08-00-0-4096mi");
    assert_eq!(answer.devices[0].pool_name, "demo");
    assert_eq!(
        mdevs(&sandbox),
        before + 1,
        "the vGPU was made on the sandbox"
    );
    assert!(
        prepared.claims["uid-out"].error.contains("not found"),
        "{:?}",
        prepared.claims["uid-out"]
    );
    // A name of 3.9 MB: answered and logged cut, with its length.
    let long = "n".repeat(3_900_000);
    let refused = rt
        .block_on(
            c.node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                claims: vec![claim(&long, "uid-long")],
            }),
        )
        .unwrap()
        .into_inner();
    let error = &refused.claims["uid-long"].error;
    assert!(error.len() < 1024, "{} bytes answered", error.len());
    assert!(error.contains("… (3900000 bytes)"), "{error}");
    let undone = rt
        .block_on(
            c.node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
                claims: vec![claim("vm1-vgpu", UID)],
            }),
        )
        .unwrap()
        .into_inner();
    assert_eq!(undone.claims[UID].error, "");
    assert_eq!(mdevs(&sandbox), before, "the vGPU was removed");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.len() < 64 * 1024, "{} bytes of log", text.len());
    assert!(text.contains("(3900000 bytes)"), "{text}");
    assert!(text.contains("outside.yaml"), "the link was named: {text}");
    assert!(!text.contains("kubeconfig"), "{text}");
}
