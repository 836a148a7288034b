//! A Fabric Manager that answers as NVIDIA's does, without an NVSwitch: NVIDIA's HGX 8-GPU
//! partition set, activation and deactivation with FM's return codes, the vGPU mode's
//! activation with VFs, the restart hand-back of active partitions, and injected NVLink
//! failures. Its state can be kept in a file between processes (the sandbox's
//! `fabric.json`), through a store the caller gives ([`FakeFabric::with_store`]): gpu-node
//! writes it with gpu-sysfs's confined writer.
//!
//! Each rule, and where NVIDIA documents it, is in `docs/fabric.md`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use gpu_core::PciAddress;
use gpu_core::fabric::FabricMode;
use serde::{Deserialize, Serialize};

use crate::error::{FmError, FmErrorKind};
use crate::manager::FabricManager;
use crate::types::{FailedDevice, FmGpu, FmPartition, NvlinkFailures};

/// What `format` says in a state this version writes and reads.
pub const FORMAT: &str = "gpuslice-fake-fabric/1";
/// NVLinks per GPU on an HGX H100/H200 baseboard (18 fourth-generation links).
pub const HGX_NVLINKS: u32 = 18;

/// Everything the fake Fabric Manager knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FakeState {
    /// [`FORMAT`].
    pub format: String,
    /// The mode FM runs in.
    pub mode: FabricMode,
    /// The version it reports.
    #[serde(default)]
    pub version: Option<String>,
    /// The partitions it offers, with their active flags.
    pub partitions: Vec<FmPartition>,
    /// The VFs each partition active in vGPU mode was activated with.
    #[serde(default)]
    pub vfs: BTreeMap<u32, Vec<PciAddress>>,
    /// Devices whose NVLinks failed.
    #[serde(default)]
    pub failures: NvlinkFailures,
}

impl FakeState {
    /// The HGX 8-GPU partition set ([`gpu_core::fabric::hgx8_default_partitions`]: the sizes
    /// are NVIDIA's, the IDs and members partly confirmed, `docs/fabric.md`) over `gpus` (the
    /// baseboard's GPUs in module-ID order: `gpus[i]` has physical ID `i + 1`), none active.
    ///
    /// # Errors
    /// `BadParam` unless `gpus` has exactly eight distinct addresses.
    pub fn hgx8(gpus: &[PciAddress], mode: FabricMode) -> Result<Self, FmError> {
        let distinct: std::collections::BTreeSet<&PciAddress> = gpus.iter().collect();
        if gpus.len() != 8 || distinct.len() != 8 {
            return Err(FmError::new("fake HGX baseboard", FmErrorKind::BadParam));
        }
        let gpu = |i: usize| FmGpu {
            physical_id: i as u32 + 1,
            uuid: String::new(),
            pci_bus_id: Some(gpus[i]),
            nvlinks: HGX_NVLINKS,
            max_nvlinks: HGX_NVLINKS,
            line_rate_mbps: 25_000,
        };
        let named: Vec<(String, PciAddress)> = gpus.iter().map(|a| (String::new(), *a)).collect();
        let partitions = gpu_core::fabric::hgx8_default_partitions(&named)
            .unwrap_or_default()
            .iter()
            .map(|p| FmPartition {
                id: p.id,
                active: false,
                gpus: p.module_ids.iter().map(|m| gpu(*m as usize - 1)).collect(),
            })
            .collect();
        Ok(FakeState {
            format: FORMAT.to_owned(),
            mode,
            version: None,
            partitions,
            vfs: BTreeMap::new(),
            failures: NvlinkFailures::default(),
        })
    }

    fn find(&self, call: &'static str, id: u32) -> Result<usize, FmError> {
        self.partitions
            .iter()
            .position(|p| p.id == id)
            .ok_or_else(|| FmError::new(call, FmErrorKind::BadParam))
    }

    fn failed(&self, gpu: &FmGpu) -> bool {
        gpu.is_degraded()
            || self
                .failures
                .gpus
                .iter()
                .any(|f| f.pci_bus_id.is_some() && f.pci_bus_id == gpu.pci_bus_id)
    }

