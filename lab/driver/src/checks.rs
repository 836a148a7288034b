//! The checks. Each one drives `gpuslice` and compares what it says and does with what the kernel
//! shows in `/sys`. A check returns `Ok(detail)` when it passed and `Err(why)` when not.
//!
//! Checks run in order and share a [`Lab`]: the vGPU checks build on the instances earlier ones
//! created, as an operator's session would.

use crate::sys::ensure;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use serde_json::Value;

use crate::cli::{self, array_field, str_field};
use crate::sys::{self, ExpectedState, PciFunction};

/// Result of one check.
pub type Outcome = Result<String, String>;

/// How an `Ok` detail starts when the check could not run (reported as `skip`).
pub const SKIPPED: &str = "SKIPPED: ";

/// State carried from check to check.
#[derive(Debug, Default)]
pub struct Lab {
    /// Whether the guest was booted with an IOMMU.
    pub iommu: bool,
    /// `available_instances` of every type before any check created anything.
    pub initial_counts: BTreeMap<String, u32>,
    /// The mbochs-small instance the first create made.
    pub small: Option<String>,
    /// Instances created through gpuslice and not removed yet.
    pub created: Vec<String>,
}

/// The mdev parents of the kernel's samples and one type of each for the create checks.
const SAMPLE_PARENTS: [(&str, &str); 3] = [
    ("mbochs", "mbochs-small"),
    ("mtty", "mtty-2"),
    ("mdpy", "mdpy-vga"),
];

const LAYOUT: &str = "/tmp/lab-layout.yaml";
const FLEET: &str = "/tmp/lab-fleet.json";
const MACHINE: &str = "/tmp/lab-machine.yaml";

