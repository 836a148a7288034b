//! The topology a node keeps, compact: its GPUs, parents and pools are interned fleet-wide, so
//! nodes of the same hardware share one copy of each (a VF of the same address, driver and
//! state reads the same on every host of a model), and the node holds pointers.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use gpu_core::{Fabric, Gpu, MediatedDevices, NodeTopology, Parent, ParentId, PciAddress, Pool};

/// A node's topology as given, its parents' type lists aside (they live in the shared profile
/// tables; [`super::NodeState::topology`] puts them back).
#[derive(Debug, Clone)]
pub(crate) struct Topo {
    pub node: Box<str>,
    pub gpus: Box<[Arc<Gpu>]>,
    /// Parents with empty `profiles`.
    pub parents: Box<[Arc<Parent>]>,
    pub pools: Box<[Arc<Pool>]>,
    pub warnings: Box<[String]>,
    /// The NVSwitch fabric with its partitions' members as GPU indices, shared by nodes whose
    /// fabrics and GPU addresses are equal.
    pub fabric: Option<Arc<super::fabric::FabricIx>>,
}

impl Topo {
    /// The GPU at this address.
    pub(crate) fn gpu_by_address(&self, address: &PciAddress) -> Option<&Gpu> {
        self.gpus
            .iter()
            .find(|g| g.address == *address)
            .map(|g| &**g)
    }

    /// The parent with this ID (its types aside).
    pub(crate) fn parent(&self, id: &ParentId) -> Option<&Parent> {
        self.parents.iter().find(|p| p.id == *id).map(|p| &**p)
    }

    /// The full topology, with the parents' type lists from `profiles(parent index)`.
    pub(crate) fn to_topology(
        &self,
        mut profiles: impl FnMut(usize) -> Vec<gpu_core::Profile>,
    ) -> NodeTopology {
        NodeTopology {
            node: self.node.to_string(),
            gpus: self.gpus.iter().map(|g| Gpu::clone(g)).collect(),
            mediated_devices: MediatedDevices {
                parents: self
                    .parents
                    .iter()
                    .enumerate()
                    .map(|(i, p)| Parent {
                        profiles: profiles(i),
                        ..Parent::clone(p)
                    })
                    .collect(),
                pools: self.pools.iter().map(|p| Pool::clone(p)).collect(),
            },
            warnings: self.warnings.to_vec(),
            fabric: self.fabric.as_ref().map(|f| f.fabric.clone()),
        }
    }
}

/// One interning table: values bucketed by a hash of a few fields, equal ones shared.
#[derive(Debug, Clone)]
pub(crate) struct Interner<T> {
    buckets: HashMap<u64, Vec<Arc<T>>>,
    len: usize,
}

impl<T> Default for Interner<T> {
    fn default() -> Self {
        Interner {
            buckets: HashMap::new(),
            len: 0,
        }
    }
}

impl<T: PartialEq> Interner<T> {
    /// The shared copy of `value`, `key` hashing what tells values apart cheaply.
    pub(crate) fn intern(&mut self, key: impl Hash, value: T) -> Arc<T> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        let bucket = self.buckets.entry(h.finish()).or_default();
        if let Some(v) = bucket.iter().find(|v| ***v == value) {
            return Arc::clone(v);
        }
        let v = Arc::new(value);
        bucket.push(Arc::clone(&v));
        self.len += 1;
        v
    }

    /// Drops the values no node holds any more.
    pub(crate) fn prune(&mut self) {
        self.buckets.retain(|_, b| {
            b.retain(|v| Arc::strong_count(v) > 1);
            !b.is_empty()
        });
        self.len = self.buckets.values().map(Vec::len).sum();
    }

    /// Values held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// The fleet-wide tables of GPUs, parents and pools.
#[derive(Debug, Clone, Default)]
pub(crate) struct TopoTables {
    gpus: Interner<Gpu>,
    parents: Interner<Parent>,
    pools: Interner<Pool>,
    models: HashMap<Box<str>, Arc<str>>,
    /// The fabrics met most recently (nodes of one baseboard share one).
    fabrics: Vec<Arc<super::fabric::FabricIx>>,
    /// Nodes removed since the last prune.
    removed: usize,
}

