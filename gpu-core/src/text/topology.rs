//! The topology page of `gpuslice topology`.

use std::fmt::Write as _;

use super::{GPU_HEADERS, dash, gpu_row, indent, render_table};
use crate::{Allocation, NodeTopology, PciAddress, pool, usage};

fn mib(v: u64) -> String {
    format!("{v} MiB")
}

/// The topology as people read it: GPUs, then vGPU parents grouped per GPU with each profile's
/// free count and the instances with their parents and holders (the Machine whose allocation
/// holds it, among `allocations`; else `in use` when a process holds it open), then the GPU
/// memory line with the allocations counted.
pub fn topology(t: &NodeTopology, allocations: &[Allocation]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Node {}", t.node);
    let _ = writeln!(out);
    let _ = writeln!(out, "GPUs");
    if t.gpus.is_empty() {
        let _ = writeln!(out, "  (none)");
    } else {
        let rows: Vec<Vec<String>> = t
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
        let instances: Vec<Vec<String>> = members
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
                            None if i.in_use == Some(true) => "in use".to_owned(),
                            None => "-".to_owned(),
                        },
                    ]
                })
            })
            .collect();
        if !instances.is_empty() {
            out.push_str(&indent(&indent(&render_table(
                &["INSTANCE", "PROFILE", "SIZE", "PARENT", "HOLDER"],
                &instances,
            ))));
        }
    }

    // Memory handed out: vGPU framebuffer in use, plus whole GPUs bound to vfio-pci.
    let usage = usage::vram_usage(t, allocations);
    let _ = writeln!(out);
    let _ = writeln!(out, "GPU memory: {}", usage.summary());
    out
}
