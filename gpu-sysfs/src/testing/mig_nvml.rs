//! A stand-in for NVML's GPU-instance placements over a fake host: it watches the MIG-backed
//! types set on each VF (through the host, as the driver would see them) and gives each new one
//! a GPU instance where its [`MigPlacing`] rule puts it, keeping earlier placements as the
//! driver does. [`MigPlacing::Lowest`] is the driver's documented first fit;
//! [`MigPlacing::Highest`] a driver that decides otherwise, to test that an apply reads back
//! what happened instead of trusting the assumption.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use gpu_core::PciAddress;
use gpu_core::mig::{MigGeometry, MigOccupancy};
use gpu_core::nvidia::VgpuTypeName;

use crate::host::Host;
use crate::resolver::{GpuInstancePlacement, GpuInstances, TypeInfo, TypeNameResolver};

/// Where a new GPU instance goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigPlacing {
    /// The lowest free allowed start (the driver's documented choice).
    Lowest,
    /// The highest free allowed start.
    Highest,
}

/// NVML's view of one fake MIG GPU; see the module documentation.
#[derive(Debug, Clone)]
pub struct FakeMigNvml {
    host: Arc<dyn Host>,
    pf: PciAddress,
    geometry: &'static MigGeometry,
    types: BTreeMap<u32, String>,
    placing: MigPlacing,
    placed: Arc<Mutex<BTreeMap<PciAddress, GpuInstancePlacement>>>,
}

impl FakeMigNvml {
    /// NVML for the GPU `pf` of `host`, whose MIG geometry is `geometry` and whose types are
    /// `types` (ID, name), placing new GPU instances by `placing`.
    pub fn new(
        host: Arc<dyn Host>,
        pf: PciAddress,
        geometry: &'static MigGeometry,
        types: &[(u32, &str)],
        placing: MigPlacing,
    ) -> Self {
        FakeMigNvml {
            host,
            pf,
            geometry,
            types: types.iter().map(|(i, n)| (*i, (*n).to_owned())).collect(),
            placing,
            placed: Arc::default(),
        }
    }

    fn vfs(&self) -> Vec<PciAddress> {
        let dir = format!("sys/bus/pci/devices/{}", self.pf);
        let mut v: Vec<(u32, PciAddress)> = self
            .host
            .list(&dir)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|e| {
                let n: u32 = e.strip_prefix("virtfn")?.parse().ok()?;
                let target = self.host.read_link(&format!("{dir}/{e}")).ok()?;
                let name = target.file_name()?.to_str()?.to_owned();
                Some((n, name.parse().ok()?))
            })
            .collect();
        v.sort();
        v.into_iter().map(|(_, a)| a).collect()
    }
}

impl TypeNameResolver for FakeMigNvml {
    fn resolve(&self, _gpu: &PciAddress, id: u32) -> Option<TypeInfo> {
        let name = self.types.get(&id)?;
        Some(TypeInfo {
            name: name.clone(),
            framebuffer_mib: VgpuTypeName::parse(name).ok().map(|n| n.framebuffer_mib()),
            max_instances: None,
        })
    }

    fn gpu_instances(&self, gpu: &PciAddress) -> GpuInstances {
        if *gpu != self.pf {
            return GpuInstances::Unsupported(format!("{gpu} is not the fake's GPU"));
        }
        let Ok(mut placed) = self.placed.lock() else {
            return GpuInstances::Failed("the fake's state is poisoned".to_owned());
        };
        let mut seen = Vec::new();
        for vf in self.vfs() {
            let current = self
                .host
                .read_string(&format!(
                    "sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type"
                ))
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
                .unwrap_or(0);
            let profile = self
                .types
                .get(&current)
                .and_then(|n| VgpuTypeName::parse(n).ok())
                .and_then(|n| {
                    self.geometry
                        .profile_for(n.mig_slices?, n.framebuffer_mib())
                });
            let Some(profile) = profile else {
                placed.remove(&vf);
                continue;
            };
            seen.push(vf);
            if placed.contains_key(&vf) {
                continue;
            }
            let mut occ = MigOccupancy::empty();
            for gi in placed.values() {
                if let Some(p) = self.geometry.profiles.iter().find(|p| {
                    u32::from(p.compute_slices) == gi.compute_slices
                        && u32::from(p.memory_slices) == gi.size
                }) {
                    if let Ok(s) = u8::try_from(gi.start) {
                        occ.hold(s, p);
                    }
                }
            }
            let mut starts = profile
                .starts
                .iter()
                .copied()
                .filter(|s| occ.is_free(*s, profile));
            let start = match self.placing {
                MigPlacing::Lowest => starts.next(),
                MigPlacing::Highest => starts.next_back(),
            };
            let Some(start) = start else {
                return GpuInstances::Failed(format!("no start for {} of VF {vf}", profile.name));
            };
            let id = u32::try_from(placed.len())
                .unwrap_or(u32::MAX)
                .saturating_add(1);
            placed.insert(
                vf,
                GpuInstancePlacement {
                    id,
                    compute_slices: u32::from(profile.compute_slices),
                    start: u32::from(start),
                    size: u32::from(profile.memory_slices),
                },
            );
        }
        placed.retain(|vf, _| seen.contains(vf));
        GpuInstances::Known(placed.values().copied().collect())
    }
}
