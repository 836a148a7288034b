//! NVSwitch fabric partitions of a node.
//!
//! On HGX/DGX baseboards (8 GPUs joined by NVSwitches) the GPUs given to one VM only reach each
//! other over NVLink when NVIDIA Fabric Manager (FM) has *activated* a partition whose members are
//! exactly those GPUs. FM offers a fixed set of partitions per baseboard (on the HGX 8-GPU boards
//! one of 8, two of 4, four of 2 and eight of 1: `docs/fabric.md`), each named by an ID and listing
//! its GPUs by module (physical) ID and PCI bus ID. A node's [`Fabric`] is what discovery learnt of
//! that: its NVSwitches, whether FM could be reached and in which mode it runs, and its
//! partitions. A node without NVSwitches has no `Fabric` at all ([`crate::NodeTopology::fabric`]
//! is `None`), so documents written before partitions existed still read.
//!
//! The questions placement and claims ask of it live here, once: the partition of a given size
//! containing a GPU ([`Fabric::partition_of_size`]), the partition whose members are exactly a
//! set ([`Fabric::exact`]) and, for a set that is none, the partitions that would do
//! ([`Fabric::would_do`]).

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::address::PciAddress;
use crate::error::CoreError;

/// The mode Fabric Manager runs in (`FABRIC_MODE` in its configuration file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FabricMode {
    /// `FABRIC_MODE=0`: bare metal; FM on the host joins every GPU, no partitions are activated.
    BareMetal,
    /// `FABRIC_MODE=1`: shared NVSwitch; whole GPUs go to VMs, each set activated as a partition.
    SharedNvswitch,
    /// `FABRIC_MODE=2`: vGPU multitenancy; partitions are activated with the VFs of their GPUs.
    Vgpu,
}

impl FabricMode {
    /// The mode of FM's `FABRIC_MODE` value, `None` for a value this version does not know.
    pub fn from_fabric_mode(value: u32) -> Option<Self> {
        match value {
            0 => Some(FabricMode::BareMetal),
            1 => Some(FabricMode::SharedNvswitch),
            2 => Some(FabricMode::Vgpu),
            _ => None,
        }
    }

    /// Whether GPUs handed to VMs need an active partition to talk over NVLink (shared NVSwitch
    /// and vGPU modes; in bare-metal mode the host's FM joins them all).
    pub fn partitions_activated(self) -> bool {
        !matches!(self, FabricMode::BareMetal)
    }
}

impl fmt::Display for FabricMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FabricMode::BareMetal => "bare metal",
            FabricMode::SharedNvswitch => "shared NVSwitch",
            FabricMode::Vgpu => "vGPU",
        })
    }
}

/// Whether Fabric Manager could be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub enum FabricManagerState {
    /// FM answered: its mode and partitions are known.
    Reachable,
    /// FM could not be reached (not running, library missing, refused): partitions unknown.
    #[default]
    Unreachable,
}

/// What is known of a node's Fabric Manager. JSON:
/// `{"state": "reachable", "mode": "sharedNvswitch", "version": "550.90.07"}` or
/// `{"state": "unreachable", "reason": "libnvfm.so.1 not found"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct FabricManager {
    /// Reachable or not.
    pub state: FabricManagerState,
    /// Its mode, when reachable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<FabricMode>,
    /// Why it could not be reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its version (a guest's NVIDIA driver must be of the same version), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl FabricManager {
    /// A reachable FM in `mode`.
    pub fn reachable(mode: FabricMode) -> Self {
        FabricManager {
            state: FabricManagerState::Reachable,
            mode: Some(mode),
            reason: None,
            version: None,
        }
    }

    /// An FM that could not be reached, and why.
    pub fn unreachable(reason: impl Into<String>) -> Self {
        FabricManager {
            state: FabricManagerState::Unreachable,
            mode: None,
            reason: Some(reason.into()),
            version: None,
        }
    }

    /// Whether FM answered.
    pub fn is_reachable(&self) -> bool {
        self.state == FabricManagerState::Reachable
    }
}