    /// The checks FM makes before activating partition `id` (index `i`).
    fn check_activation(&self, call: &'static str, i: usize) -> Result<(), FmError> {
        let p = &self.partitions[i];
        if p.active {
            return Err(FmError::new(call, FmErrorKind::InUse));
        }
        let busy = self.partitions.iter().any(|other| {
            other.active
                && other
                    .gpus
                    .iter()
                    .any(|g| p.gpus.iter().any(|m| m.physical_id == g.physical_id))
        });
        if busy {
            return Err(FmError::new(call, FmErrorKind::InUse));
        }
        if p.gpus.iter().any(|g| self.failed(g)) || !self.failures.switches.is_empty() {
            return Err(FmError::new(call, FmErrorKind::NvlinkError));
        }
        Ok(())
    }
}

/// Keeps the fake's state somewhere after each change (the sandbox's `fabric.json`).
pub type Store = Box<dyn Fn(&FakeState) -> Result<(), String> + Send + Sync>;

/// The fake Fabric Manager.
pub struct FakeFabric {
    state: Mutex<FakeState>,
    store: Option<Store>,
}

impl std::fmt::Debug for FakeFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeFabric")
            .field("state", &self.state)
            .finish()
    }
}

impl FakeFabric {
    /// A fake with `state`, kept in memory only.
    pub fn new(state: FakeState) -> Self {
        FakeFabric {
            state: Mutex::new(state),
            store: None,
        }
    }

    /// A fake with `state` that hands every changed state to `store` before answering.
    pub fn with_store(state: FakeState, store: Store) -> Self {
        FakeFabric {
            state: Mutex::new(state),
            store: Some(store),
        }
    }

