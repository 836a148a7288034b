#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Property: for random layouts on random starting states of the fake vendor-VFIO L40S (and of
//! the same card passed through to a VM), `apply` either reaches the layout or leaves the kernel's
//! side of the host as it was; when planning refuses, nothing at all was written.

use gpu_core::PciAddress;
use gpu_core::layout::LayoutFile;
use gpu_sysfs::actuate::set_vf_type;
use gpu_sysfs::apply::{ApplyError, ApplyOptions, ApplyStatus, apply_layout, assert_config};
use gpu_sysfs::testing::fake_kernel::L40S_TYPES;
use gpu_sysfs::testing::{Entry, FakeKernel};
use proptest::prelude::*;

fn kernel_state(k: &FakeKernel) -> Vec<(String, Entry)> {
    k.snapshot()
        .unwrap()
        .into_iter()
        .filter(|(p, _)| p.starts_with("sys/") || p.starts_with("dev/"))
        .collect()
}

fn short(i: usize) -> &'static str {
    L40S_TYPES[i % L40S_TYPES.len()]
        .1
        .trim_start_matches("NVIDIA ")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn apply_reaches_the_layout_or_changes_nothing(
        on_nvidia in prop::bool::weighted(0.8),
        start_type in 0usize..23,
        start_count in 0usize..4,
        wanted in prop::collection::vec((0usize..23, 1u32..5), 1..3),
    ) {
        let driver = if on_nvidia { "nvidia" } else { "vfio-pci" };
        let k = FakeKernel::l40s_vendor_vfio_host_on(4, driver).unwrap();
        if on_nvidia {
            for i in 0..start_count {
                let vf: PciAddress = format!("0000:26:00.{}", 4 + i).parse().unwrap();
                // A start the driver refuses (it does not fit) is simply not made.
                let _ = set_vf_type(&k, &vf, L40S_TYPES[start_type].0, false);
            }
        }
        let mut text = String::from("version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices:\n");
        let mut seen = Vec::new();
        for (t, n) in &wanted {
            if !seen.contains(t) {
                seen.push(*t);
                text.push_str(&format!("        {}: {n}\n", short(*t)));
            }
        }
        let file = LayoutFile::parse(&text).unwrap();
        let config = file.select(Some("c")).unwrap();
        let before = kernel_state(&k);
        let writes = k.writes().len();
        let opts = ApplyOptions::new("l40s");
        match apply_layout(&k, config, &opts, &mut |_| {}) {
            Ok(r) if r.status == ApplyStatus::Applied || r.status == ApplyStatus::Unchanged => {
                let a = assert_config(&k, config, &opts.discover).unwrap();
                prop_assert!(a.applied, "applied but assert says {:?}", a.diff);
            }
            Ok(r) => {
                prop_assert_eq!(r.status, ApplyStatus::Incomplete);
                prop_assert!(r.changes.is_empty());
                prop_assert_eq!(k.writes().len(), writes, "an incomplete apply wrote");
                prop_assert!(kernel_state(&k) == before);
            }
            Err(ApplyError::Failed { report }) => {
                prop_assert!(report.rollback.as_ref().is_some_and(|r| r.complete), "{:?}", report);
                prop_assert!(kernel_state(&k) == before, "rolled back, yet the host changed");
            }
            Err(e) => {
                prop_assert_eq!(k.writes().len(), writes, "refused ({}) after writing", e);
                prop_assert!(k.runs().is_empty());
                prop_assert!(kernel_state(&k) == before);
            }
        }
    }
}
