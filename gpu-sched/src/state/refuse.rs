//! Why no node can take a Machine: one fit per group of nodes in the same state, and the
//! reference answer that asks every node.

use super::FleetState;
use crate::members::Members;
use crate::policy::Policy;
#[cfg(any(test, feature = "testing"))]
use crate::refusal::NodeRefusal;
use crate::refusal::{Refusal, RefusedGroup};
use crate::resolve::{Kind, Req, Resolved};
#[cfg(feature = "testing")]
use crate::{error::SchedError, resolve::resolve};
#[cfg(feature = "testing")]
use gpu_core::Machine;

impl FleetState {
    /// Says why no node can take the Machine: one fit per group of nodes in the same state
    /// (see `classes.rs`), the same answer as asking every node. The refusal keeps snapshots of
    /// the groups' member sets and of the names (reference counts, see `members.rs`): its cost
    /// grows with the number of different node states, not with the fleet.
    pub(super) fn refuse(&self, m: &Resolved, policy: Policy, exclude: Option<usize>) -> Refusal {
        let mut c = self.classes.lock();
        c.refresh(&self.slots);
        let ex = exclude.and_then(|e| u32::try_from(e).ok());
        let total = c.filed() - usize::from(ex.is_some_and(|e| c.is_filed(e)));
        let mut groups: Vec<RefusedGroup> = Vec::new();
        // The first member of a group that is not the excluded place.
        let rep = |members: &Members| {
            members
                .iter()
                .find(|&s| Some(s) != ex)
                .and_then(|s| self.slots.get(s as usize))
                .and_then(|s| s.as_deref())
        };
        let answer = |members: &Members, groups: &mut Vec<RefusedGroup>| {
            let Some(n) = rep(members) else {
                return;
            };
            if let Err(reasons) = n.fit(m, policy, self.slot_policy) {
                groups.push(RefusedGroup {
                    reasons,
                    same_as: None,
                    members: members.clone(),
                });
            }
        };
        // A shape offering none of the requested vGPU profiles refuses whatever its usage, and
        // every such shape with the same reasons (one `ProfileNotOffered` per request, which
        // name nothing of the node): the first one's fit answers for all of them.
        let mut answered: Vec<u32> = Vec::new();
        if m.reqs.iter().all(Req::is_vgpu) {
            let mut first: Option<usize> = None;
            for (&sid, members) in &c.shapes {
                let Some(n) = members
                    .first()
                    .and_then(|s| self.slots.get(s as usize))
                    .and_then(|s| s.as_deref())
                else {
                    continue;
                };
                let none = m.reqs.iter().all(|r| match &r.kind {
                    Kind::Vgpu { classes, .. } => !n.offers_any(classes),
                    Kind::Whole { .. } => false,
                });
                if !none {
                    continue;
                }
                answered.push(sid);
                match first {
                    Some(i) if rep(members).is_some() => groups.push(RefusedGroup {
                        reasons: Vec::new(),
                        same_as: Some(i),
                        members: members.clone(),
                    }),
                    Some(_) => {}
                    None => {
                        let before = groups.len();
                        answer(members, &mut groups);
                        if groups.len() > before {
                            first = Some(before);
                        }
                    }
                }
            }
            answered.sort_unstable();
        }
        for (sig, members) in &c.classes {
            let shape = sig.first().and_then(|w| u32::try_from(*w).ok());
            if shape.is_some_and(|s| answered.binary_search(&s).is_ok()) {
                continue;
            }
            answer(members, &mut groups);
        }
        Refusal::from_groups(m.name.clone(), total, groups, c.names.clone(), ex)
    }

    /// Asks every node why it cannot take the Machine (the reference for [`Self::refuse`]).
    #[cfg(any(test, feature = "testing"))]
    fn refuse_by_full_scan(&self, m: &Resolved, policy: Policy, exclude: Option<usize>) -> Refusal {
        let mut nodes = Vec::new();
        let mut total = 0;
        for (i, n) in self.slots.iter().enumerate() {
            let Some(n) = n else { continue };
            if exclude == Some(i) {
                continue;
            }
            total += 1;
            if let Err(reasons) = n.fit(m, policy, self.slot_policy) {
                nodes.push(NodeRefusal {
                    node: n.name().to_owned(),
                    reasons,
                });
            }
        }
        Refusal::from_nodes(m.name.clone(), total, nodes)
    }

    /// The refusal that asking every node gives, for tests comparing it with
    /// [`FleetState::try_place`]'s.
    ///
    /// # Errors
    /// As [`FleetState::place`] for an invalid Machine.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn refusal_by_full_scan(
        &self,
        machine: &Machine,
        policy: Policy,
    ) -> Result<Refusal, SchedError> {
        let resolved = resolve(machine, &self.templates, &self.catalog, self.has_nodes())?;
        Ok(self.refuse_by_full_scan(&resolved, policy, None))
    }
}