fn fmt_counts(counts: &BTreeMap<String, u32>, parent: &str) -> String {
    counts
        .iter()
        .filter(|(k, _)| k.starts_with(&format!("{parent}/")))
        .map(|(k, v)| format!("{}={v}", k.rsplit('/').next().unwrap_or(k)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The kernel modules, mdev parents and (with an IOMMU) groups the lab needs are there.
pub fn lab_setup(lab: &mut Lab) -> Outcome {
    let missing: Vec<&str> = [
        "vfio_pci",
        "vfio_iommu_type1",
        "mdev",
        "mbochs",
        "mdpy",
        "mtty",
        "bochs",
        "e1000",
    ]
    .into_iter()
    .filter(|m| !Path::new(&format!("{}/module/{m}", sys::SYS)).exists())
    .collect();
    ensure(missing.is_empty(), || {
        format!("modules not loaded: {}", missing.join(" "))
    })?;
    let parents = sys::list(format!("{}/class/mdev_bus", sys::SYS));
    for (p, _) in SAMPLE_PARENTS {
        ensure(parents.iter().any(|x| x == p), || {
            format!("no mdev parent {p} (have: {parents:?})")
        })?;
    }
    let groups = sys::list(format!("{}/kernel/iommu_groups", sys::SYS));
    if lab.iommu {
        ensure(!groups.is_empty(), || {
            "booted with intel-iommu but there are no IOMMU groups".into()
        })?;
    } else {
        ensure(groups.is_empty(), || {
            format!("booted without an IOMMU but found groups {groups:?}")
        })?;
    }
    let displays = sys::pci_functions()?
        .into_iter()
        .filter(PciFunction::is_display)
        .count();
    ensure(displays >= 5, || {
        format!("expected 5 display devices, found {displays}")
    })?;
    lab.initial_counts = sys::counts(&sys::mdev_types()?);
    Ok(format!(
        "kernel {}; {} IOMMU groups; {displays} display devices; parents {}",
        sys::read("/proc/sys/kernel/osrelease")?,
        groups.len(),
        parents.join(",")
    ))
}

/// `gpus` of `gpu list -o json` (a bare array or an object holding `gpus`).
fn listed_gpus() -> Result<Vec<Value>, String> {
    let v = cli::json(&["gpu", "list"])?;
    match v {
        Value::Array(items) => Ok(items),
        other => Ok(array_field(&other, "gpus", "gpu list output")?.to_vec()),
    }
}

fn find_gpu<'a>(gpus: &'a [Value], address: &str) -> Result<&'a Value, String> {
    gpus.iter()
        .find(|g| {
            g.get("address")
                .and_then(Value::as_str)
                .is_some_and(|a| a.eq_ignore_ascii_case(address))
        })
        .ok_or_else(|| format!("gpu list has no GPU at {address}"))
}

/// Compares one listed GPU with the state the kernel's view implies.
fn compare_gpu(g: &Value, f: &PciFunction, all: &[PciFunction]) -> Result<String, String> {
    let name = str_field(g, "name", &f.address)?;
    let state = str_field(g, "state", &f.address)?;
    let reason = g.get("stateReason").and_then(Value::as_str).unwrap_or("");
    let group = g.get("iommuGroup").and_then(Value::as_u64);
    ensure(group == f.group.map(u64::from), || {
        format!(
            "{name} {}: iommuGroup {group:?}, kernel says {:?}",
            f.address, f.group
        )
    })?;
    let who = format!(
        "{name} {} (group {})",
        f.address,
        f.group.map_or("-".into(), |g| g.to_string())
    );
    match sys::expected_state(f, all) {
        ExpectedState::Free => ensure(state == "free", || {
            format!("{who}: state {state} ({reason}), expected free")
        })?,
        ExpectedState::InUse => ensure(state == "in-use", || {
            format!("{who}: state {state}, expected in-use")
        })?,
        // The lab knows there is no IOMMU: the reason must say so, not blame the device.
        ExpectedState::NoIommu => ensure(
            state == "blocked" && reason.to_lowercase().contains("iommu disabled"),
            || format!("{who}: state {state} ({reason:?}), expected blocked: IOMMU disabled"),
        )?,
        ExpectedState::SharedGroup(offenders) => {
            // The reason must name the endpoints of other kinds (the NIC), and at least one offender.
            let others: Vec<&String> = offenders
                .iter()
                .filter(|o| all.iter().any(|x| &x.address == *o && !x.is_display()))
                .collect();
            let names_one = offenders.iter().any(|o| reason.contains(o.as_str()));
            let names_others = others.iter().all(|o| reason.contains(o.as_str()));
            ensure(state == "blocked" && names_one && names_others, || {
                format!("{who}: state {state} ({reason:?}), expected blocked naming {offenders:?}")
            })?;
        }
    }
    Ok(format!("{name}={state}"))
}

/// `gpu list` finds every display device with the kernel's IOMMU group and the right state.
pub fn gpu_list(lab: &mut Lab) -> Outcome {
    let all = sys::pci_functions()?;
    let gpus = listed_gpus()?;
    let displays: Vec<&PciFunction> = all.iter().filter(|f| f.is_display()).collect();
    ensure(gpus.len() == displays.len(), || {
        let listed: Vec<&str> = gpus
            .iter()
            .filter_map(|g| g.get("address").and_then(Value::as_str))
            .collect();
        format!(
            "gpu list shows {} GPUs {listed:?}; the kernel has {} display devices",
            gpus.len(),
            displays.len()
        )
    })?;
    let mut seen = Vec::new();
    for f in &displays {
        seen.push(compare_gpu(find_gpu(&gpus, &f.address)?, f, &all)?);
    }
    if lab.iommu {
        // The lab's wiring must really produce both cases, or the check proves nothing.
        let blocked = seen.iter().filter(|s| s.ends_with("=blocked")).count();
        let free = seen.iter().filter(|s| s.ends_with("=free")).count();
        ensure(blocked >= 1 && free >= 1, || {
            format!("expected blocked and free GPUs, got {seen:?}")
        })?;
    }
    Ok(seen.join(" "))
}

/// `mediatedDevices.parents` of a topology.
fn parents(topology: &Value) -> Result<&[Value], String> {
    let md = topology
        .get("mediatedDevices")
        .ok_or("topology has no mediatedDevices")?;
    array_field(md, "parents", "mediatedDevices")
}

/// Compares the topology's mdev parents, profiles, counts and instances with the kernel's.
fn compare_topology(topology: &Value) -> Result<String, String> {
    let kernel = sys::mdev_types()?;
    let instances = sys::mdev_instances()?;
    let listed = parents(topology)?;
    let mut summary = Vec::new();
    for (parent, types) in &kernel {
        let p = listed
            .iter()
            .find(|p| p.get("id").and_then(Value::as_str) == Some(parent.as_str()))
            .ok_or_else(|| format!("topology has no parent {parent}"))?;
        let profiles = array_field(p, "profiles", parent)?;
        ensure(profiles.len() == types.len(), || {
            format!(
                "{parent}: {} profiles listed, the kernel has {} types",
                profiles.len(),
                types.len()
            )
        })?;
        for (tid, t) in types {
            let prof = profiles
                .iter()
                .find(|x| x.get("id").and_then(Value::as_str) == Some(tid.as_str()))
                .ok_or_else(|| format!("{parent}: no profile {tid}"))?;
            let name = str_field(prof, "name", tid)?;
            let avail = prof.get("availableInstances").and_then(Value::as_u64);
            ensure(name == t.name, || {
                format!("{parent}/{tid}: name {name:?}, kernel says {:?}", t.name)
            })?;
            ensure(avail == Some(u64::from(t.available)), || {
                format!(
                    "{parent}/{tid}: availableInstances {avail:?}, kernel says {}",
                    t.available
                )
            })?;
        }
        let want: BTreeSet<(String, String)> = instances
            .iter()
            .filter(|(_, i)| &i.parent == parent)
            .map(|(u, i)| (u.clone(), i.type_id.clone()))
            .collect();
        let have: BTreeSet<(String, String)> = array_field(p, "instances", parent)?
            .iter()
            .map(|i| {
                (
                    i.get("uuid")
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                        .to_lowercase(),
                    i.get("profile")
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                        .to_owned(),
                )
            })
            .collect();
        ensure(want == have, || {
            format!("{parent}: instances {have:?}, kernel has {want:?}")
        })?;
        summary.push(format!(
            "{parent}[{}]{}",
            types
                .iter()
                .map(|(t, v)| format!("{t}={}", v.available))
                .collect::<Vec<_>>()
                .join(" "),
            if want.is_empty() {
                String::new()
            } else {
                format!(" +{} instances", want.len())
            }
        ));
    }
    Ok(summary.join("; "))
}

/// Runs `gpuslice --root ROOT ARGS...`, killed after `limit` seconds: a hang is a failure, not
/// a stalled lab.
fn run_rooted(root: &Path, args: &[&str], limit: u64) -> Result<cli::Run, String> {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let mut child = Command::new(cli::GPUSLICE)
        .arg("--root")
        .arg(root)
        .args(["--node", cli::NODE])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", cli::GPUSLICE))?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() > Duration::from_secs(limit) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "`gpuslice --root {} {}` still running after {limit} s",
                    root.display(),
                    args.join(" ")
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("waiting for gpuslice: {e}")),
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("reading gpuslice's output: {e}"))?;
    Ok(cli::Run {
        args: args.join(" "),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// A tree on the guest's tmpfs whose mdev entry links outside it, and whose GPU `class` is a
/// FIFO: `vgpu remove` writes nothing outside, `topology` finishes and names the FIFO.
pub fn hostile_root(_lab: &mut Lab) -> Outcome {
    const UUID: &str = "5e2b0c1a-0000-4000-8000-000000000001";
    let base = if Path::new("/dev/shm").is_dir() {
        Path::new("/dev/shm/gpuslice-hostile")
    } else {
        Path::new("/tmp/gpuslice-hostile")
    };
    let _ = fs::remove_dir_all(base);
    let root = base.join("root");
    let dev = root.join("sys/devices/pci0000:00/0000:41:00.0");
    let io = |e: std::io::Error| format!("building {}: {e}", base.display());
    fs::create_dir_all(base.join("outside")).map_err(io)?;
    fs::write(base.join("outside/remove"), "victim\n").map_err(io)?;
    fs::create_dir_all(&dev).map_err(io)?;
    fs::create_dir_all(root.join("sys/bus/pci/devices")).map_err(io)?;
    fs::create_dir_all(root.join("sys/bus/mdev/devices")).map_err(io)?;
    fs::write(dev.join("vendor"), "0x10de\n").map_err(io)?;
    fs::write(dev.join("device"), "0x1eb8\n").map_err(io)?;
    std::os::unix::fs::symlink(
        "../../../devices/pci0000:00/0000:41:00.0",
        root.join("sys/bus/pci/devices/0000:41:00.0"),
    )
    .map_err(io)?;
    std::os::unix::fs::symlink(
        "../../../../../outside",
        root.join(format!("sys/bus/mdev/devices/{UUID}")),
    )
    .map_err(io)?;
    // The guest has no mkfifo binary: make the FIFO with the system call.
    nix::unistd::mkfifo(
        &dev.join("class"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .map_err(|e| format!("cannot make a FIFO: {e}"))?;

    let _ = run_rooted(&root, &["vgpu", "remove", "--force", UUID], 30)?;
    let outside = fs::read_to_string(base.join("outside/remove")).map_err(io)?;
    ensure(outside == "victim\n", || {
        format!("vgpu remove wrote {outside:?} outside the root")
    })?;
    let t = run_rooted(&root, &["topology"], 30)?;
    ensure(t.code == Some(0), || format!("topology: {}", t.describe()))?;
    ensure(t.stderr.contains("is a FIFO"), || {
        format!("topology did not warn about the FIFO: {:?}", t.stderr)
    })?;
    let _ = fs::remove_dir_all(base);
    Ok("outside file untouched by vgpu remove; topology finished and named the FIFO".to_owned())
}

/// `topology` lists mbochs, mdpy and mtty with the kernel's types, names and counts.
pub fn topology(_lab: &mut Lab) -> Outcome {
    let t = cli::json(&["topology"])?;
    compare_topology(&t)
}

/// The `kind` and `errnoName` of the machine-readable error `gpuslice -o json vgpu create` prints
/// on stderr when the create fails.
fn create_error_kind(parent: &str, profile: &str, uuid: &str) -> Result<(String, String), String> {
    let r = cli::run(&[
        "-o",
        "json",
        "vgpu",
        "create",
        "--parent",
        parent,
        "--profile",
        profile,
        "--uuid",
        uuid,
    ])?;
    ensure(r.code == Some(2), || {
        format!("expected exit 2: {}", r.describe())
    })?;
    let v: Value = serde_json::from_str(r.stderr.trim())
        .map_err(|e| format!("stderr is not a JSON error ({e}): {}", r.describe()))?;
    let field = |k: &str| v["error"][k].as_str().unwrap_or("").to_owned();
    Ok((field("kind"), field("errnoName")))
}

fn create(parent: &str, profile: &str, uuid: &str) -> Result<cli::Run, String> {
    cli::run(&[
        "vgpu",
        "create",
        "--parent",
        parent,
        "--profile",
        profile,
        "--uuid",
        uuid,
    ])
}

/// `vgpu create` on each sample parent changes every type's count exactly as the kernel does.
pub fn vgpu_create(lab: &mut Lab) -> Outcome {
    let mut changes = Vec::new();
    for (parent, profile) in SAMPLE_PARENTS {
        let before = sys::counts(&sys::mdev_types()?);
        let uuid = sys::new_uuid()?;
        create(parent, profile, &uuid)?.success()?;
        let inst = sys::mdev_instances()?;
        let i = inst
            .get(&uuid)
            .ok_or_else(|| format!("after create, the kernel has no mdev {uuid}"))?;
        ensure(i.parent == parent && i.type_id == profile, || {
            format!(
                "{uuid} is {}/{} in the kernel, asked for {parent}/{profile}",
                i.parent, i.type_id
            )
        })?;
        lab.created.push(uuid.clone());
        if parent == "mbochs" {
            lab.small = Some(uuid.clone());
        }
        let after = sys::counts(&sys::mdev_types()?);
        ensure(before != after, || {
            format!("creating {profile} changed no count")
        })?;
        changes.push(format!("+{profile}: {}", fmt_counts(&after, parent)));
    }
    let t = cli::json(&["topology"])?;
    compare_topology(&t).map_err(|e| format!("after creating: {e}"))?;
    let listed = cli::run(&["vgpu", "list", "-o", "json"])?.success()?;
    for u in &lab.created {
        ensure(listed.stdout.contains(u.as_str()), || {
            format!("`vgpu list` does not show {u}")
        })?;
    }
    Ok(changes.join("; "))
}

/// Without an IOMMU, the mdevs that exist bring VFIO's emulated IOMMU groups
/// (`/sys/kernel/iommu_groups/0`, named `vfio-noiommu`): the GPUs must still be reported blocked
/// because the IOMMU is disabled.
pub fn gpu_list_with_mdevs(lab: &mut Lab) -> Outcome {
    ensure(!lab.created.is_empty(), || {
        "vgpu-create-counts left no instances".into()
    })?;
    let groups = sys::list(format!("{}/kernel/iommu_groups", sys::SYS));
    let listed = gpu_list(lab)?;
    Ok(format!(
        "with {} mdevs and groups {groups:?}: {listed}",
        lab.created.len()
    ))
}

/// Creating an existing instance again with the same type succeeds and changes nothing.
pub fn vgpu_create_again(lab: &mut Lab) -> Outcome {
    let u = lab
        .small
        .clone()
        .ok_or("no instance from vgpu-create to re-create")?;
    let before = sys::mdev_instances()?;
    create("mbochs", "mbochs-small", &u)?.success()?;
    let after = sys::mdev_instances()?;
    ensure(before == after, || {
        "re-creating an existing instance changed the kernel's instances".into()
    })?;
    Ok(format!("{u} kept (same sysfs inode)"))
}

/// A UUID that exists (on any parent) is refused with the typed "exists" error.
pub fn vgpu_create_duplicate(lab: &mut Lab) -> Outcome {
    let u = lab
        .small
        .clone()
        .ok_or("no instance from vgpu-create to duplicate")?;
    let before = sys::counts(&sys::mdev_types()?);
    let mut seen = Vec::new();
    for (parent, profile) in [("mbochs", "mbochs-medium"), ("mtty", "mtty-1")] {
        let r = create(parent, profile, &u)?;
        ensure(r.code != Some(0), || {
            format!("{parent}/{profile} with existing {u} succeeded")
        })?;
        ensure(r.stderr.to_lowercase().contains("exist"), || {
            format!(
                "duplicate on {parent}/{profile} is not the \"exists\" error: {}",
                r.describe()
            )
        })?;
        seen.push(r.stderr.trim().lines().next().unwrap_or("").to_owned());
        let (kind, _) = create_error_kind(parent, profile, &u)?;
        ensure(kind == "exists-other-type", || {
            format!(
                "duplicate on {parent}/{profile}: error kind {kind:?}, expected \"exists-other-type\""
            )
        })?;
    }
    ensure(before == sys::counts(&sys::mdev_types()?), || {
        "a refused create changed the counts".into()
    })?;
    Ok(seen.join(" | "))
}

fn write_file(path: &str, text: &str) -> Result<(), String> {
    fs::write(path, text).map_err(|e| format!("write {path}: {e}"))
}

/// The `devices` of a placement result (the allocation itself, or wrapped in `allocation`).
fn allocated_devices(v: &Value) -> Result<Vec<Value>, String> {
    let alloc = v.get("allocation").unwrap_or(v);
    let devices = array_field(alloc, "devices", "place output")?;
    ensure(!devices.is_empty(), || {
        format!("place printed no devices: {v}")
    })?;
    Ok(devices.to_vec())
}

/// The scheduler refuses 4 × mbochs-large after one small instance with the numbers; placing 3 is
/// accepted, and actuating that placement and rediscovering agree.
pub fn place_actuate_rediscover(lab: &mut Lab) -> Outcome {
    ensure(lab.small.is_some(), || {
        "vgpu-create made no mbochs-small instance".into()
    })?;
    let topo = cli::json(&["topology"])?;
    let fleet = serde_json::json!({ "nodes": [topo], "allocations": [] });
    write_file(FLEET, &fleet.to_string())?;

    write_file(
        MACHINE,
        "name: lab-vm\ndevices:\n  - {name: gpu, class: gpu, profile: mbochs-large, count: 4}\n",
    )?;
    let refused = cli::run(&["place", "--inventory", FLEET, "--machine", MACHINE])?;
    const WANT: &str = "needs 4 gpu profile mbochs-large, 3 free";
    ensure(
        refused.code == Some(3) && refused.stderr.contains(WANT),
        || {
            format!(
                "placing 4 x mbochs-large: expected exit 3 with {WANT:?}, got {}",
                refused.describe()
            )
        },
    )?;

    write_file(
        MACHINE,
        "name: lab-vm\ndevices:\n  - {name: gpu, class: gpu, profile: mbochs-large, count: 3}\n",
    )?;
    let placed = cli::json(&["place", "--inventory", FLEET, "--machine", MACHINE])?;
    let devices = allocated_devices(&placed)?;
    ensure(devices.len() == 3, || {
        format!("placing 3 x mbochs-large gave {} devices", devices.len())
    })?;
    let mut uuids = Vec::new();
    for d in &devices {
        let parent = str_field(d, "parent", "allocated device")?;
        let profile = str_field(d, "profile", "allocated device")?;
        let uuid = str_field(d, "uuid", "allocated device")?.to_lowercase();
        ensure(parent == "mbochs" && profile == "mbochs-large", || {
            format!("allocated {parent}/{profile}, expected mbochs/mbochs-large")
        })?;
        create(parent, profile, &uuid)?.success()?;
        lab.created.push(uuid.clone());
        uuids.push(uuid);
    }
    let inst = sys::mdev_instances()?;
    for u in &uuids {
        ensure(
            inst.get(u).is_some_and(|i| i.type_id == "mbochs-large"),
            || format!("the kernel has no mbochs-large {u} after actuation"),
        )?;
    }
    let counts = sys::counts(&sys::mdev_types()?);
    ensure(counts.get("mbochs/mbochs-large") == Some(&0), || {
        format!(
            "after 3 large + 1 small the kernel shows {}",
            fmt_counts(&counts, "mbochs")
        )
    })?;
    let again = cli::json(&["topology"])?;
    compare_topology(&again).map_err(|e| format!("rediscovery after actuation: {e}"))?;
    Ok(format!(
        "refused 4 with {WANT:?}; placed and created 3; now {}",
        fmt_counts(&counts, "mbochs")
    ))
}

/// A create past the pool returns the typed "exhausted" error and leaves nothing behind.
pub fn vgpu_create_exhausted(lab: &mut Lab) -> Outcome {
    let types = sys::mdev_types()?;
    let large = types
        .get("mbochs")
        .and_then(|t| t.get("mbochs-large"))
        .ok_or("no mbochs-large type")?;
    // Fill what is left of the pool through gpuslice, so this check does not depend on others.
    for _ in 0..large.available {
        let u = sys::new_uuid()?;
        create("mbochs", "mbochs-large", &u)?.success()?;
        lab.created.push(u);
    }
    let types = sys::mdev_types()?;
    let before = sys::counts(&types);
    ensure(before.get("mbochs/mbochs-large") == Some(&0), || {
        format!(
            "mbochs-large not full after filling: {}",
            fmt_counts(&before, "mbochs")
        )
    })?;
    let uuid = sys::new_uuid()?;
    let r = create("mbochs", "mbochs-large", &uuid)?;
    ensure(r.code != Some(0), || {
        "a create past the pool succeeded".into()
    })?;
    // gpu-sysfs's `Exhausted` error reads "no capacity left for this type (ENOSPC)".
    let err = r.stderr.to_lowercase();
    ensure(
        (err.contains("exhausted") || err.contains("no capacity left")) && err.contains("enospc"),
        || format!("not the \"exhausted\" error for ENOSPC: {}", r.describe()),
    )?;
    let (kind, errno) = create_error_kind("mbochs", "mbochs-large", &uuid)?;
    ensure(kind == "exhausted" && errno == "ENOSPC", || {
        format!(
            "typed error of a create past the pool: kind {kind:?} errno {errno:?}, expected \"exhausted\" ENOSPC"
        )
    })?;
    ensure(!sys::mdev_instances()?.contains_key(&uuid), || {
        format!("the failed create left {uuid} behind")
    })?;
    ensure(before == sys::counts(&sys::mdev_types()?), || {
        "the failed create changed the counts".into()
    })?;
    Ok(r.stderr.trim().lines().next().unwrap_or("").to_owned())
}

/// `vgpu remove` of every instance the checks created restores the initial counts.
pub fn vgpu_remove(lab: &mut Lab) -> Outcome {
    ensure(!lab.created.is_empty(), || "no instances to remove".into())?;
    let n = lab.created.len();
    for u in std::mem::take(&mut lab.created) {
        cli::run(&["vgpu", "remove", &u])?.success()?;
        ensure(!sys::mdev_instances()?.contains_key(&u), || {
            format!("{u} still exists after remove")
        })?;
    }
    let counts = sys::counts(&sys::mdev_types()?);
    ensure(counts == lab.initial_counts, || {
        format!("counts {counts:?}, initially {:?}", lab.initial_counts)
    })?;
    compare_topology(&cli::json(&["topology"])?).map_err(|e| format!("after remove: {e}"))?;
    Ok(format!("removed {n}; counts back to the initial ones"))
}

pub fn pick(all: &[PciFunction], want: impl Fn(&ExpectedState) -> bool) -> Option<PciFunction> {
    let mut candidates: Vec<&PciFunction> = all
        .iter()
        .filter(|f| f.is_display() && want(&sys::expected_state(f, all)))
        .collect();
    // Prefer a device off the root bus: the one behind the PCIe root port in the lab.
    candidates.sort_by_key(|f| f.address.starts_with("0000:00:"));
    candidates.first().map(|f| (*f).clone())
}

fn gpu_state(address: &str) -> Result<String, String> {
    let gpus = listed_gpus()?;
    Ok(str_field(find_gpu(&gpus, address)?, "state", address)?.to_owned())
}

/// `gpu bind` moves a free display device to vfio-pci, then `gpu release` returns it.
pub fn gpu_bind_release(_lab: &mut Lab) -> Outcome {
    let all = sys::pci_functions()?;
    let f = pick(&all, |s| *s == ExpectedState::Free).ok_or("no free display device")?;
    let host_driver = f
        .driver
        .clone()
        .ok_or_else(|| format!("{} has no host driver", f.address))?;
    let group = f
        .group
        .ok_or_else(|| format!("{} has no IOMMU group", f.address))?;

    cli::run(&["gpu", "bind", &f.address])?.success()?;
    sys::bound_to(&f.address, "vfio-pci", "bind")?;
    ensure(Path::new(&format!("/dev/vfio/{group}")).exists(), || {
        format!("no /dev/vfio/{group} after bind")
    })?;
    let state = gpu_state(&f.address)?;
    ensure(state == "in-use", || {
        format!("gpu list says {state} for the bound {}", f.address)
    })?;

    cli::run(&["gpu", "release", &f.address])?.success()?;
    let back = sys::bound_to(&f.address, &host_driver, "release")?;
    ensure(back.driver_override == "(null)", || {
        format!(
            "after release driver_override is {:?}",
            back.driver_override
        )
    })?;
    let state = gpu_state(&f.address)?;
    ensure(state == "free", || {
        format!("gpu list says {state} after release")
    })?;
    Ok(format!(
        "{} {host_driver} -> vfio-pci (group {group}) -> {host_driver}",
        f.address
    ))
}

/// Binding a GPU that cannot go to a VM is refused and changes nothing.
pub fn gpu_bind_refused(lab: &mut Lab) -> Outcome {
    let all = sys::pci_functions()?;
    let f = if lab.iommu {
        pick(&all, |s| matches!(s, ExpectedState::SharedGroup(_)))
            .ok_or("no display device in a shared group")?
    } else {
        pick(&all, |s| *s == ExpectedState::NoIommu).ok_or("no display device without a group")?
    };
    let r = cli::run(&["gpu", "bind", &f.address])?;
    ensure(r.code != Some(0), || {
        format!("binding {} succeeded", f.address)
    })?;
    if let ExpectedState::SharedGroup(offenders) = sys::expected_state(&f, &all) {
        let nic: Vec<&String> = offenders
            .iter()
            .filter(|o| all.iter().any(|x| &x.address == *o && !x.is_display()))
            .collect();
        ensure(nic.iter().all(|o| r.stderr.contains(o.as_str())), || {
            format!("the refusal does not name {nic:?}: {}", r.describe())
        })?;
    } else {
        ensure(r.stderr.to_lowercase().contains("iommu"), || {
            format!("the refusal does not mention the IOMMU: {}", r.describe())
        })?;
    }
    let after = sys::pci_functions()?;
    for (a, b) in all.iter().zip(&after) {
        ensure(
            a.driver == b.driver && a.driver_override == b.driver_override,
            || format!("{} changed: {:?} -> {:?}", a.address, a.driver, b.driver),
        )?;
    }
    Ok(format!(
        "{}: {}",
        f.address,
        r.stderr.trim().lines().next().unwrap_or("")
    ))
}

/// The layout the declarative checks apply: a per-parent entry for mbochs.
const LAYOUT_TEXT: &str = "version: v1
vgpu-configs:
  lab:
    mbochs:
      mbochs-medium: 2
      mbochs-small: 3
";

fn layout_instances() -> Result<BTreeMap<String, sys::MdevInstance>, String> {
    Ok(sys::mdev_instances()?
        .into_iter()
        .filter(|(_, i)| i.parent == "mbochs")
        .collect())
}

/// `vgpu apply` of an mbochs layout creates it, `assert` exits 0, a second `apply` writes nothing
/// (same instances, same sysfs inodes, same counts), `clear` removes it.
pub fn vgpu_apply_assert_clear(lab: &mut Lab) -> Outcome {
    write_file(LAYOUT, LAYOUT_TEXT)?;
    ensure(layout_instances()?.is_empty(), || {
        "mbochs has instances before apply".into()
    })?;
    cli::run(&["vgpu", "apply", "-f", LAYOUT, "-c", "lab"])?.success()?;
    let applied = layout_instances()?;
    let per_type = |m: &BTreeMap<String, sys::MdevInstance>, t: &str| {
        m.values().filter(|i| i.type_id == t).count()
    };
    ensure(
        per_type(&applied, "mbochs-medium") == 2
            && per_type(&applied, "mbochs-small") == 3
            && applied.len() == 5,
        || {
            let got: Vec<&str> = applied.values().map(|i| i.type_id.as_str()).collect();
            format!("after apply mbochs holds {got:?}")
        },
    )?;
    let counts = sys::counts(&sys::mdev_types()?);

    let asserted = cli::run(&["vgpu", "assert", "-f", LAYOUT, "-c", "lab"])?;
    ensure(asserted.code == Some(0), || {
        format!("assert after apply: {}", asserted.describe())
    })?;

    cli::run(&["vgpu", "apply", "-f", LAYOUT, "-c", "lab"])?.success()?;
    ensure(layout_instances()? == applied, || {
        "the second apply removed or re-created instances".into()
    })?;
    ensure(counts == sys::counts(&sys::mdev_types()?), || {
        "the second apply changed the counts".into()
    })?;

    cli::run(&["vgpu", "clear", "-f", LAYOUT, "-c", "lab"])?.success()?;
    ensure(layout_instances()?.is_empty(), || {
        "instances left after clear".into()
    })?;
    let back = sys::counts(&sys::mdev_types()?);
    ensure(back == lab.initial_counts, || {
        format!(
            "counts after clear {back:?}, initially {:?}",
            lab.initial_counts
        )
    })?;
    let unapplied = cli::run(&["vgpu", "assert", "-f", LAYOUT, "-c", "lab"])?;
    ensure(unapplied.code == Some(1), || {
        format!("assert after clear should exit 1: {}", unapplied.describe())
    })?;
    Ok(format!(
        "applied 2 medium + 3 small ({}); second apply kept all 5; cleared",
        fmt_counts(&counts, "mbochs")
    ))
}

/// Puts the guest back to a known state between groups of checks, straight through sysfs, so one
/// failed check does not cascade: removes every mdev and returns vfio-pci-bound display devices to
/// their host drivers. Returns what it had to undo.
pub fn reset(lab: &mut Lab) -> Vec<String> {
    let mut undone = Vec::new();
    lab.created.clear();
    lab.small = None;
    if let Ok(instances) = sys::mdev_instances() {
        for u in instances.keys() {
            match sys::write(format!("{}/bus/mdev/devices/{u}/remove", sys::SYS), "1") {
                Ok(()) => undone.push(format!("removed {u}")),
                Err(e) => undone.push(e),
            }
        }
    }
    for f in sys::pci_functions().unwrap_or_default() {
        if f.driver_override == "(null)" && f.driver.as_deref() != Some("vfio-pci") {
            continue;
        }
        let dev = format!("{}/bus/pci/devices/{}", sys::SYS, f.address);
        let mut steps = vec![sys::write(format!("{dev}/driver_override"), "\n")];
        if f.driver.is_some() {
            steps.push(sys::write(format!("{dev}/driver/unbind"), &f.address));
        }
        steps.push(sys::write(
            format!("{}/bus/pci/drivers_probe", sys::SYS),
            &f.address,
        ));
        undone.push(format!("returned {} to its host driver", f.address));
        undone.extend(steps.into_iter().filter_map(Result::err));
    }
    undone
}

/// The `doctor -o json` answer: its checks and exit code (1 when a check fails).
fn doctor() -> Result<(Vec<Value>, Option<i32>), String> {
    let r = cli::run(&["doctor", "-o", "json"])?;
    let v = r.json()?;
    let checks = array_field(&v, "checks", "doctor")?.to_vec();
    let failed = checks
        .iter()
        .any(|c| c.get("verdict").and_then(Value::as_str) == Some("fail"));
    let expected = if failed { 1 } else { 0 };
    ensure(r.code == Some(expected), || {
        format!("{} (expected exit {expected})", r.describe())
    })?;
    Ok((checks, r.code))
}

/// The first check named `name` (a node-wide one).
fn doctor_check<'a>(checks: &'a [Value], name: &str) -> Result<&'a Value, String> {
    checks
        .iter()
        .find(|c| c.get("check").and_then(Value::as_str) == Some(name))
        .ok_or_else(|| format!("doctor has no {name} check"))
}

fn verdict_of(c: &Value) -> &str {
    c.get("verdict").and_then(Value::as_str).unwrap_or("?")
}

fn message_of(c: &Value) -> &str {
    c.get("message").and_then(Value::as_str).unwrap_or("")
}

/// `doctor` on the real kernel: its IOMMU verdict matches `/proc/cmdline` and `/sys/class/iommu`,
/// vfio-pci (loaded by the lab) is found, and the exit code is 1 exactly when a check fails.
pub fn doctor_kernel(lab: &mut Lab) -> Outcome {
    let cmdline = sys::read("/proc/cmdline")?;
    let units = sys::list(format!("{}/class/iommu", sys::SYS));
    let (checks, code) = doctor()?;
    let iommu = doctor_check(&checks, "iommu")?;
    if lab.iommu {
        ensure(!units.is_empty(), || {
            "booted with intel-iommu but /sys/class/iommu is empty".into()
        })?;
        ensure(verdict_of(iommu) == "ok", || {
            format!("iommu: {iommu}, expected ok")
        })?;
        for u in &units {
            ensure(message_of(iommu).contains(u.as_str()), || {
                format!("iommu: {iommu} does not name the kernel's unit {u}")
            })?;
        }
        let mode = doctor_check(&checks, "iommu-mode")?;
        let pt = cmdline.split_whitespace().any(|w| w == "iommu=pt");
        let want = if pt { "passthrough" } else { "translated" };
        ensure(message_of(mode).contains(want), || {
            format!("iommu-mode: {mode}; /proc/cmdline is {cmdline:?}, expected {want}")
        })?;
    } else {
        ensure(units.is_empty(), || {
            format!("booted without an IOMMU but /sys/class/iommu has {units:?}")
        })?;
        ensure(
            verdict_of(iommu) == "fail" && message_of(iommu).starts_with("IOMMU off"),
            || format!("iommu: {iommu}, expected fail (IOMMU off)"),
        )?;
        ensure(code == Some(1), || "a failed check must exit 1".into())?;
    }
    let vfio = doctor_check(&checks, "vfio-pci")?;
    ensure(verdict_of(vfio) == "ok", || {
        format!("vfio-pci: {vfio}, but the lab loaded vfio_pci")
    })?;
    for c in &checks {
        let fix = c.get("fix").and_then(Value::as_str);
        ensure(
            verdict_of(c) == "ok" || fix.is_some_and(|f| !f.is_empty()),
            || format!("{c} has no fix"),
        )?;
    }
    Ok(format!(
        "{}: {}; {} checks, exit {code:?}",
        verdict_of(iommu),
        message_of(iommu),
        checks.len()
    ))
}