/// One fabric partition as Fabric Manager offers it. JSON (the keys of `fabric list -o json`):
/// `{"id": 1, "gpus": ["nvidia0", ...], "addresses": ["0000:18:00.0", ...], "moduleIds": [1, ...],
/// "nvlinks": 18, "active": false}`; `gpus`, `addresses` and `moduleIds` (when given) list the
/// same members in the same order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Partition {
    /// FM's partition ID.
    pub id: u32,
    /// Member GPUs by gpuslice name (`nvidia0`); empty names where the GPU is not on the node.
    #[serde(default)]
    pub gpus: Vec<String>,
    /// Member GPUs by PCI address.
    pub addresses: Vec<PciAddress>,
    /// Member GPUs by module (physical) ID, as FM names them; empty when unknown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub module_ids: Vec<u32>,
    /// NVLinks per GPU FM reports for the partition, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlinks: Option<u32>,
    /// Activated now.
    #[serde(default)]
    pub active: bool,
    /// Why the partition is degraded (failed NVLinks, an NVSwitch down), `None` when healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded: Option<String>,
}

impl Partition {
    /// Its number of GPUs.
    pub fn size(&self) -> usize {
        self.addresses.len()
    }

    /// Whether `gpu` is a member.
    pub fn contains(&self, gpu: &PciAddress) -> bool {
        self.addresses.contains(gpu)
    }

    /// Whether its members are exactly `gpus` (in any order, each once).
    pub fn has_exactly(&self, gpus: &[PciAddress]) -> bool {
        gpus.len() == self.addresses.len() && gpus.iter().all(|g| self.contains(g)) && {
            let set: BTreeSet<&PciAddress> = gpus.iter().collect();
            set.len() == gpus.len()
        }
    }

    /// Healthy (not degraded).
    pub fn is_healthy(&self) -> bool {
        self.degraded.is_none()
    }

    /// `partition 3 (nvidia0, nvidia1)`: how messages name it.
    pub fn describe(&self) -> String {
        let members: Vec<String> = self
            .addresses
            .iter()
            .enumerate()
            .map(|(i, a)| match self.gpus.get(i).filter(|n| !n.is_empty()) {
                Some(name) => name.clone(),
                None => a.to_string(),
            })
            .collect();
        format!("partition {} ({})", self.id, members.join(", "))
    }
}

/// A node's NVSwitch fabric. JSON: `{"nvswitches": [...], "fabricManager": {...},
/// "partitions": [...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", try_from = "FabricDoc")]
pub struct Fabric {
    /// The NVSwitch PCI functions (NVIDIA, class 0x0680).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvswitches: Vec<PciAddress>,
    /// What is known of Fabric Manager.
    pub fabric_manager: FabricManager,
    /// FM's supported partitions, by ID; empty when FM could not be reached.
    #[serde(default)]
    pub partitions: Vec<Partition>,
}

/// The document form of [`Fabric`], checked into one by [`Fabric::validate`].
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FabricDoc {
    #[serde(default)]
    nvswitches: Vec<PciAddress>,
    #[serde(default)]
    fabric_manager: FabricManager,
    #[serde(default)]
    partitions: Vec<Partition>,
}

impl TryFrom<FabricDoc> for Fabric {
    type Error = CoreError;
    fn try_from(d: FabricDoc) -> Result<Self, Self::Error> {
        let f = Fabric {
            nvswitches: d.nvswitches,
            fabric_manager: d.fabric_manager,
            partitions: d.partitions,
        };
        f.validate()?;
        Ok(f)
    }
}

