//! `gpuslice doctor`: the table and JSON on modelled hosts and the real A2 capture (golden
//! files), and the exit code: 0 unless a check fails, then 1.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use export_support::*;
use gpu_sysfs::testing::doctor_hosts;

fn doctor(root: &std::path::Path, json: bool) -> (Option<i32>, String) {
    let mut args = vec!["--root", root.to_str().unwrap(), "--node", "n1", "doctor"];
    if json {
        args.extend(["-o", "json"]);
    }
    let out = run(&args);
    (out.status.code(), String::from_utf8(out.stdout).unwrap())
}

#[test]
fn a_ready_node_exits_zero() {
    let t = doctor_hosts::ready().unwrap();
    let (code, table) = doctor(t.root(), false);
    golden("doctor", "ready.txt", &table);
    assert_eq!(code, Some(0));
    assert!(
        table.ends_with("Node n1: 12 ok, 0 warn, 0 fail\n"),
        "{table}"
    );
    assert!(!table.contains("Fixes"));
}

#[test]
fn a_broken_node_exits_one_and_lists_the_fixes() {
    let t = doctor_hosts::broken().unwrap();
    let (code, table) = doctor(t.root(), false);
    golden("doctor", "broken.txt", &table);
    assert_eq!(code, Some(1));
    assert!(table.contains("\nFixes\n  iommu: enable VT-d / AMD-Vi in the firmware"));
    let (code, json) = doctor(t.root(), true);
    golden("doctor", "broken.json", &json);
    assert_eq!(code, Some(1));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["verdict"], "fail");
    let iommu = &v["checks"][0];
    assert_eq!(iommu["check"], "iommu");
    assert_eq!(iommu["verdict"], "fail");
    assert!(iommu["fix"].as_str().unwrap().contains("iommu=pt"));
}

#[test]
fn a_degraded_node_and_the_a2_capture() {
    let t = doctor_hosts::degraded().unwrap();
    let (code, table) = doctor(t.root(), false);
    golden("doctor", "degraded.txt", &table);
    assert_eq!(code, Some(1), "the T4's IOMMU group fails");
    let a2 = a2_root();
    let (code, table) = doctor(a2.path(), false);
    golden("doctor", "a2-capture.txt", &table);
    assert_eq!(code, Some(0), "only warnings: {table}");
    assert!(table.contains("iommu-group   matrox0 (0000:01:00.1)"));
}
