//! The node agent in the guest: `gpuslice agent` on a unix socket creates and removes mbochs
//! instances, refuses to remove one whose `/dev/vfio/<group>` a process holds (naming its pid),
//! and after a `kill -9` and the instance removed by hand, re-creates it with the same UUID.

use std::fs;
use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::checks::{Lab, Outcome};
use crate::cli::{GPUSLICE, NODE};
use crate::sys;

const SOCKET: &str = "/run/gpuslice/lab-agent.sock";
const STATE: &str = "/tmp/lab-agent-state";

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start() -> Result<Agent, String> {
    let child = Command::new(GPUSLICE)
        .args([
            "--node",
            NODE,
            "agent",
            "--listen",
            &format!("unix:{SOCKET}"),
            "--state-dir",
            STATE,
            "--resync",
            "0",
            "--no-nvml",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {GPUSLICE} agent: {e}"))?;
    let mut agent = Agent(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if UnixStream::connect(SOCKET).is_ok() {
            return Ok(agent);
        }
        if let Ok(Some(status)) = agent.0.try_wait() {
            return Err(format!("the agent exited before listening ({status})"));
        }
        if Instant::now() > deadline {
            return Err("the agent did not listen within 20 s".to_owned());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn call(method: &str, path: &str, body: &str) -> Result<(u16, Value), String> {
    let mut s = UnixStream::connect(SOCKET).map_err(|e| format!("connect {SOCKET}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .map_err(|e| format!("{method} {path}: {e}"))?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("{method} {path}: {e}"))?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let v = serde_json::from_str(body)
        .map_err(|e| format!("{method} {path}: not JSON ({e}): {body}"))?;
    Ok((status, v))
}

fn ensure(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(why()) }
}

/// Create through the socket, DELETE refused with 409 naming the holder's pid, restart after a
/// `kill -9` and a removal by hand restores the same UUID, DELETE removes it.
pub fn agent_socket(_lab: &mut Lab) -> Outcome {
    let _ = fs::remove_dir_all(STATE);
    let agent = start()?;
    let (status, created) = call(
        "POST",
        "/v1/vgpus",
        r#"{"parent":"mbochs","profile":"mbochs-small","machine":"lab-vm"}"#,
    )?;
    ensure(status == 201, || {
        format!("create answered {status}: {created}")
    })?;
    let uuid = created["uuid"].as_str().unwrap_or("").to_owned();
    ensure(sys::mdev_instances()?.contains_key(&uuid), || {
        format!("the kernel has no mdev {uuid} after the create")
    })?;
    let group = sys::link_name(format!("{}/bus/mdev/devices/{uuid}/iommu_group", sys::SYS))
        .ok_or_else(|| format!("mdev {uuid} has no iommu_group"))?;
    let held = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/dev/vfio/{group}"))
        .map_err(|e| format!("cannot hold /dev/vfio/{group}: {e}"))?;
    let (status, refused) = call("DELETE", &format!("/v1/vgpus/{uuid}"), "")?;
    let pid = format!("pid {}", std::process::id());
    ensure(
        status == 409 && refused["error"]["kind"] == "in-use" && refused.to_string().contains(&pid),
        || format!("DELETE while held answered {status}: {refused} (expected 409 naming {pid})"),
    )?;
    drop(held);
    // kill -9, then the instance removed by hand (as a reboot would).
    drop(agent);
    sys::write(format!("{}/bus/mdev/devices/{uuid}/remove", sys::SYS), "1")?;
    ensure(!sys::mdev_instances()?.contains_key(&uuid), || {
        format!("mdev {uuid} still there after remove")
    })?;
    let _agent = start()?;
    ensure(sys::mdev_instances()?.contains_key(&uuid), || {
        format!("the restarted agent did not re-create mdev {uuid}")
    })?;
    let (status, removed) = call("DELETE", &format!("/v1/vgpus/{uuid}"), "")?;
    ensure(status == 200, || {
        format!("DELETE answered {status}: {removed}")
    })?;
    ensure(!sys::mdev_instances()?.contains_key(&uuid), || {
        format!("mdev {uuid} still there after DELETE")
    })?;
    ensure(
        !Path::new(SOCKET).exists() || UnixStream::connect(SOCKET).is_ok(),
        || "a stale socket".to_owned(),
    )?;
    Ok(format!(
        "created {uuid} through the socket; 409 naming {pid}; re-created after kill -9; removed"
    ))
}
