//! Property: whichever single write of a multi-step operation fails, and with whatever errno,
//! the operation reports the failure and the host tree is exactly as it was before.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpu_core::{MdevUuid, PciAddress};
use gpu_sysfs::actuate::error::errno;
use gpu_sysfs::actuate::{self, MdevCreate};
use gpu_sysfs::testing::{Entry, FakeKernel};
use proptest::prelude::*;

const ERRNOS: &[i32] = &[
    errno::EIO,
    errno::EBUSY,
    errno::ENODEV,
    errno::EINVAL,
    errno::ENOSPC,
    errno::EPERM,
];

fn gpu() -> PciAddress {
    "0000:01:00.0".parse().unwrap()
}

/// Creates of `n` instances over the three sample parents, in a mix of types.
fn creates(n: u32) -> Vec<MdevCreate> {
    let kinds = [
        ("mbochs", "mbochs-large"),
        ("mbochs", "mbochs-small"),
        ("mtty", "mtty-2"),
        ("mdpy", "mdpy-hd"),
    ];
    (0..n)
        .map(|i| {
            let (p, t) = kinds[i as usize % kinds.len()];
            MdevCreate {
                parent: p.parse().unwrap(),
                type_id: t.parse().unwrap(),
                uuid: MdevUuid::for_machine("vm-a", "gpus", i),
            }
        })
        .collect()
}

/// The tree with every `vfio-dev/vfioN` read as `vfio-dev/vfio*`: the kernel numbers VFIO devices
/// in bind order (lowest free), so a rollback that rebinds in another order renumbers them.
fn tree_up_to_vfio_numbering(k: &FakeKernel) -> std::collections::BTreeMap<String, Entry> {
    k.snapshot()
        .unwrap()
        .into_iter()
        .map(|(path, e)| match path.split_once("vfio-dev/vfio") {
            Some((head, tail)) => {
                let rest = tail.trim_start_matches(|c: char| c.is_ascii_digit());
                (format!("{head}vfio-dev/vfio*{rest}"), e)
            }
            None => (path, e),
        })
        .collect()
}

/// How many writes the operation makes when nothing fails.
fn writes_of(run: impl Fn(&FakeKernel) -> bool, make: impl Fn() -> FakeKernel) -> usize {
    let k = make();
    assert!(run(&k), "the operation succeeds without faults");
    k.writes().len()
}

fn bind_ok(k: &FakeKernel) -> bool {
    actuate::bind_gpu(k, &gpu()).is_ok()
}

fn release_ok(k: &FakeKernel) -> bool {
    actuate::release_gpu(k, &gpu(), false).is_ok()
}

/// Writes of binding, then of releasing, the passthrough host's first GPU.
static RELEASE_WRITES: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();

fn bound_host() -> FakeKernel {
    let k = FakeKernel::passthrough_host().unwrap();
    actuate::bind_gpu(&k, &gpu()).unwrap();
    k
}