impl Fabric {
    /// Checks the partitions: IDs unique, each with at least one member, no member twice, and
    /// `gpus` / `moduleIds` (when given) as long as `addresses`.
    ///
    /// # Errors
    /// [`CoreError::InvalidFabric`] naming the partition and what is wrong.
    pub fn validate(&self) -> Result<(), CoreError> {
        let mut ids = BTreeSet::new();
        for p in &self.partitions {
            let bad = |why: &str| CoreError::InvalidFabric {
                partition: p.id,
                why: why.to_owned(),
            };
            if !ids.insert(p.id) {
                return Err(bad("partition ID appears twice"));
            }
            if p.addresses.is_empty() {
                return Err(bad("no member GPU"));
            }
            let set: BTreeSet<&PciAddress> = p.addresses.iter().collect();
            if set.len() != p.addresses.len() {
                return Err(bad("a member GPU is listed twice"));
            }
            if !p.gpus.is_empty() && p.gpus.len() != p.addresses.len() {
                return Err(bad("gpus and addresses list different numbers of members"));
            }
            if !p.module_ids.is_empty() && p.module_ids.len() != p.addresses.len() {
                return Err(bad(
                    "moduleIds and addresses list different numbers of members",
                ));
            }
        }
        Ok(())
    }

    /// Whether VMs' GPU sets must be activated partitions here: FM reachable in a mode that
    /// activates partitions, or FM unreachable (then nothing multi-GPU can be promised to talk).
    pub fn requires_partitions(&self) -> bool {
        match self.fabric_manager.mode {
            Some(mode) if self.fabric_manager.is_reachable() => mode.partitions_activated(),
            _ => !self.fabric_manager.is_reachable(),
        }
    }

    /// The partition with ID `id`.
    pub fn partition(&self, id: u32) -> Option<&Partition> {
        self.partitions.iter().find(|p| p.id == id)
    }

    /// The partitions of `size` GPUs, in FM's order.
    pub fn of_size(&self, size: usize) -> impl Iterator<Item = &Partition> {
        self.partitions.iter().filter(move |p| p.size() == size)
    }

    /// The partition of `size` GPUs containing `gpu` (on NVIDIA's baseboards there is at most
    /// one: those of one size do not overlap), the lowest ID where a custom set overlaps.
    pub fn partition_of_size(&self, gpu: &PciAddress, size: usize) -> Option<&Partition> {
        self.of_size(size)
            .filter(|p| p.contains(gpu))
            .min_by_key(|p| p.id)
    }

    /// The partition whose members are exactly `gpus` (in any order).
    pub fn exact(&self, gpus: &[PciAddress]) -> Option<&Partition> {
        self.partitions.iter().find(|p| p.has_exactly(gpus))
    }

    /// The sizes of the partitions on offer, smallest first, each once.
    pub fn sizes(&self) -> Vec<usize> {
        let set: BTreeSet<usize> = self.partitions.iter().map(Partition::size).collect();
        set.into_iter().collect()
    }

    /// For a set of GPUs that is no partition: the healthy partitions of its size, those
    /// sharing the most GPUs with it first (then by ID). Empty when no partition has that size.
    pub fn would_do(&self, gpus: &[PciAddress]) -> Vec<&Partition> {
        let size = gpus.iter().collect::<BTreeSet<_>>().len();
        let mut out: Vec<&Partition> = self.of_size(size).filter(|p| p.is_healthy()).collect();
        let shared = |p: &Partition| gpus.iter().filter(|g| p.contains(g)).count();
        out.sort_by(|a, b| shared(b).cmp(&shared(a)).then(a.id.cmp(&b.id)));
        out
    }