    /// A copy of the state now.
    pub fn state(&self) -> FakeState {
        match self.state.lock() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Marks `ports` of the GPU or NVSwitch at `device` as failed NVLinks (a GPU's available
    /// NVLink count drops by as many in every partition listing it).
    pub fn fail_nvlinks(&self, device: PciAddress, switch: bool, ports: &[u32]) {
        let _ = self.change("fail_nvlinks", |s| {
            let failed = FailedDevice {
                uuid: String::new(),
                pci_bus_id: Some(device),
                ports: ports.to_vec(),
            };
            if switch {
                s.failures.switches.push(failed);
            } else {
                s.failures.gpus.push(failed);
                for g in s.partitions.iter_mut().flat_map(|p| p.gpus.iter_mut()) {
                    if g.pci_bus_id == Some(device) {
                        g.nvlinks = g.nvlinks.saturating_sub(ports.len() as u32);
                    }
                }
            }
            Ok(())
        });
    }

    /// Fabric Manager restarted: every partition reads inactive until it is told which are
    /// active ([`FabricManager::set_activated`]), as FM's resiliency mode requires.
    pub fn restart(&self) {
        let _ = self.change("restart", |s| {
            for p in &mut s.partitions {
                p.active = false;
            }
            Ok(())
        });
    }

    fn read<T>(
        &self,
        call: &'static str,
        f: impl FnOnce(&FakeState) -> Result<T, FmError>,
    ) -> Result<T, FmError> {
        let s = self
            .state
            .lock()
            .map_err(|_| FmError::new(call, FmErrorKind::Generic))?;
        f(&s)
    }

    fn change(
        &self,
        call: &'static str,
        f: impl FnOnce(&mut FakeState) -> Result<(), FmError>,
    ) -> Result<(), FmError> {
        let mut s = self
            .state
            .lock()
            .map_err(|_| FmError::new(call, FmErrorKind::Generic))?;
        let mut next = s.clone();
        f(&mut next)?;
        if let Some(store) = &self.store {
            store(&next).map_err(|e| FmError::new(call, FmErrorKind::State(e)))?;
        }
        *s = next;
        Ok(())
    }
}

/// Partition calls are refused in bare-metal mode (FM offers no partitions there).
fn partitioned(call: &'static str, s: &FakeState) -> Result<(), FmError> {
    if s.mode == FabricMode::BareMetal {
        return Err(FmError::new(call, FmErrorKind::NotSupported));
    }
    Ok(())
}

impl FabricManager for FakeFabric {
    fn mode(&self) -> FabricMode {
        self.state().mode
    }

    fn version(&self) -> Option<String> {
        self.state().version
    }

    fn partitions(&self) -> Result<Vec<FmPartition>, FmError> {
        const CALL: &str = "fmGetSupportedFabricPartitions";
        self.read(CALL, |s| {
            partitioned(CALL, s)?;
            Ok(s.partitions.clone())
        })
    }

    fn activate(&self, id: u32) -> Result<(), FmError> {
        const CALL: &str = "fmActivateFabricPartition";
        self.change(CALL, |s| {
            partitioned(CALL, s)?;
            if s.mode != FabricMode::SharedNvswitch {
                return Err(FmError::new(CALL, FmErrorKind::NotSupported));
            }
            let i = s.find(CALL, id)?;
            s.check_activation(CALL, i)?;
            s.partitions[i].active = true;
            Ok(())
        })
    }

    fn activate_with_vfs(&self, id: u32, vfs: &[PciAddress]) -> Result<(), FmError> {
        const CALL: &str = "fmActivateFabricPartitionWithVFs";
        self.change(CALL, |s| {
            if s.mode != FabricMode::Vgpu {
                return Err(FmError::new(CALL, FmErrorKind::NotSupported));
            }
            let i = s.find(CALL, id)?;
            if vfs.len() != s.partitions[i].gpus.len() {
                return Err(FmError::new(CALL, FmErrorKind::BadParam));
            }
            s.check_activation(CALL, i)?;
            s.partitions[i].active = true;
            s.vfs.insert(id, vfs.to_vec());
            Ok(())
        })
    }

    fn deactivate(&self, id: u32) -> Result<(), FmError> {
        const CALL: &str = "fmDeactivateFabricPartition";
        self.change(CALL, |s| {
            partitioned(CALL, s)?;
            let i = s.find(CALL, id)?;
            if !s.partitions[i].active {
                return Err(FmError::new(CALL, FmErrorKind::Uninitialized));
            }
            s.partitions[i].active = false;
            s.vfs.remove(&id);
            Ok(())
        })
    }

    fn set_activated(&self, ids: &[u32]) -> Result<(), FmError> {
        const CALL: &str = "fmSetActivatedFabricPartitions";
        self.change(CALL, |s| {
            partitioned(CALL, s)?;
            for id in ids {
                s.find(CALL, *id)?;
            }
            for p in &mut s.partitions {
                p.active = ids.contains(&p.id);
            }
            Ok(())
        })
    }

    fn nvlink_failed_devices(&self) -> Result<NvlinkFailures, FmError> {
        self.read("fmGetNvlinkFailedDevices", |s| Ok(s.failures.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus() -> Vec<PciAddress> {
        ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
            .iter()
            .map(|b| format!("0000:{b}:00.0").parse().unwrap())
            .collect()
    }

    fn hgx(mode: FabricMode) -> FakeFabric {
        FakeFabric::new(FakeState::hgx8(&gpus(), mode).unwrap())
    }

    fn members(p: &FmPartition) -> Vec<u32> {
        p.gpus.iter().map(|g| g.physical_id).collect()
    }

    #[test]
    fn the_hgx_set_is_one_of_eight_two_of_four_four_of_two_eight_of_one() {
        let parts = hgx(FabricMode::SharedNvswitch).partitions().unwrap();
        assert_eq!(parts.len(), 15);
        assert_eq!(
            (parts[0].id, members(&parts[0])),
            (1, (1..=8).collect::<Vec<_>>())
        );
        assert_eq!((parts[1].id, members(&parts[1])), (2, vec![1, 2, 5, 6]));
        assert_eq!((parts[3].id, members(&parts[3])), (4, vec![1, 3]));
        assert_eq!((parts[14].id, members(&parts[14])), (15, vec![8]));
        assert_eq!(parts[3].gpus[1].pci_bus_id, Some(gpus()[2]));
        assert!(parts.iter().all(|p| !p.active));
        assert!(FakeState::hgx8(&gpus()[..7], FabricMode::SharedNvswitch).is_err());
    }

    #[test]
    fn activation_answers_as_fabric_manager_does() {
        let fm = hgx(FabricMode::SharedNvswitch);
        fm.activate(4).unwrap();
        let kind = |r: Result<(), FmError>| r.unwrap_err().kind;
        assert_eq!(kind(fm.activate(4)), FmErrorKind::InUse);
        // Partition 2 (modules 1, 2, 5, 6) shares module 1 with the active partition 4.
        assert_eq!(kind(fm.activate(2)), FmErrorKind::InUse);
        assert_eq!(kind(fm.activate(99)), FmErrorKind::BadParam);
        fm.activate(5).unwrap();
        fm.deactivate(4).unwrap();
        assert_eq!(kind(fm.deactivate(4)), FmErrorKind::Uninitialized);
        assert_eq!(
            kind(fm.activate_with_vfs(6, &gpus()[4..6])),
            FmErrorKind::NotSupported
        );
        let parts = fm.partitions().unwrap();
        let active: Vec<u32> = parts.iter().filter(|p| p.active).map(|p| p.id).collect();
        assert_eq!(active, [5]);
    }

    #[test]
    fn bare_metal_offers_no_partitions_and_vgpu_mode_activates_with_vfs_only() {
        let bare = hgx(FabricMode::BareMetal);
        assert_eq!(
            bare.partitions().unwrap_err().kind,
            FmErrorKind::NotSupported
        );
        let vgpu = hgx(FabricMode::Vgpu);
        assert_eq!(
            vgpu.activate(3).unwrap_err().kind,
            FmErrorKind::NotSupported
        );
        let vfs: Vec<PciAddress> = ["0000:18:00.4", "0000:3a:00.4"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(
            vgpu.activate_with_vfs(4, &vfs[..1]).unwrap_err().kind,
            FmErrorKind::BadParam
        );
        vgpu.activate_with_vfs(4, &vfs).unwrap();
        assert_eq!(vgpu.state().vfs[&4], vfs);
        vgpu.deactivate(4).unwrap();
        assert!(vgpu.state().vfs.is_empty());
    }

    #[test]
    fn failed_nvlinks_degrade_their_partitions_and_refuse_activation() {
        let fm = hgx(FabricMode::SharedNvswitch);
        fm.fail_nvlinks(gpus()[2], false, &[3, 7]);
        let parts = fm.partitions().unwrap();
        // Partition 4 is modules 1 and 3.
        assert_eq!(parts[3].gpus[1].nvlinks, HGX_NVLINKS - 2);
        assert!(parts[3].gpus[1].is_degraded());
        assert_eq!(fm.activate(4).unwrap_err().kind, FmErrorKind::NvlinkError);
        fm.activate(5).unwrap();
        assert_eq!(fm.nvlink_failed_devices().unwrap().gpus[0].ports, [3, 7]);
    }

    #[test]
    fn after_a_restart_the_active_list_is_given_back() {
        let fm = hgx(FabricMode::SharedNvswitch);
        fm.activate(6).unwrap();
        fm.restart();
        assert!(fm.partitions().unwrap().iter().all(|p| !p.active));
        assert_eq!(
            fm.set_activated(&[6, 77]).unwrap_err().kind,
            FmErrorKind::BadParam
        );
        fm.set_activated(&[6]).unwrap();
        assert!(fm.partitions().unwrap()[5].active);
    }

    #[test]
    fn a_store_that_fails_leaves_the_state_unchanged() {
        let state = FakeState::hgx8(&gpus(), FabricMode::SharedNvswitch).unwrap();
        let fm = FakeFabric::with_store(state, Box::new(|_| Err("disk full".to_owned())));
        let e = fm.activate(4).unwrap_err();
        assert_eq!(e.kind, FmErrorKind::State("disk full".to_owned()));
        assert!(!fm.partitions().unwrap()[3].active);
    }
}
