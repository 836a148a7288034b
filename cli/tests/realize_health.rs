//! `gpuslice realize` is the agent's realize (`POST /v1/realize`, one library call,
//! `gpu_node::Node::realize_graded`): a GPU graded Unhealthy is refused with the agent's error
//! kind (`unhealthy`) unless `--force`, and the answer carries the allocation as realized
//! (`status: created`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use std::path::Path;

use export_support::{ok, ok_on, on};
use gpu_sysfs::testing::{PciSpec, TreeBuilder, snapshot};

/// A GPU's `aer_dev_fatal` with three fatal errors: graded Unhealthy.
const FATAL_AER: &str = "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\n\
UnxCmplt 0\nRxOF 0\nMalfTLP 3\nECRC 0\nUnsupReq 0\nACSViol 0\nTOTAL_ERR_FATAL 3\n";

/// A sandbox made from a host with one GPU on `nvidia`, alone in its IOMMU group, with three
/// fatal AER errors; and an allocation file putting it whole in Machine `vm-1` on node `demo`.
fn unhealthy_sandbox(t: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:01:00.0",
        PciSpec::new(0x10de, 0x2204, 0x030000)
            .driver("nvidia")
            .group(1)
            .link(16, 16, "16.0 GT/s PCIe", "16.0 GT/s PCIe"),
    )
    .attr("0000:01:00.0", "aer_dev_fatal", FATAL_AER);
    let tree = b.finish().unwrap();
    let dir = t.join("sbx");
    let (from, to) = (tree.root().to_str().unwrap(), dir.to_str().unwrap());
    ok(&["sandbox", "init", "--from", from, to]);
    let topo: serde_json::Value =
        serde_json::from_str(&ok_on(&dir, &["topology", "-o", "json", "--no-nvml"])).unwrap();
    let name = topo["gpus"][0]["name"].as_str().unwrap().to_owned();
    let allocation = t.join("allocation.json");
    let doc = serde_json::json!({"machine": "vm-1", "node": "demo", "devices": [
        {"kind": "gpu", "request": "gpu", "name": name, "address": "0000:01:00.0"}]});
    std::fs::write(&allocation, doc.to_string()).unwrap();
    (dir, allocation)
}

#[test]
fn realize_refuses_an_unhealthy_gpu_as_the_agent_does_unless_forced() {
    let t = tempfile::tempdir().unwrap();
    let (dir, allocation) = unhealthy_sandbox(t.path());
    let f = allocation.to_str().unwrap();
    let before = snapshot(&dir).unwrap();
    let o = on(&dir, &["realize", "--allocation", f, "-o", "json"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stdout.is_empty(), "a refusal prints no answer");
    // The sandbox notice comes first on stderr, then the error document.
    let stderr = String::from_utf8_lossy(&o.stderr);
    let doc = stderr
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_default();
    let err: serde_json::Value = serde_json::from_str(doc).unwrap();
    assert_eq!(err["error"]["kind"], "unhealthy", "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("Machine vm-1: 0000:01:00.0 is Unhealthy (AER fatal 3"),
        "{message}"
    );
    assert!(message.contains("--force"), "says how to force: {message}");
    assert_eq!(snapshot(&dir).unwrap(), before, "nothing written");

    let o = on(
        &dir,
        &["realize", "--allocation", f, "--force", "-o", "json"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let done: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(done["changed"], true, "{done}");
    assert_eq!(done["allocation"]["status"], "created", "{done}");
    assert_eq!(done["allocation"]["machine"], "vm-1", "{done}");
    let warnings = done["warnings"].to_string();
    assert!(warnings.contains("0000:01:00.0 is Unhealthy"), "{done}");
    assert!(
        err.contains("gpuslice: warning: 0000:01:00.0 is Unhealthy"),
        "{err}"
    );
}