    /// The one rule for a set of whole GPUs handed to one VM (a `gpu bind` of several GPUs, a
    /// DRA claim, vGPUs with NVLink): `Ok(None)` where the fabric does not constrain the set
    /// (Fabric Manager in bare-metal mode, an empty set, or one GPU while Fabric Manager cannot
    /// be reached), else the healthy partition whose members are exactly `gpus`.
    ///
    /// # Errors
    /// A [`SetRefusal`]: Fabric Manager cannot be reached for several GPUs, the exact partition
    /// is degraded, or the set is no partition (each with the partitions that would do).
    pub fn partition_for_set(
        &self,
        gpus: &[PciAddress],
    ) -> Result<Option<&Partition>, SetRefusal<'_>> {
        if gpus.is_empty() || !self.requires_partitions() {
            return Ok(None);
        }
        if !self.fabric_manager.is_reachable() {
            if gpus.len() == 1 {
                return Ok(None);
            }
            return Err(SetRefusal::Unreachable {
                reason: self
                    .fabric_manager
                    .reason
                    .clone()
                    .unwrap_or_else(|| "no reason given".to_owned()),
            });
        }
        match self.exact(gpus) {
            Some(p) if p.is_healthy() => Ok(Some(p)),
            Some(p) => Err(SetRefusal::Degraded {
                partition: p,
                would_do: self.would_do(gpus),
            }),
            None => Err(SetRefusal::NotAPartition {
                would_do: self.would_do(gpus),
            }),
        }
    }

    /// `partition 3 (nvidia0, nvidia1), partition 4 (...)`, or `none` for an empty list.
    pub fn describe_all<'a>(parts: impl IntoIterator<Item = &'a Partition>) -> String {
        let all: Vec<String> = parts.into_iter().map(Partition::describe).collect();
        if all.is_empty() {
            "none".to_owned()
        } else {
            all.join(", ")
        }
    }
}

/// Why a set of whole GPUs cannot go to one VM on a fabric ([`Fabric::partition_for_set`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetRefusal<'f> {
    /// Several GPUs while Fabric Manager cannot be reached: nothing can promise they talk.
    Unreachable {
        /// Why Fabric Manager cannot be reached.
        reason: String,
    },
    /// The set is exactly this partition, but it is degraded.
    Degraded {
        /// The partition.
        partition: &'f Partition,
        /// The healthy partitions of that size, closest first.
        would_do: Vec<&'f Partition>,
    },
    /// The set is no partition.
    NotAPartition {
        /// The healthy partitions of that size, closest first.
        would_do: Vec<&'f Partition>,
    },
}

impl SetRefusal<'_> {
    /// The partitions that would do, as messages name them (`none` when there are none).
    pub fn would_do(&self) -> String {
        match self {
            SetRefusal::Unreachable { .. } => "none".to_owned(),
            SetRefusal::Degraded { would_do, .. } | SetRefusal::NotAPartition { would_do } => {
                Fabric::describe_all(would_do.iter().copied())
            }
        }
    }
}

