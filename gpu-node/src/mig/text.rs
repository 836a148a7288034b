//! How `gpuslice mig ...` shows its answers as text (`-o table`); `-o json` serializes the
//! values themselves.

use std::fmt::Write as _;

use super::apply::GpuMigPlan;
use super::{GpuMig, MigChange};

/// `mig list`: each GPU's mode, its instances and its profiles with the free starts.
#[must_use]
pub fn list(gpus: &[GpuMig]) -> String {
    let mut out = String::new();
    for s in gpus {
        let _ = writeln!(out, "{}  MIG mode {}", s.gpu, s.mig_mode);
        for i in &s.gpu_instances {
            let _ = writeln!(
                out,
                "  GPU instance {:<3} {:<10} start {} ({} memory slices, made by {})",
                i.id, i.profile, i.start, i.slices, i.made_by
            );
        }
        for p in &s.profiles {
            let free: Vec<String> = p.placements.iter().map(u32::to_string).collect();
            let free = if free.is_empty() {
                "none".to_owned()
            } else {
                free.join(",")
            };
            let _ = writeln!(
                out,
                "  profile {:<10} {} compute / {} memory slices, {} MiB, free starts: {free}",
                p.name, p.slices, p.memory_slices, p.memory_mib
            );
        }
        if let Some(n) = &s.note {
            let _ = writeln!(out, "  geometry unknown: {n}");
        }
    }
    out
}

/// `mig apply`: what changed on each GPU.
#[must_use]
pub fn applied(changes: &[MigChange]) -> String {
    let mut out = String::new();
    for c in changes {
        let made: Vec<String> = c
            .created
            .iter()
            .map(|i| format!("{} at {}", i.profile, i.start))
            .collect();
        let _ = writeln!(
            out,
            "{}: {}{} destroyed, {} made{}",
            c.gpu,
            c.mig_mode
                .map(|m| format!("MIG mode {m}, "))
                .unwrap_or_default(),
            c.destroyed.len(),
            c.created.len(),
            if made.is_empty() {
                String::new()
            } else {
                format!(" ({})", made.join(", "))
            }
        );
    }
    out
}

/// `mig assert`: what differs, or that the host matches `config`.
#[must_use]
pub fn asserted(plans: &[GpuMigPlan], config: &str) -> String {
    let mut out = String::new();
    for p in plans.iter().filter(|p| !p.matches()) {
        let _ = writeln!(
            out,
            "{}: differs (MIG mode {}{}; {} instance(s) to destroy; to make: {})",
            p.gpu,
            if p.mig_enabled { "enabled" } else { "disabled" },
            if p.set_mode { " wanted" } else { "" },
            p.destroy.len(),
            if p.create.is_empty() {
                "none".to_owned()
            } else {
                p.create.join(", ")
            }
        );
    }
    if out.is_empty() {
        let _ = writeln!(out, "the host matches config {config}");
    }
    out
}

/// `mig clear`: what one GPU lost and kept.
#[must_use]
pub fn cleared(change: &MigChange, kept: &[u32]) -> String {
    let kept = if kept.is_empty() {
        String::new()
    } else {
        format!("; kept {kept:?} (a vGPU uses them)")
    };
    format!(
        "{}: {} GPU instance(s) destroyed{kept}\n",
        change.gpu,
        change.destroyed.len()
    )
}
