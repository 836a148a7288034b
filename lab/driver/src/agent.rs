//! The node agent in the guest: `gpuslice agent` on a unix socket creates and removes mbochs
//! instances, refuses to remove one whose `/dev/vfio/<group>` a process holds (naming its pid),
//! and after a `kill -9` and the instance removed by hand, re-creates it with the same UUID; and
//! sees through kernel uevents what is done by hand (mdevs made with `echo`, a GPU rebound).

use crate::sys::ensure;
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
/// The agent's stderr (its log), read back when a check fails.
pub(crate) const AGENT_LOG: &str = "/tmp/lab-agent.log";

pub(crate) struct Agent(pub(crate) Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start() -> Result<Agent, String> {
    start_with(&[])
}

fn start_with(extra: &[&str]) -> Result<Agent, String> {
    start_in(STATE, extra)
}

fn start_in(state: &str, extra: &[&str]) -> Result<Agent, String> {
    start_resyncing(state, "0", extra)
}

/// The agent on [`SOCKET`] with its state in `state`, reading the host every `resync` seconds.
pub(crate) fn start_resyncing(state: &str, resync: &str, extra: &[&str]) -> Result<Agent, String> {
    let log = fs::File::create(AGENT_LOG).map_err(|e| format!("cannot create {AGENT_LOG}: {e}"))?;
    let child = Command::new(GPUSLICE)
        .args([
            "--node",
            NODE,
            "agent",
            "--listen",
            &format!("unix:{SOCKET}"),
            "--state-dir",
            state,
            "--resync",
            resync,
            "--no-nvml",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
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

/// Creates an mbochs-small instance for `machine` through the socket; its UUID.
fn create_small(machine: &str) -> Result<String, String> {
    let body = format!(r#"{{"parent":"mbochs","profile":"mbochs-small","machine":"{machine}"}}"#);
    let (status, created) = call("POST", "/v1/vgpus", &body)?;
    ensure(status == 201, || {
        format!("create answered {status}: {created}")
    })?;
    Ok(created["uuid"].as_str().unwrap_or("").to_owned())
}

/// Create through the socket, DELETE refused with 409 naming the holder's pid, restart after a
/// `kill -9` and a removal by hand restores the same UUID, DELETE removes it.
pub fn agent_socket(_lab: &mut Lab) -> Outcome {
    let _ = fs::remove_dir_all(STATE);
    let agent = start()?;
    let uuid = create_small("lab-vm")?;
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

/// The agent's event stream, read line by line on its own connection.
struct Events {
    stream: UnixStream,
    buf: Vec<u8>,
    /// The last events read (kind, action, devpath), for a failure's message.
    recent: std::collections::VecDeque<String>,
}

impl Events {
    /// Subscribes and waits for the answer's head: only then is the subscription in place
    /// (the agent subscribes before it answers), so nothing done afterwards can be missed.
    fn open() -> Result<Self, String> {
        let mut stream =
            UnixStream::connect(SOCKET).map_err(|e| format!("connect {SOCKET}: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(|e| e.to_string())?;
        stream
            .write_all(b"GET /v1/events?format=ndjson HTTP/1.1\r\nHost: agent\r\n\r\n")
            .map_err(|e| format!("GET /v1/events: {e}"))?;
        let mut buf = Vec::new();
        let end = Instant::now() + Duration::from_secs(10);
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if Instant::now() > end {
                return Err("GET /v1/events: no answer within 10 s".to_owned());
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk) {
                Ok(0) => return Err("GET /v1/events: the agent closed the stream".to_owned()),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(_) => {}
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        ensure(head.starts_with("HTTP/1.1 200"), || {
            format!(
                "GET /v1/events answered {}",
                head.lines().next().unwrap_or("")
            )
        })?;
        buf.drain(..head_end);
        Ok(Events {
            stream,
            buf,
            recent: Default::default(),
        })
    }

    /// Waits up to `within` for an event `pred` accepts; events before it are skipped.
    fn wait(&mut self, within: Duration, pred: impl Fn(&Value) -> bool) -> Option<Value> {
        let end = Instant::now() + within;
        loop {
            // Each event is one chunk of one JSON line; chunk sizes are lines of their own.
            while let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                let text = String::from_utf8_lossy(&line);
                let text = text.trim();
                if text.starts_with('{') {
                    if let Ok(v) = serde_json::from_str::<Value>(text) {
                        if self.recent.len() == 12 {
                            self.recent.pop_front();
                        }
                        self.recent.push_back(format!(
                            "{} {} {} {}",
                            v["revision"],
                            v["kind"].as_str().unwrap_or("?"),
                            v["data"]["action"].as_str().unwrap_or(""),
                            v["data"]["devpath"].as_str().unwrap_or("")
                        ));
                        if pred(&v) {
                            return Some(v);
                        }
                    }
                }
            }
            if Instant::now() > end {
                return None;
            }
            let mut chunk = [0u8; 8192];
            match self.stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(_) => {}
            }
        }
    }

    /// What a failure reports beside its own reason: the agent's uevent counters, the last
    /// events read and the end of the agent's log.
    fn diagnose(&self) -> String {
        let counters = call_text("/metrics")
            .map(|m| {
                m.lines()
                    .filter(|l| {
                        l.starts_with("gpuslice_agent_uevents")
                            || l.starts_with("gpuslice_agent_resyncs")
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_else(|e| e);
        let log = fs::read_to_string(AGENT_LOG).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(4).collect();
        format!(
            "[metrics: {counters}] [last events: {}] [agent log: {}]",
            self.recent.iter().cloned().collect::<Vec<_>>().join(" | "),
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        )
    }
}

/// A GET whose answer is text (`/metrics`).
pub(crate) fn call_text(path: &str) -> Result<String, String> {
    let mut s = UnixStream::connect(SOCKET).map_err(|e| format!("connect {SOCKET}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .map_err(|e| format!("GET {path}: {e}"))?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("GET {path}: {e}"))?;
    Ok(out
        .split_once("\r\n\r\n")
        .map_or(out.clone(), |(_, b)| b.to_owned()))
}

fn median_max(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    (v.get(v.len() / 2).map_or(0.0, ms), v.last().map_or(0.0, ms))
}

fn topology_has(needle: &str) -> Result<bool, String> {
    let (status, t) = call("GET", "/v1/topology", "")?;
    ensure(status == 200, || {
        format!("GET /v1/topology answered {status}")
    })?;
    Ok(t.to_string().contains(needle))
}

/// How many creates the latency is measured over.
const CREATES: usize = 100;

/// The agent sees what is done by hand (plain writes to sysfs, not through gpuslice) within one
/// second through the kernel's uevents, with the resync off: 100 mbochs instances created and
/// removed, and a GPU bound to vfio-pci and released. Reports the latency from the sysfs write to
/// the uevent on `/v1/events` and to the new revision (median and max over the creates).
pub fn agent_sees_hand_changes(_lab: &mut Lab) -> Outcome {
    let _ = fs::remove_dir_all(STATE);
    let _agent = start_with(&["--uevents", "on"])?;
    let mut events = Events::open()?;
    let create = format!(
        "{}/class/mdev_bus/mbochs/mdev_supported_types/mbochs-small/create",
        sys::SYS
    );
    let within = Duration::from_secs(1);
    let (mut to_uevent, mut to_revision) = (Vec::new(), Vec::new());
    for n in 0..CREATES {
        let uuid = sys::new_uuid()?;
        let t0 = Instant::now();
        sys::write(&create, &uuid)?;
        let added = events
            .wait(within, |e| {
                e["kind"] == "uevent"
                    && e["data"]["action"] == "add"
                    && e["data"]["devpath"]
                        .as_str()
                        .is_some_and(|p| p.ends_with(&uuid))
            })
            .ok_or_else(|| {
                format!(
                    "create {n}: no uevent for the mdev {uuid} created by hand within 1 s {}",
                    events.diagnose()
                )
            })?;
        to_uevent.push(t0.elapsed());
        let rev = added["revision"].as_u64().unwrap_or(0);
        events
            .wait(within, |e| {
                e["kind"] == "topology-changed" && e["revision"].as_u64().unwrap_or(0) > rev
            })
            .ok_or_else(|| {
                format!(
                    "create {n}: no new revision within 1 s of creating mdev {uuid} {}",
                    events.diagnose()
                )
            })?;
        to_revision.push(t0.elapsed());
        ensure(topology_has(&uuid)?, || {
            format!("the served topology lacks mdev {uuid} after its revision")
        })?;
        sys::write(format!("{}/bus/mdev/devices/{uuid}/remove", sys::SYS), "1")?;
        let removed = events
            .wait(within, |e| {
                e["kind"] == "uevent"
                    && e["data"]["action"] == "remove"
                    && e["data"]["devpath"]
                        .as_str()
                        .is_some_and(|p| p.ends_with(&uuid))
            })
            .ok_or_else(|| {
                format!(
                    "no uevent for the mdev {uuid} removed by hand within 1 s {}",
                    events.diagnose()
                )
            })?;
        let rev = removed["revision"].as_u64().unwrap_or(0);
        events
            .wait(within, |e| {
                e["kind"] == "topology-changed" && e["revision"].as_u64().unwrap_or(0) > rev
            })
            .ok_or_else(|| {
                format!(
                    "no new revision within 1 s of removing mdev {uuid} {}",
                    events.diagnose()
                )
            })?;
        ensure(!topology_has(&uuid)?, || {
            format!("the served topology still has mdev {uuid} after its removal")
        })?;
    }
    let (ue_median, ue_max) = median_max(to_uevent);
    let (rev_median, rev_max) = median_max(to_revision);
    // A GPU bound to vfio-pci and released by hand.
    let all = sys::pci_functions()?;
    let mut free: Vec<&sys::PciFunction> = all
        .iter()
        .filter(|f| f.is_display() && sys::expected_state(f, &all) == sys::ExpectedState::Free)
        .collect();
    // As the other bind checks: the device behind the PCIe root port first.
    free.sort_by_key(|f| f.address.starts_with("0000:00:"));
    let gpu = free
        .first()
        .ok_or("no free display device to bind by hand")?;
    let (addr, host_driver) = (
        gpu.address.clone(),
        gpu.driver
            .clone()
            .ok_or("the free display device has no driver")?,
    );
    let dev = format!("{}/bus/pci/devices/{addr}", sys::SYS);
    let rebind = |driver_override: &str, expect: &str, events: &mut Events| {
        sys::write(format!("{dev}/driver_override"), driver_override)?;
        sys::write(format!("{dev}/driver/unbind"), &addr)?;
        sys::write(format!("{}/bus/pci/drivers_probe", sys::SYS), &addr)?;
        let bound = events
            .wait(within, |e| {
                e["kind"] == "uevent"
                    && e["data"]["action"] == "bind"
                    && e["data"]["driver"] == expect
            })
            .ok_or_else(|| {
                format!(
                    "no bind uevent to {expect} for {addr} within 1 s {}",
                    events.diagnose()
                )
            })?;
        let rev = bound["revision"].as_u64().unwrap_or(0);
        events
            .wait(within, |e| {
                e["kind"] == "topology-changed" && e["revision"].as_u64().unwrap_or(0) > rev
            })
            .ok_or_else(|| {
                format!(
                    "no new revision within 1 s of binding {addr} to {expect} {}",
                    events.diagnose()
                )
            })?;
        let (_, t) = call("GET", "/v1/topology", "")?;
        let served = t["gpus"]
            .as_array()
            .and_then(|g| g.iter().find(|g| g["address"] == addr.as_str()))
            .and_then(|g| g["driver"].as_str().map(str::to_owned));
        ensure(served.as_deref() == Some(expect), || {
            format!("the served topology says {addr} is bound to {served:?}, not {expect}")
        })
    };
    rebind("vfio-pci", "vfio-pci", &mut events)?;
    rebind("\n", &host_driver, &mut events)?;
    // How many of the agent's reads were narrow (one device) rather than the whole host.
    let metrics = call_text("/metrics")?;
    let figure = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or("?")
            .to_owned()
    };
    Ok(format!(
        "{CREATES} mdevs created and removed by hand, each seen within 1 s; sysfs write to uevent on /v1/events: median {ue_median:.1} ms, max {ue_max:.1} ms; to the new revision: median {rev_median:.1} ms, max {rev_max:.1} ms; {addr} bound to vfio-pci and released by hand, both seen; agent reads {} of which narrow {}",
        figure("gpuslice_agent_resyncs_total"),
        figure("gpuslice_agent_narrow_rereads_total"),
    ))
}

/// A small tmpfs for the agent's state, mounted inside the guest.
const SMALL: &str = "/tmp/lab-agent-small";

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    ensure(out.status.success(), || {
        format!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })
}

/// Fills the filesystem of `dir` until a write fails with ENOSPC.
fn fill(dir: &str) -> Result<(), String> {
    let mut f = fs::File::create(format!("{dir}/filler"))
        .map_err(|e| format!("cannot create {dir}/filler: {e}"))?;
    let chunk = vec![0u8; 4096];
    for _ in 0..100_000 {
        if let Err(e) = f.write_all(&chunk) {
            return ensure(e.raw_os_error() == Some(28), || {
                format!("filling {dir}: {e}")
            });
        }
    }
    Err(format!("{dir} never filled up"))
}

/// The agent's promises on a real full tmpfs and a real read-only remount: a DELETE whose
/// `removing` record cannot be written answers 503 and removes nothing; a restart on the
/// read-only state keeps the instance; once writable, the DELETE goes through.
pub fn agent_state_full_and_read_only(_lab: &mut Lab) -> Outcome {
    fs::create_dir_all(SMALL).map_err(|e| format!("cannot create {SMALL}: {e}"))?;
    sh(&["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", SMALL])?;
    let state = format!("{SMALL}/agent");
    let result = (|| {
        let agent = start_in(&state, &[])?;
        let uuid = create_small("lab-small")?;
        fill(SMALL)?;
        let (status, refused) = call("DELETE", &format!("/v1/vgpus/{uuid}"), "")?;
        ensure(status == 503, || {
            format!("DELETE on a full disk answered {status}: {refused}")
        })?;
        ensure(sys::mdev_instances()?.contains_key(&uuid), || {
            format!("mdev {uuid} was removed although its removal could not be recorded")
        })?;
        fs::remove_file(format!("{SMALL}/filler")).map_err(|e| e.to_string())?;
        sh(&["mount", "-o", "remount,ro", SMALL])?;
        let (status, refused) = call("DELETE", &format!("/v1/vgpus/{uuid}"), "")?;
        ensure(status == 503, || {
            format!("DELETE on a read-only state dir answered {status}: {refused}")
        })?;
        ensure(sys::mdev_instances()?.contains_key(&uuid), || {
            format!("mdev {uuid} was removed on a read-only state dir")
        })?;
        // kill -9 and a restart on the read-only state: the instance stays, nothing is lost.
        drop(agent);
        let agent = start_in(&state, &[])?;
        ensure(sys::mdev_instances()?.contains_key(&uuid), || {
            format!("mdev {uuid} gone after a restart on a read-only state dir")
        })?;
        sh(&["mount", "-o", "remount,rw", SMALL])?;
        let (status, removed) = call("DELETE", &format!("/v1/vgpus/{uuid}"), "")?;
        ensure(status == 200, || {
            format!("DELETE answered {status}: {removed}")
        })?;
        drop(agent);
        let _agent = start_in(&state, &[])?;
        ensure(!sys::mdev_instances()?.contains_key(&uuid), || {
            format!("mdev {uuid} came back after its DELETE and a restart")
        })?;
        Ok(format!(
            "{uuid}: DELETE 503 on a full and on a read-only state dir, nothing removed; kept \
             across a restart; removed once writable, not re-created"
        ))
    })();
    let _ = sh(&["umount", SMALL]);
    result
}
