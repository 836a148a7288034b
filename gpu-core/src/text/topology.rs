//! The topology page of `gpuslice topology`.

use std::fmt::Write as _;

use super::{GPU_HEADERS, dash, gpu_row, indent, render_table};
use crate::{Allocation, Instance, NodeTopology, ParentId, PciAddress, pool, usage};

fn mib(v: u64) -> String {
    format!("{v} MiB")
}

/// A process (or anything else) holding a device open, as HOLDER shows it.
pub type HolderOf<'a, T> = &'a dyn Fn(&T) -> Option<String>;

/// A vGPU an allocation holds that the host does not show yet: its parent and its row
/// (`INSTANCE`, `PROFILE`, `SIZE`, `PARENT`, `HOLDER`).
pub type PendingRow = (ParentId, [String; 5]);

/// What the topology page shows beside the node: the allocations on it, who holds its devices
/// open, and the vGPUs allocated but not made yet.
#[derive(Default)]
pub struct Shown<'a> {
    /// The node the memory line counts `allocations` on (`None`: the page's node).
    pub snapshot: Option<&'a NodeTopology>,
    /// The allocations: an instance one holds shows its Machine.
    pub allocations: &'a [Allocation],
    /// Who holds a GPU open (a HOLDER column appears when anyone does).
    pub gpu_holder: Option<HolderOf<'a, PciAddress>>,
    /// Who holds an instance open (else `in use` when the host says it is).
    pub instance_holder: Option<HolderOf<'a, Instance>>,
    /// Allocated vGPUs the host does not show yet, listed under their parent's pool.
    pub pending: &'a [PendingRow],
}

/// Adds a HOLDER column to a table of `gpus` (one row each) when `holder` names anyone for one
/// of them (a VM with it passed through); otherwise the table stays as it was.
pub fn add_holder_column(
    headers: &mut Vec<&str>,
    rows: &mut [Vec<String>],
    gpus: &[crate::Gpu],
    holder: HolderOf<'_, PciAddress>,
) {
    let held: Vec<Option<String>> = gpus.iter().map(|g| holder(&g.address)).collect();
    if held.iter().all(Option::is_none) {
        return;
    }
    headers.push("HOLDER");
    for (r, h) in rows.iter_mut().zip(held) {
        r.push(h.unwrap_or_else(|| "-".to_owned()));
    }
}

