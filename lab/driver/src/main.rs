//! The real-kernel lab's test driver: runs inside the QEMU guest after the init script loaded the
//! kernel modules, drives the `gpuslice` binary against the real kernel, and prints one line per
//! check on the serial console:
//!
//! ```text
//! LAB-RESULT <check> pass|fail|skip <detail>
//! LAB-DONE <passed> <failed>
//! ```
//!
//! A check whose detail starts with [`checks::SKIPPED`] could not run here (what it needs is not
//! on the host, the reason follows): it is reported as `skip`, neither passed nor failed.
//!
//! The host side (`lab/run`) parses those lines. The boot's mode comes from the kernel command
//! line: `lab.mode=iommu` (an emulated Intel IOMMU) or `lab.mode=noiommu`; `facts` and
//! `facts-noiommu` print raw kernel behaviour instead (see `facts.rs`).

mod agent;
mod apiserver;
mod checks;
mod cli;
mod dra;
mod facts;
mod heal;
mod sys;
mod wire;

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use checks::{Lab, Outcome};

type Check = (&'static str, fn(&mut Lab) -> Outcome);

const WITH_IOMMU: &[Check] = &[
    ("lab-setup", checks::lab_setup),
    ("gpu-list", checks::gpu_list),
    ("doctor", checks::doctor_kernel),
    ("topology", checks::topology),
    ("vgpu-create-counts", checks::vgpu_create),
    ("vgpu-create-again-is-idempotent", checks::vgpu_create_again),
    ("vgpu-create-duplicate-uuid", checks::vgpu_create_duplicate),
    ("place-actuate-rediscover", checks::place_actuate_rediscover),
    ("vgpu-create-exhausted", checks::vgpu_create_exhausted),
    ("vgpu-remove-restores", checks::vgpu_remove),
    ("gpu-bind-release", checks::gpu_bind_release),
    ("gpu-bind-blocked-refused", checks::gpu_bind_refused),
    ("vgpu-apply-assert-clear", checks::vgpu_apply_assert_clear),
    ("agent-socket-restart-in-use", agent::agent_socket),
    ("hostile-root", checks::hostile_root),
    ("agent-sees-hand-changes", agent::agent_sees_hand_changes),
    (
        "agent-state-full-and-read-only",
        agent::agent_state_full_and_read_only,
    ),
    (
        "agent-restores-hand-removed-mdevs",
        heal::agent_restores_hand_removed_mdevs,
    ),
    (
        "agent-state-fifo-and-link-refused",
        heal::agent_state_fifo_and_link_refused,
    ),
    ("dra-prepare-whole-gpu", dra::dra_whole_gpu),
    ("dra-prepare-mdev", dra::dra_prepare_mdev),
    ("dra-grpc-stand-in", dra::dra_grpc_stand_in),
    (
        "dra-slices-follow-hand-changes",
        dra::dra_slices_follow_hand_changes,
    ),
];

const WITHOUT_IOMMU: &[Check] = &[
    ("lab-setup", checks::lab_setup),
    ("gpu-list", checks::gpu_list),
    ("doctor", checks::doctor_kernel),
    ("gpu-bind-refused", checks::gpu_bind_refused),
    ("topology", checks::topology),
    ("vgpu-create-counts", checks::vgpu_create),
    ("gpu-list-with-mdevs", checks::gpu_list_with_mdevs),
    ("vgpu-remove-restores", checks::vgpu_remove),
    ("hostile-root", checks::hostile_root),
    (
        "dra-prepare-refused-without-iommu",
        dra::dra_whole_gpu_refused,
    ),
];

/// Checks after which the guest is put back to a clean state, whatever they left.
const RESET_AFTER: &[&str] = &[
    "vgpu-remove-restores",
    "gpu-bind-release",
    "gpu-bind-blocked-refused",
    "agent-socket-restart-in-use",
    "agent-sees-hand-changes",
    "agent-state-full-and-read-only",
    "agent-restores-hand-removed-mdevs",
    "dra-prepare-whole-gpu",
    "dra-prepare-mdev",
    "dra-grpc-stand-in",
    "dra-slices-follow-hand-changes",
    "dra-prepare-refused-without-iommu",
];

/// One line, bounded, for the console protocol.
fn one_line(text: &str) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > 600 {
        format!("{}...", flat.chars().take(600).collect::<String>())
    } else {
        flat
    }
}

fn main() -> ExitCode {
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let mode = cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix("lab.mode="))
        .unwrap_or("iommu")
        .to_owned();
    let mut lab = Lab {
        iommu: !mode.ends_with("noiommu"),
        ..Lab::default()
    };
    if mode.starts_with("facts") {
        facts::run(lab.iommu);
        println!("\nLAB-DONE 0 0");
        return ExitCode::SUCCESS;
    }
    let list = if lab.iommu { WITH_IOMMU } else { WITHOUT_IOMMU };
    // `lab.only=a,b` (GPUSLICE_LAB_ONLY on the host) runs just those checks, to iterate on them.
    let only: Vec<&str> = cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix("lab.only="))
        .map(|o| o.split(',').collect())
        .unwrap_or_default();
    let list: Vec<&Check> = list
        .iter()
        .filter(|(name, _)| only.is_empty() || only.contains(name))
        .collect();
    let (mut passed, mut failed) = (0u32, 0u32);
    let mut out = std::io::stdout();
    for (name, check) in list {
        let started = Instant::now();
        let outcome = check(&mut lab);
        let secs = started.elapsed().as_secs_f64();
        let (word, detail) = match outcome {
            Ok(d) if d.starts_with(checks::SKIPPED) => ("skip", d),
            Ok(d) => {
                passed += 1;
                ("pass", d)
            }
            Err(e) => {
                failed += 1;
                ("fail", e)
            }
        };
        // A newline first: kernel messages may have left the console mid-line.
        let _ = writeln!(
            out,
            "\nLAB-RESULT {name} {word} ({secs:.1}s) {}",
            one_line(&detail)
        );
        if RESET_AFTER.contains(name) {
            for note in checks::reset(&mut lab) {
                let _ = writeln!(out, "LAB-NOTE reset after {name}: {}", one_line(&note));
            }
        }
        let _ = out.flush();
    }
    let _ = writeln!(out, "\nLAB-DONE {passed} {failed}");
    let _ = out.flush();
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
