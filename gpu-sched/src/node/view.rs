//! A node as the fleet's allocations leave it: what `topology --inventory` and the other fleet
//! views show, counted the way placement counts.

use gpu_core::NodeTopology;

use super::NodeState;

impl NodeState {
    /// The topology with every allocation charged: a parent that allocations not yet in the
    /// snapshot (pending, or created since the snapshot) draw on lists, in `availableInstances`,
    /// what it can still take once they are made, and their pool's use, size lock and MIG
    /// slices count them. Parents and pools nothing is charged on read as given.
    pub(crate) fn charged_topology(&self) -> NodeTopology {
        let mut t = self.topology();
        for (ps, p) in self
            .parents
            .iter()
            .zip(t.mediated_devices.parents.iter_mut())
        {
            if ps.used == 0 {
                continue;
            }
            for offer in ps.offers.iter() {
                if let Some(prof) = p.profiles.get_mut(offer.profile) {
                    prof.available_instances = ps.free_for(offer, 0);
                }
            }
        }
        for g in self.groups.iter().filter(|g| g.charged > 0) {
            let Some(charged) = &g.pool else { continue };
            if let Some(p) = t
                .mediated_devices
                .pools
                .iter_mut()
                .find(|p| p.gpu == charged.gpu)
            {
                *p = charged.clone();
            }
        }
        t
    }
}