#[test]
fn the_operations_under_test_make_several_writes() {
    // Binding GPU + audio: override, unbind, probe for each function.
    assert_eq!(
        writes_of(bind_ok, || FakeKernel::passthrough_host().unwrap()),
        6
    );
    assert_eq!(
        writes_of(
            |k| actuate::create_mdevs(k, &creates(5)).is_ok(),
            || FakeKernel::sample_mdev_drivers().unwrap()
        ),
        5
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn a_failed_write_while_binding_leaves_the_host_as_it_was(k in 1usize..=6, e in 0..ERRNOS.len()) {
        let kernel = FakeKernel::passthrough_host().unwrap().failing_at(k, ERRNOS[e]);
        let before = kernel.snapshot().unwrap();
        let r = actuate::bind_gpu(&kernel, &gpu());
        prop_assert!(r.is_err(), "write {} failed, yet bind succeeded", k);
        prop_assert_eq!(kernel.snapshot().unwrap(), before);
    }

    #[test]
    fn a_failed_write_while_releasing_leaves_the_host_as_it_was(extra in 1usize..=6, e in 0..ERRNOS.len()) {
        let (binds, releases) = *RELEASE_WRITES.get_or_init(|| {
            let binds = writes_of(bind_ok, || FakeKernel::passthrough_host().unwrap());
            (binds, writes_of(release_ok, bound_host) - binds)
        });
        prop_assume!(extra <= releases);
        let kernel = bound_host().failing_at(binds + extra, ERRNOS[e]);
        let before = tree_up_to_vfio_numbering(&kernel);
        let r = actuate::release_gpu(&kernel, &gpu(), false);
        prop_assert!(r.is_err());
        prop_assert_eq!(tree_up_to_vfio_numbering(&kernel), before);
    }

    #[test]
    fn a_failed_create_leaves_no_instance_behind(
        (n, at) in (1u32..=6).prop_flat_map(|n| (Just(n), 1usize..=n as usize)),
        e in 0..ERRNOS.len()
    ) {
        let kernel = FakeKernel::sample_mdev_drivers().unwrap().failing_at(at, ERRNOS[e]);
        let before = kernel.snapshot().unwrap();
        let r = actuate::create_mdevs(&kernel, &creates(n));
        prop_assert!(r.is_err());
        prop_assert_eq!(r.unwrap_err().errno(), Some(ERRNOS[e]));
        prop_assert_eq!(kernel.snapshot().unwrap(), before);
    }

    #[test]
    fn a_failed_write_while_retyping_a_vf_keeps_its_type(at in 1usize..=2, e in 0..ERRNOS.len()) {
        let kernel = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
        let vf: PciAddress = "0000:26:00.4".parse().unwrap();
        actuate::set_vf_type(&kernel, &vf, 1155, false).unwrap();
        let kernel = kernel.failing_at(1 + at, ERRNOS[e]);
        let before = kernel.snapshot().unwrap();
        prop_assert!(actuate::set_vf_type(&kernel, &vf, 1152, false).is_err());
        prop_assert_eq!(kernel.snapshot().unwrap(), before);
    }
}

const SAMPLE_TYPES: &[(&str, &str, u32)] = &[
    ("mbochs", "mbochs-small", 4),
    ("mbochs", "mbochs-medium", 16),
    ("mbochs", "mbochs-large", 64),
    ("mtty", "mtty-1", 1),
    ("mtty", "mtty-2", 2),
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// A batch that runs out of room part-way (a natural ENOSPC, not an injected one) is undone
    /// too: either every instance exists afterwards, or none of them.
    #[test]
    fn a_batch_of_creates_is_all_or_nothing(picks in proptest::collection::vec(0..SAMPLE_TYPES.len(), 1..10)) {
        let kernel = FakeKernel::sample_mdev_drivers().unwrap();
        let before = kernel.snapshot().unwrap();
        let reqs: Vec<MdevCreate> = picks
            .iter()
            .enumerate()
            .map(|(i, &p)| MdevCreate {
                parent: SAMPLE_TYPES[p].0.parse().unwrap(),
                type_id: SAMPLE_TYPES[p].1.parse().unwrap(),
                uuid: MdevUuid::for_machine("vm-b", "x", i as u32),
            })
            .collect();
        // The oracle: each parent's pool (mbochs 256 MB, mtty 24 ports) must hold the batch.
        let need = |parent: &str| -> u32 {
            picks.iter().map(|&p| SAMPLE_TYPES[p]).filter(|t| t.0 == parent).map(|t| t.2).sum()
        };
        let fits = need("mbochs") <= 256 && need("mtty") <= 24;
        match actuate::create_mdevs(&kernel, &reqs) {
            Ok(made) => {
                prop_assert!(fits);
                prop_assert_eq!(made.len(), reqs.len());
                let listed = actuate::list_instances(&kernel).unwrap();
                prop_assert_eq!(listed.len(), reqs.len());
            }
            Err(e) => {
                prop_assert!(!fits, "refused a batch that fits: {}", e);
                prop_assert_eq!(e.errno(), Some(errno::ENOSPC));
                prop_assert_eq!(kernel.snapshot().unwrap(), before);
            }
        }
    }
}