impl TopoTables {
    /// Splits a topology (whose parents' type lists were taken out) into shared parts.
    pub(crate) fn intern(&mut self, t: NodeTopology) -> Topo {
        let gpus: Box<[Arc<Gpu>]> = t
            .gpus
            .into_iter()
            .map(|g| {
                let key = (g.address, g.device_id, g.name.len(), g.sriov.is_some());
                self.gpus.intern(key, g)
            })
            .collect();
        let parents = t
            .mediated_devices
            .parents
            .into_iter()
            .map(|p| {
                let key = (p.id.clone(), p.gpu, p.instances.len());
                self.parents.intern(key, p)
            })
            .collect();
        let pools = t
            .mediated_devices
            .pools
            .into_iter()
            .map(|p| {
                let key = (p.gpu.clone(), p.total_mib, p.used_mib, p.parents.len());
                self.pools.intern(key, p)
            })
            .collect();
        let fabric = t.fabric.map(|f| self.fabric(f, &gpus));
        Topo {
            node: t.node.into_boxed_str(),
            gpus,
            parents,
            pools,
            warnings: t.warnings.into_boxed_slice(),
            fabric,
        }
    }

    /// The shared index of a fabric equal to `f` over GPUs at the same addresses among the last
    /// few met, or a new one.
    fn fabric(&mut self, f: Fabric, gpus: &[Arc<Gpu>]) -> Arc<super::fabric::FabricIx> {
        if let Some(known) = self.fabrics.iter().rev().find(|k| k.same(&f, gpus)) {
            return Arc::clone(known);
        }
        if self.fabrics.len() == 8 {
            self.fabrics.remove(0);
        }
        let ix = Arc::new(super::fabric::FabricIx::new(f, gpus));
        self.fabrics.push(Arc::clone(&ix));
        ix
    }

    /// The shared lower-case spelling of a model name.
    pub(crate) fn model_lc(&mut self, model: &str) -> Arc<str> {
        let lc = model.to_ascii_lowercase();
        if let Some(m) = self.models.get(lc.as_str()) {
            return Arc::clone(m);
        }
        let m: Arc<str> = Arc::from(lc.as_str());
        self.models.insert(lc.into_boxed_str(), Arc::clone(&m));
        m
    }

    /// Notes that a node left; once many have, drops what no node holds.
    pub(crate) fn node_removed(&mut self) {
        self.removed += 1;
        let held = self.gpus.len() + self.parents.len() + self.pools.len();
        if self.removed > 64 + held / 4 {
            self.gpus.prune();
            self.parents.prune();
            self.pools.prune();
            self.removed = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::FleetState;
    use crate::testing::a2_node;

    fn fleet_of(names: &[&str]) -> FleetState {
        let mut s = FleetState::default();
        for n in names {
            assert_eq!(s.add_node(a2_node(n, 2, 4)), Ok(()));
        }
        s
    }

    #[test]
    fn nodes_of_the_same_hardware_share_their_gpus_parents_and_pools() {
        let s = fleet_of(&["a", "b"]);
        let (a, b) = (s.slots[0].as_ref().unwrap(), s.slots[1].as_ref().unwrap());
        assert!(Arc::ptr_eq(&a.topo.gpus[1], &b.topo.gpus[1]));
        assert!(Arc::ptr_eq(&a.topo.parents[5], &b.topo.parents[5]));
        assert!(Arc::ptr_eq(&a.topo.pools[0], &b.topo.pools[0]));
        assert!(Arc::ptr_eq(&a.parents[3].types, &b.parents[3].types));
    }

    #[test]
    fn each_node_still_gives_back_its_own_topology() {
        let s = fleet_of(&["a", "b"]);
        assert_eq!(s.node("a"), Some(a2_node("a", 2, 4)));
        assert_eq!(s.node("b"), Some(a2_node("b", 2, 4)));
    }

    #[test]
    fn what_no_node_holds_any_more_leaves_the_shared_tables() {
        let names: Vec<String> = (0..200).map(|i| format!("n{i}")).collect();
        let mut s = FleetState::default();
        for (i, n) in names.iter().enumerate() {
            // Every node its own hardware: its GPUs sit on other buses.
            let mut t = a2_node(n, 1, 2);
            for g in &mut t.gpus {
                g.iommu_group = Some(1000 + i as u32);
            }
            assert_eq!(s.add_node(t), Ok(()));
        }
        let held = s.tables.topo.gpus.len();
        assert_eq!(held, 200);
        for n in &names {
            assert!(s.remove_node(n).is_ok());
        }
        assert!(s.tables.topo.gpus.len() < held / 2);
    }
}