/// The topology as people read it: GPUs (with HOLDER when something holds one open), then vGPU
/// parents grouped per GPU with each profile's free count and the instances with their parents
/// and holders (the Machine whose allocation holds it, made or not yet; else what holds it
/// open, or `in use`), then the GPU memory line with the allocations counted.
pub fn topology(t: &NodeTopology, shown: &Shown<'_>) -> String {
    let allocations = shown.allocations;
    let mut out = String::new();
    let _ = writeln!(out, "Node {}", t.node);
    let _ = writeln!(out);
    let _ = writeln!(out, "GPUs");
    if t.gpus.is_empty() {
        let _ = writeln!(out, "  (none)");
    } else {
        let mut rows: Vec<Vec<String>> = t
            .gpus
            .iter()
            .map(|g| {
                let mut r = gpu_row(g);
                r.push(usage::memory_text(g));
                r.push(dash(g.state_reason.as_deref()));
                r
            })
            .collect();
        let mut headers = GPU_HEADERS.to_vec();
        headers.extend(["MEMORY", "WHY"]);
        if let Some(holder) = shown.gpu_holder {
            add_holder_column(&mut headers, &mut rows, &t.gpus, holder);
        }
        out.push_str(&indent(&render_table(&headers, &rows)));
    }

    let _ = writeln!(out);
    let _ = writeln!(out, "vGPU parents");
    if t.mediated_devices.parents.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for (key, members) in &pool::parents_by_pool(t) {
        let pool = t.pool(key);
        let gpu_name = key
            .pci()
            .and_then(|a: PciAddress| t.gpu_by_address(&a))
            .map(|g| g.name.clone());
        let framework = members.first().map(|p| p.framework.as_str()).unwrap_or("-");
        let free_parents = members
            .iter()
            .filter(|p| p.profiles.iter().any(|x| x.available_instances > 0))
            .count();
        let title = match &gpu_name {
            Some(n) => format!("{n} ({key})"),
            None => key.to_string(),
        };
        let mut head = format!(
            "{title}: {framework}, {} parent{}, {free_parents} with room",
            members.len(),
            if members.len() == 1 { "" } else { "s" }
        );
        if let Some(pool) = pool {
            let lower_bound = usage::pool_total_is_lower_bound(t, pool);
            let _ = write!(
                head,
                "; pool {} of {}{} used",
                mib(pool.used_mib),
                if lower_bound { "at least " } else { "" },
                mib(pool.total_mib)
            );
            if let Some(l) = pool.size_locked_mib.filter(|_| !pool.mixed_size) {
                let _ = write!(head, ", locked to {} vGPUs", mib(l));
            }
            if let (Some(total), Some(used)) = (pool.mig_slices_total, pool.mig_slices_used) {
                let _ = write!(head, ", MIG slices {used} of {total} used");
            }
        }
        let _ = writeln!(out, "  {head}");
        let lines = pool::profile_offers(members, pool);
        if !lines.is_empty() {
            let rows: Vec<Vec<String>> = lines
                .iter()
                .map(|l| {
                    vec![
                        l.name.clone(),
                        l.id.clone(),
                        l.size_mib.map_or_else(|| "-".to_owned(), mib),
                        l.free.to_string(),
                        l.parents_free.to_string(),
                    ]
                })
                .collect();
            out.push_str(&indent(&indent(&render_table(
                &["PROFILE", "ID", "SIZE", "FREE", "ON PARENTS"],
                &rows,
            ))));
        }
        if let Some(line) = needing_instance(t, key) {
            let _ = writeln!(out, "    {line}");
        }
        let mut instances: Vec<Vec<String>> = members
            .iter()
            .flat_map(|p| {
                p.instances.iter().map(|i| {
                    vec![
                        i.uuid
                            .map(|u| u.to_string())
                            .or_else(|| i.address.map(|a| a.to_string()))
                            .unwrap_or_else(|| "-".to_owned()),
                        i.profile_name
                            .clone()
                            .unwrap_or_else(|| i.profile.to_string()),
                        i.framebuffer_mib.map_or_else(|| "-".to_owned(), mib),
                        p.id.to_string(),
                        match usage::allocated_instance(t, allocations, p, i) {
                            Some(a) => format!("Machine {}", a.machine),
                            None => match shown.instance_holder.and_then(|h| h(i)) {
                                Some(h) => h,
                                None if i.in_use == Some(true) => "in use".to_owned(),
                                None => "-".to_owned(),
                            },
                        },
                    ]
                })
            })
            .collect();
        instances.extend(
            shown
                .pending
                .iter()
                .filter(|(parent, _)| members.iter().any(|p| p.id == *parent))
                .map(|(_, row)| row.to_vec()),
        );
        if !instances.is_empty() {
            out.push_str(&indent(&indent(&render_table(
                &["INSTANCE", "PROFILE", "SIZE", "PARENT", "HOLDER"],
                &instances,
            ))));
        }
    }

    // Memory handed out: vGPU framebuffer in use, plus whole GPUs bound to vfio-pci.
    let usage = usage::vram_usage(shown.snapshot.unwrap_or(t), allocations);
    let _ = writeln!(out);
    let _ = writeln!(out, "GPU memory: {}", usage.summary());
    out
}

/// The MIG-backed types GPU `key` supports whose GPU instance does not exist yet, as one line
/// (none when there are none): they are not "with room", yet a create makes their instance.
fn needing_instance(t: &NodeTopology, key: &ParentId) -> Option<String> {
    let g = t.gpu_by_address(&key.pci()?)?;
    let names: Vec<&str> = g
        .mig_backed_types
        .as_ref()?
        .types
        .iter()
        .filter(|m| m.needs_gpu_instance)
        .map(|m| m.name.as_str())
        .collect();
    (!names.is_empty()).then(|| {
        format!(
            "MIG-backed, no GPU instance yet (made when asked for, where `gpuslice mig list` shows \
             a free start): {}",
            names.join(", ")
        )
    })
}
