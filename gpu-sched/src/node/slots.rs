//! The words of a refusal for no free GPU-instance start: which GPU, which profile, its legal
//! starts and the memory slots still free, so an operator sees the fragmentation.

use gpu_core::Pool;

use super::NodeState;
use crate::resolve::ClassId;

impl NodeState {
    /// For each group in `groups` (left out of a request for `classes` for no free start),
    /// `nvidia0: 4g.71gb starts at [0], slots free [4, 5, 6, 7]`; `pools` are the pools the fit
    /// has charged so far (the others are the groups' own).
    pub(super) fn no_start_words(
        &self,
        groups: &[usize],
        classes: &[ClassId],
        pools: &[(usize, Pool)],
    ) -> Vec<String> {
        let pool_of = |gi: usize| {
            pools
                .iter()
                .find(|(i, _)| *i == gi)
                .map(|(_, p)| p)
                .or(self.groups[gi].pool.as_ref())
        };
        groups
            .iter()
            .filter_map(|&gi| {
                let g = &self.groups[gi];
                let local = classes.iter().find_map(|c| g.local(*c))?;
                let p = self.sample_profile(gi, local);
                let slots = pool_of(gi)?.mig_slots.as_ref()?;
                let mib = p
                    .framebuffer_mib
                    .or(p.mig_memory_gib.map(|gib| u64::from(gib) * 1024))
                    .unwrap_or(0);
                let mp = slots.profile_for(p.mig_slices?, mib).ok()?;
                let gpu = g.gpu.map_or("?", |x| self.topo.gpus[x].name.as_str());
                Some(format!(
                    "{gpu}: {} starts at {:?}, slots free {:?}",
                    mp.name,
                    mp.starts,
                    slots.free_slots()
                ))
            })
            .collect()
    }
}

/// A word telling a pool's GPU-instance slots apart (two nodes whose instances sit at other
/// starts fit differently, whatever their slice counts): 0 where the pool tracks none.
pub(crate) fn slots_word(pool: &Pool) -> u64 {
    use std::hash::{Hash, Hasher};
    let Some(s) = &pool.mig_slots else {
        return 0;
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in &s.placed {
        (p.profile.as_str(), p.start).hash(&mut h);
    }
    (&s.unplaced, &s.creatable, &s.pending).hash(&mut h);
    h.finish() | 1
}
