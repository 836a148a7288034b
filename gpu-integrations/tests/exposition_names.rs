//! Whatever a node, GPU or profile is named, the Prometheus exposition keeps its shape: no name
//! can end a label or inject a line. `GPUSLICE_FUZZ_CASES` sets the cases (default 256).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::OnceLock;

use gpu_core::NodeTopology;
use gpu_sysfs::testing::{MdevTypeSpec, PciSpec, TreeBuilder};
use proptest::prelude::*;

use gpu_integrations::metrics;

/// One discovered GPU with one mdev type; each case renames node, GPU and type.
fn base() -> &'static NodeTopology {
    static BASE: OnceLock<NodeTopology> = OnceLock::new();
    BASE.get_or_init(|| {
        let mut b = TreeBuilder::new();
        b.pci(
            "0000:41:00.0",
            PciSpec::new(0x10de, 0x1eb8, 0x030200).driver("nvidia"),
        )
        .mdev_parent(
            "0000:41:00.0",
            &[MdevTypeSpec::new("nvidia-222", "GRID T4-1B", 16, None)],
        );
        let t = b.finish().unwrap();
        let host = gpu_sysfs::RealHost::new(t.root()).unwrap();
        gpu_sysfs::discover::discover(&host, &gpu_sysfs::discover::DiscoverOptions::new("n"))
            .unwrap()
    })
}

fn renamed(node: &str, gpu: &str, profile: &str) -> String {
    let mut t = base().clone();
    t.node = node.to_owned();
    t.gpus[0].name = gpu.to_owned();
    t.mediated_devices.parents[0].profiles[0].name = profile.to_owned();
    metrics::render(&[t], &[]).unwrap()
}

/// `name{label="value",...} number`, values escaped as the exposition format wants.
fn well_formed_sample(line: &str) -> bool {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let (name, mut rest) = line.split_at(name_end);
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return false;
    }
    if let Some(labels) = rest.strip_prefix('{') {
        let mut chars = labels.char_indices();
        loop {
            // label name
            let mut saw = false;
            let mut next = None;
            for (i, c) in chars.by_ref() {
                if c == '=' {
                    next = Some(i);
                    break;
                }
                if !(c.is_ascii_alphanumeric() || c == '_') {
                    return false;
                }
                saw = true;
            }
            if !saw || next.is_none() || chars.next().map(|(_, c)| c) != Some('"') {
                return false;
            }
            loop {
                match chars.next() {
                    Some((_, '\\')) => {
                        if !matches!(chars.next(), Some((_, '\\' | '"' | 'n'))) {
                            return false;
                        }
                    }
                    Some((_, '"')) => break,
                    Some(_) => {}
                    None => return false,
                }
            }
            match chars.next() {
                Some((_, ',')) => continue,
                Some((i, '}')) => {
                    rest = &labels[i + 1..];
                    break;
                }
                _ => return false,
            }
        }
    }
    rest.strip_prefix(' ')
        .is_some_and(|v| v.parse::<f64>().is_ok())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(gpu_core::testing::fuzz_cases(256)))]

    /// Whatever the names, the exposition has the same lines as with plain names, and every
    /// sample line is well formed: no name can end a label or inject a line.
    #[test]
    fn no_name_injects_a_line_into_the_exposition(
        node in any::<String>(),
        gpu in any::<String>(),
        profile in prop_oneof![any::<String>(), Just("A\"} 1\nevil 1\n#".to_owned())],
    ) {
        let plain = renamed("n", "gpu0", "GRID T4-1B");
        let text = renamed(&node, &gpu, &profile);
        prop_assert_eq!(text.lines().count(), plain.lines().count(), "{}", text);
        for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
            prop_assert!(well_formed_sample(line), "{:?}", line);
        }
    }
}
