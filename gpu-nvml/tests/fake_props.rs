//! Properties of the fake's GPU instances against gpu-core's geometry as the oracle: whatever
//! creates and destroys come, a create succeeds exactly when its memory slices are free and the
//! profile may start there, and no two instances ever share a slice.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpu_core::PciAddress;
use gpu_core::mig::{GEOMETRIES, MigOccupancy};
use gpu_nvml::fake::profiles::nvml_profile;
use gpu_nvml::fake::{FakeGpu, FakeNvml};
use gpu_nvml::{MigMode, NvmlDevices, NvmlErrorKind, Placement};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// Profile index into the geometry's table, start slot.
    Create(usize, u32),
    /// Index into the instances listed now.
    Destroy(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..8, 0u32..9).prop_map(|(p, s)| Op::Create(p, s)),
        1 => (0usize..8).prop_map(Op::Destroy),
    ]
}

proptest! {
    #[test]
    fn a_create_succeeds_exactly_where_the_geometry_has_room(
        g in 0..GEOMETRIES.len(),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let geometry = &GEOMETRIES[g];
        let gpu: PciAddress = "0000:18:00.0".parse().unwrap();
        let n = FakeNvml::new()
            .with_gpu(gpu, FakeGpu::mig(geometry).with_mig_mode(MigMode::Enabled));
        for op in ops {
            let listed = n.gpu_instances(&gpu).unwrap();
            match op {
                Op::Create(p, start) => {
                    let Some(profile) = geometry.profiles.get(p % geometry.profiles.len()) else {
                        continue;
                    };
                    let (_, id) = nvml_profile(geometry, profile).unwrap();
                    let mut occ = MigOccupancy::empty();
                    for gi in &listed {
                        let held = geometry
                            .profiles
                            .iter()
                            .find(|q| nvml_profile(geometry, q).map(|(_, i)| i) == Some(gi.profile_id))
                            .unwrap();
                        occ.hold(u8::try_from(gi.placement.start).unwrap(), held);
                    }
                    let legal = profile.starts.iter().any(|s| u32::from(*s) == start);
                    let free = occ.is_free(u8::try_from(start).unwrap(), profile);
                    let same = listed.iter().filter(|i| i.profile_id == id).count();
                    let r = n.create_gpu_instance(
                        &gpu,
                        id,
                        Placement { start, size: u32::from(profile.memory_slices) },
                    );
                    match r {
                        Ok(_) => prop_assert!(legal && free && same < profile.starts.len()),
                        Err(e) if !legal => prop_assert_eq!(e.kind, NvmlErrorKind::InvalidArgument),
                        Err(e) => {
                            prop_assert_eq!(e.kind, NvmlErrorKind::InsufficientResources);
                            prop_assert!(!free || same >= profile.starts.len());
                        }
                    }
                }
                Op::Destroy(i) => {
                    if let Some(gi) = listed.get(i % listed.len().max(1)) {
                        n.destroy_gpu_instance(&gpu, gi.id).unwrap();
                    }
                }
            }
            let now = n.gpu_instances(&gpu).unwrap();
            for (i, a) in now.iter().enumerate() {
                for b in &now[i + 1..] {
                    prop_assert!(!a.placement.overlaps(b.placement), "{a:?} {b:?}");
                }
                prop_assert!(a.placement.start + a.placement.size <= u32::from(geometry.memory_slices));
            }
        }
    }
}