/// NVIDIA's default partition set of an HGX 8-GPU baseboard as far as it is known
/// (`docs/fabric.md`, "NVIDIA's HGX 8-GPU default partitions"), over `gpus` given as
/// `(name, address)` in module-ID order (module 1 first): ID 1 all eight; IDs 2 and 3 modules
/// 1, 2, 5, 6 and 3, 4, 7, 8; IDs 4 to 7 modules 1, 3 / 2, 4 / 5, 7 / 6, 8; IDs 8 to 15 one module
/// each. For fakes, tests and benches only: a real node's partitions are Fabric Manager's.
/// `None` unless exactly eight GPUs are given.
pub fn hgx8_default_partitions(gpus: &[(String, PciAddress)]) -> Option<Vec<Partition>> {
    if gpus.len() != 8 {
        return None;
    }
    let part = |id: u32, modules: &[u32]| Partition {
        id,
        gpus: modules
            .iter()
            .map(|&m| gpus[m as usize - 1].0.clone())
            .collect(),
        addresses: modules.iter().map(|&m| gpus[m as usize - 1].1).collect(),
        module_ids: modules.to_vec(),
        nvlinks: None,
        active: false,
        degraded: None,
    };
    let mut out = vec![
        part(1, &[1, 2, 3, 4, 5, 6, 7, 8]),
        part(2, &[1, 2, 5, 6]),
        part(3, &[3, 4, 7, 8]),
        part(4, &[1, 3]),
        part(5, &[2, 4]),
        part(6, &[5, 7]),
        part(7, &[6, 8]),
    ];
    out.extend((1..=8).map(|m| part(7 + m, &[m])));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(i: usize) -> PciAddress {
        format!("0000:{:02x}:00.0", 0x18 + i * 0x10)
            .parse()
            .unwrap()
    }

    /// NVIDIA's HGX 8-GPU default set: one of 8, two of 4, four of 2, eight of 1.
    fn hgx() -> Fabric {
        let gpus: Vec<(String, PciAddress)> =
            (0..8).map(|i| (format!("nvidia{i}"), addr(i))).collect();
        Fabric {
            nvswitches: vec![],
            fabric_manager: FabricManager::reachable(FabricMode::SharedNvswitch),
            partitions: hgx8_default_partitions(&gpus).unwrap(),
        }
    }

    #[test]
    fn partition_of_size_finds_the_one_of_each_size_containing_a_gpu() {
        let f = hgx();
        let g = addr(5);
        // Module 6.
        assert_eq!(f.partition_of_size(&g, 1).map(|p| p.id), Some(13));
        assert_eq!(f.partition_of_size(&g, 2).map(|p| p.id), Some(7));
        assert_eq!(f.partition_of_size(&g, 4).map(|p| p.id), Some(2));
        assert_eq!(f.partition_of_size(&g, 8).map(|p| p.id), Some(1));
        assert_eq!(f.partition_of_size(&g, 3), None);
        assert_eq!(f.sizes(), vec![1, 2, 4, 8]);
    }

    #[test]
    fn exact_matches_members_in_any_order_and_nothing_else() {
        let f = hgx();
        // Modules 3 and 1.
        assert_eq!(f.exact(&[addr(2), addr(0)]).map(|p| p.id), Some(4));
        assert_eq!(f.exact(&[addr(1), addr(2)]), None);
        assert_eq!(f.exact(&[addr(2), addr(2)]), None);
    }

    #[test]
    fn would_do_lists_healthy_partitions_of_the_size_closest_first() {
        let mut f = hgx();
        f.partitions[4].degraded = Some("2 NVLinks failed".into()); // ID 5: modules 2, 4
        // Modules 2 and 3: ID 4 (modules 1, 3) shares one, 5 is degraded, 6 and 7 share none.
        let ids: Vec<u32> = f
            .would_do(&[addr(1), addr(2)])
            .iter()
            .map(|p| p.id)
            .collect();
        assert_eq!(ids, vec![4, 6, 7]);
        assert!(f.would_do(&[addr(0), addr(1), addr(2)]).is_empty());
    }

    #[test]
    fn wire_form_round_trips_and_old_topologies_still_read() {
        let f = hgx();
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(json["fabricManager"]["state"], "reachable");
        assert_eq!(json["fabricManager"]["mode"], "sharedNvswitch");
        assert_eq!(json["partitions"][1]["id"], 2);
        assert_eq!(json["partitions"][1]["gpus"][0], "nvidia0");
        assert_eq!(json["partitions"][1]["addresses"][3], "0000:68:00.0");
        assert_eq!(json["partitions"][1]["moduleIds"][2], 5);
        assert_eq!(json["partitions"][1]["active"], false);
        let back: Fabric = serde_json::from_value(json).unwrap();
        assert_eq!(back, f);
        let old: crate::NodeTopology = serde_json::from_str(r#"{"node": "n"}"#).unwrap();
        assert_eq!(old.fabric, None);
    }

    #[test]
    fn a_fleet_carries_fabrics_in_its_compact_shapes_and_reads_them_back() {
        let node = |name: &str| {
            let mut t = crate::NodeTopology::new(name);
            t.fabric = Some(hgx());
            t
        };
        let fleet = crate::Fleet {
            nodes: vec![node("a"), node("b")],
            ..crate::Fleet::default()
        };
        let text = fleet.to_text(true).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["shapes"]["shape-1"]["fabric"]["partitions"][0]["id"], 1);
        assert_eq!(doc["nodes"][1]["shape"], "shape-1");
        assert_eq!(crate::Fleet::from_text(&text).unwrap(), fleet);
        let shared = crate::SharedFleet::from_text_max(&text, 1 << 20).unwrap();
        assert_eq!(shared.into_fleet(), fleet);
        // A node of a shape cannot bring a fabric of its own.
        let own = text.replacen(
            r#""shape": "shape-1""#,
            r#""shape": "shape-1", "fabric": {"fabricManager": {"state": "unreachable"}}"#,
            1,
        );
        let e = crate::Fleet::from_text(&own).unwrap_err().to_string();
        assert!(e.contains("fabric of its own"), "{e}");
    }

    #[test]
    fn decoding_refuses_a_partition_listed_twice_or_with_mismatched_members() {
        let twice = r#"{"fabricManager": {"state": "reachable", "mode": "sharedNvswitch"},
            "partitions": [{"id": 1, "addresses": ["0000:18:00.0"]},
                           {"id": 1, "addresses": ["0000:28:00.0"]}]}"#;
        let e = serde_json::from_str::<Fabric>(twice)
            .unwrap_err()
            .to_string();
        assert!(e.contains("partition 1: partition ID appears twice"), "{e}");
        let short = r#"{"fabricManager": {"state": "unreachable"},
            "partitions": [{"id": 2, "gpus": ["nvidia0"],
                            "addresses": ["0000:18:00.0", "0000:28:00.0"]}]}"#;
        let e = serde_json::from_str::<Fabric>(short)
            .unwrap_err()
            .to_string();
        assert!(e.contains("different numbers of members"), "{e}");
    }

    #[test]
    fn partition_for_set_is_the_one_rule_for_sets_of_whole_gpus() {
        let mut f = hgx();
        assert_eq!(
            f.partition_for_set(&[addr(2), addr(0)])
                .unwrap()
                .map(|p| p.id),
            Some(4)
        );
        assert_eq!(f.partition_for_set(&[]).unwrap(), None);
        let e = f.partition_for_set(&[addr(0), addr(1)]).unwrap_err();
        assert!(matches!(e, SetRefusal::NotAPartition { .. }));
        assert!(
            e.would_do().starts_with("partition 4 (nvidia0, nvidia2)"),
            "{}",
            e.would_do()
        );
        f.partitions[3].degraded = Some("nvidia2: 2 of 18 NVLinks down".into());
        let e = f.partition_for_set(&[addr(0), addr(2)]).unwrap_err();
        assert!(matches!(e, SetRefusal::Degraded { partition, .. } if partition.id == 4));
        f.fabric_manager = FabricManager::unreachable("libnvfm.so.1 not found");
        assert_eq!(f.partition_for_set(&[addr(0)]).unwrap(), None);
        let e = f.partition_for_set(&[addr(0), addr(2)]).unwrap_err();
        assert_eq!(
            e,
            SetRefusal::Unreachable {
                reason: "libnvfm.so.1 not found".into()
            }
        );
        f.fabric_manager = FabricManager::reachable(FabricMode::BareMetal);
        assert_eq!(f.partition_for_set(&[addr(0), addr(1)]).unwrap(), None);
    }

    #[test]
    fn an_unreachable_fabric_manager_requires_partitions_bare_metal_does_not() {
        let mut f = hgx();
        assert!(f.requires_partitions());
        f.fabric_manager = FabricManager::reachable(FabricMode::BareMetal);
        assert!(!f.requires_partitions());
        f.fabric_manager = FabricManager::unreachable("libnvfm.so.1 not found");
        assert!(f.requires_partitions());
    }
}
