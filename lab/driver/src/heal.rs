//! The agent keeps a layout on a real kernel: mbochs instances removed by hand are made again by
//! the agent's resync with the same UUIDs (`layout-restored`, counted in `/metrics`); a host it
//! cannot restore (an instance a process holds open) is said once, not on every resync. And the
//! agent's state file: a FIFO or a planted link where `promises.json` should be is refused at
//! start, promptly and naming it, and the link's target is never written.

use std::fs;
use std::time::{Duration, Instant};

use crate::agent::{AGENT_LOG, call_text, start_resyncing};
use crate::checks::{Lab, Outcome};
use crate::cli::{GPUSLICE, NODE};
use crate::sys::{self, ensure};

const STATE: &str = "/tmp/lab-heal-state";
const LAYOUT: &str = "/tmp/lab-heal-layout.yaml";
const MBOCHS: &str = "/sys/class/mdev_bus/mbochs/mdev_supported_types";

/// The mbochs-small instances there are now.
fn smalls() -> Result<Vec<String>, String> {
    Ok(sys::mdev_instances()?
        .into_iter()
        .filter(|(_, i)| i.type_id == "mbochs-small")
        .map(|(u, _)| u)
        .collect())
}

/// Waits up to `within` for `ok`, polling every 100 ms.
fn wait_for(within: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    loop {
        if ok() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn metric(name: &str) -> Option<String> {
    let text = call_text("/metrics").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")).map(str::to_owned))
}

fn log_tail() -> String {
    let log = fs::read_to_string(AGENT_LOG).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(4).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

fn remove_by_hand(uuid: &str) -> Result<(), String> {
    sys::write(format!("/sys/bus/mdev/devices/{uuid}/remove"), "1")
}

pub fn agent_restores_hand_removed_mdevs(_lab: &mut Lab) -> Outcome {
    let _ = fs::remove_dir_all(STATE);
    fs::write(
        LAYOUT,
        "version: v1\nvgpu-configs:\n  lab:\n    mbochs: {mbochs-small: 2}\n",
    )
    .map_err(|e| format!("cannot write {LAYOUT}: {e}"))?;
    let _agent = start_resyncing(STATE, "1", &["--layout", LAYOUT, "-c", "lab"])?;
    ensure(
        wait_for(Duration::from_secs(30), || {
            smalls().is_ok_and(|s| s.len() == 2)
        }),
        || format!("the layout was not applied within 30 s [agent log: {}]", log_tail()),
    )?;
    let made = smalls()?;
    // A reload of the driver, by hand: every instance removed with `echo 1 > remove`.
    let removed_at = Instant::now();
    for u in &made {
        remove_by_hand(u)?;
    }
    ensure(smalls()?.is_empty(), || "the instances did not go".to_owned())?;
    ensure(
        wait_for(Duration::from_secs(30), || smalls().is_ok_and(|s| s == made)),
        || {
            format!(
                "the agent did not make {made:?} again within 30 s (now {:?}) [agent log: {}]",
                smalls(),
                log_tail()
            )
        },
    )?;
    let restored_in = removed_at.elapsed();
    ensure(
        wait_for(Duration::from_secs(5), || {
            metric("gpuslice_agent_layout_restored_total").as_deref() == Some("1")
        }),
        || {
            format!(
                "gpuslice_agent_layout_restored_total is {:?}, not 1",
                metric("gpuslice_agent_layout_restored_total")
            )
        },
    )?;
    // Now one it cannot restore: a large instance made by hand and held open, the smalls gone.
    let big = sys::new_uuid()?;
    sys::write(format!("{MBOCHS}/mbochs-large/create"), &big)?;
    let group = sys::link_name(format!("/sys/bus/mdev/devices/{big}/iommu_group"))
        .ok_or_else(|| format!("mdev {big} has no iommu_group"))?;
    let node = format!("/dev/vfio/{group}");
    let held = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&node)
        .map_err(|e| format!("cannot open {node}: {e}"))?;
    for u in &made {
        remove_by_hand(u)?;
    }
    ensure(
        wait_for(Duration::from_secs(30), || {
            metric("gpuslice_agent_layout_not_in_place").as_deref() == Some("1")
        }),
        || format!("no layout-not-in-place within 30 s [agent log: {}]", log_tail()),
    )?;
    // Several resyncs later: said once, nothing removed, nothing made.
    std::thread::sleep(Duration::from_secs(4));
    let said = fs::read_to_string(AGENT_LOG)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("not in place"))
        .count();
    ensure(said == 1, || {
        format!("the agent said \"not in place\" {said} times, not once [agent log: {}]", log_tail())
    })?;
    ensure(
        sys::mdev_instances()?.contains_key(&big) && smalls()?.is_empty(),
        || "a resync changed the host while a VM held an instance".to_owned(),
    )?;
    drop(held);
    Ok(format!(
        "2 mbochs-small removed by hand were made again with the same UUIDs in {:.1} s \
         (resync 1 s); with {big} held open the agent said not-in-place once",
        restored_in.as_secs_f64()
    ))
}

/// Starts the agent on a state directory holding `what` at `promises.json`; it must exit
/// within 20 s naming the file.
fn refused_at_start(state: &str, what: &str) -> Result<String, String> {
    let mut child = std::process::Command::new(GPUSLICE)
        .args(["--node", NODE, "agent", "--listen"])
        .arg(format!("unix:/run/gpuslice/lab-heal-{what}.sock"))
        .args(["--state-dir", state, "--resync", "0", "--no-nvml"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {GPUSLICE}: {e}"))?;
    let end = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "with a {what} at promises.json the agent neither started nor stopped within 20 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    ensure(!status.success(), || {
        format!("with a {what} at promises.json the agent exited 0")
    })?;
    ensure(err.contains("promises.json"), || {
        format!("the error does not name promises.json: {err}")
    })?;
    Ok(err.lines().last().unwrap_or("").to_owned())
}

pub fn agent_state_fifo_and_link_refused(_lab: &mut Lab) -> Outcome {
    let fifo_dir = "/tmp/lab-heal-fifo";
    let _ = fs::remove_dir_all(fifo_dir);
    fs::create_dir_all(fifo_dir).map_err(|e| e.to_string())?;
    let fifo = format!("{fifo_dir}/promises.json");
    nix::unistd::mkfifo(fifo.as_str(), nix::sys::stat::Mode::from_bits_truncate(0o600))
        .map_err(|e| format!("mkfifo {fifo}: {e}"))?;
    let fifo_err = refused_at_start(fifo_dir, "FIFO")?;
    let link_dir = "/tmp/lab-heal-link";
    let outside = "/tmp/lab-heal-outside.json";
    let _ = fs::remove_dir_all(link_dir);
    fs::create_dir_all(link_dir).map_err(|e| e.to_string())?;
    fs::write(outside, "untouched").map_err(|e| e.to_string())?;
    std::os::unix::fs::symlink(outside, format!("{link_dir}/promises.json"))
        .map_err(|e| e.to_string())?;
    let link_err = refused_at_start(link_dir, "link")?;
    ensure(
        fs::read_to_string(outside).ok().as_deref() == Some("untouched"),
        || format!("{outside} was written through the planted link"),
    )?;
    Ok(format!("FIFO: {fifo_err}; link: {link_err}"))
}
