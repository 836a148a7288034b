//! The sandbox host: a writable copy of a host in a directory, with the fake kernel
//! ([`crate::testing::FakeKernel`]) reacting to every write as the real kernel does, kept
//! between processes. A root written `sandbox:DIR` opens one ([`crate::open_root`]), so every
//! command and the agent can be tried on a laptop without touching the machine.
//!
//! `DIR` holds:
//! - `host/`, the tree standing for `/` (what the fake kernel changes);
//! - `sandbox.json`, what the tree alone does not say: the pools the fake kernel counts
//!   (inferred from the tree when the sandbox is made: an NVIDIA GPU's mdev parents share its
//!   framebuffer, a vendor-VFIO GPU's VFs share the types they list, the kernel's sample drivers
//!   their documented pools) and each device's host driver (what `drivers_probe` binds after
//!   vfio-pci lets it go);
//! - `sandbox.lock`, taken for every write, so that two processes (the agent and a command)
//!   react one at a time, as the kernel does.
//!
//! `DIR` is the operator's; what is in it is not trusted. `sandbox.json` is read with the
//! document cap ([`crate::DocumentLimit`]), only when it is a regular file (a FIFO there is
//! refused without being opened), and every field that becomes a path or an address is checked
//! when the sandbox is opened (parents, type directories and drivers are plain names, host
//! drivers' keys are PCI addresses), naming the field that is wrong. `sandbox.json` and
//! `sandbox.lock` are written and opened through the one confined writer ([`crate::atomic`]):
//! never through a link, only regular files; `host` must be a directory of `DIR`, not a link.
//!
//! Everything the kernel would do to the machine happens inside `host/`: `sriov-manage` is
//! emulated and no other program runs.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpu_core::PciAddress;
use gpu_core::nvidia::{TypeDescription, VgpuTypeName};
use serde::{Deserialize, Serialize};

use crate::SysfsError;
use crate::atomic::Dir;
use crate::document::DocumentLimit;
use crate::host::{CommandOutput, Host, RealHost};
use crate::testing::fake_kernel::sample_pools;
use crate::testing::{FakeKernel, FakeMig, FakePool, TreeBuilder};

/// How a root names a sandbox: `sandbox:DIR`.
pub const PREFIX: &str = "sandbox:";
/// The tree standing for `/`, under the sandbox directory.
pub const HOST_DIR: &str = "host";
/// The sandbox's state file, under the sandbox directory.
pub const STATE_FILE: &str = "sandbox.json";
/// The lock taken for every write, under the sandbox directory.
pub const LOCK_FILE: &str = "sandbox.lock";
/// What `format` says in a state file this version writes and reads.
pub const FORMAT: &str = "gpuslice-sandbox/1";
/// How long a write waits for another process's write to the same sandbox.
pub const LOCK_WAIT: Duration = Duration::from_secs(10);

/// The directory a root names when it is written `sandbox:DIR`.
pub fn sandbox_dir(root: &Path) -> Option<&Path> {
    root.to_str()?.strip_prefix(PREFIX).map(Path::new)
}

/// What a sandbox keeps beside its tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxState {
    /// [`FORMAT`].
    pub format: String,
    /// What the sandbox was made from, as given.
    pub from: String,
    /// The pools the fake kernel counts.
    pub pools: Vec<FakePool>,
    /// Each PCI device's host driver (what `drivers_probe` binds it to without an override).
    pub host_drivers: BTreeMap<String, String>,
}

/// What [`init`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitReport {
    /// The sandbox directory.
    pub dir: PathBuf,
    /// Its state, as written.
    pub state: SandboxState,
}

fn err_at(path: &Path, e: io::Error) -> SysfsError {
    SysfsError::io(path.display().to_string(), e)
}

/// Makes a sandbox in `dir` (which must not exist or be empty) from `from`: a `*.umockdev`
/// recording, replayed, or a directory tree standing for `/`, copied (never the machine's own
/// `/`).
///
/// # Errors
/// [`SysfsError::InvalidRoot`] for a `dir` that holds files or a `from` that is the machine's
/// `/` or a file that is not a recording; the replay's errors for a malformed recording;
/// [`SysfsError::Io`] naming the path that could not be read or written.
pub fn init(dir: &Path, from: &Path) -> Result<InitReport, SysfsError> {
    init_labelled(dir, from, &from.display().to_string())
}

/// [`init`] from a recording's text (one a front-end carries inside itself), recorded in the
/// state file as `label`.
///
/// # Errors
/// As [`init`].
pub fn init_from_recording_text(
    dir: &Path,
    text: &[u8],
    label: &str,
) -> Result<InitReport, SysfsError> {
    let rec = crate::umockdev::parse(&String::from_utf8_lossy(text), label)?;
    make(dir, Source::Recording(rec, label.to_owned()), label)
}

/// What a sandbox's tree is made from: a recording (parsed, written straight into the
/// sandbox: no replay written elsewhere and copied) or a tree to copy.
enum Source {
    Recording(crate::umockdev::Recording, String),
    Tree(PathBuf),
}

fn init_labelled(dir: &Path, from: &Path, label: &str) -> Result<InitReport, SysfsError> {
    // The source is checked (and a recording parsed) before anything is made.
    let source = if crate::confine::is_recording(from) {
        let shown = from.display().to_string();
        let text = std::fs::read(from).map_err(|e| err_at(from, e))?;
        let rec = crate::umockdev::parse(&String::from_utf8_lossy(&text), &shown)?;
        Source::Recording(rec, shown)
    } else if from.is_file() {
        return Err(SysfsError::InvalidRoot {
            path: from.display().to_string(),
            why: "a file, but not a `*.umockdev` recording; give a recording or a directory tree"
                .to_owned(),
        });
    } else {
        let canon = from.canonicalize().map_err(|e| err_at(from, e))?;
        if canon == Path::new("/") {
            return Err(SysfsError::InvalidRoot {
                path: from.display().to_string(),
                why: "the machine's own `/`; a sandbox is made from a recording or a copied tree"
                    .to_owned(),
            });
        }
        let tree = sandbox_tree(&canon).unwrap_or(canon);
        if !tree.join("sys").is_dir() {
            return Err(SysfsError::InvalidRoot {
                path: from.display().to_string(),
                why: "no `sys` directory; give a directory standing for a host's `/`".to_owned(),
            });
        }
        Source::Tree(tree)
    };
    make(dir, source, label)
}

fn make(dir: &Path, source: Source, label: &str) -> Result<InitReport, SysfsError> {
    let shown = dir.display().to_string();
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(SysfsError::InvalidRoot {
                    path: shown,
                    why: "not empty; a sandbox is made in a new or empty directory".to_owned(),
                });
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(|e| err_at(dir, e))?;
        }
        Err(e) => return Err(err_at(dir, e)),
    }
    let host_dir = dir.join(HOST_DIR);
    match source {
        Source::Recording(rec, shown) => {
            std::fs::create_dir_all(&host_dir).map_err(|e| err_at(&host_dir, e))?;
            rec.write_tree(&host_dir, &shown)?;
        }
        Source::Tree(tree) => copy_tree(&tree, &host_dir)?,
    }
    let fs = RealHost::new(&host_dir).map_err(|e| err_at(&host_dir, e))?;
    add_write_only_files(&fs, &host_dir)?;
    let pools = infer_pools(&fs);
    let kernel = open_kernel(&host_dir, &pools, &BTreeMap::new())?;
    let state = SandboxState {
        format: FORMAT.to_owned(),
        from: label.to_owned(),
        pools,
        host_drivers: drivers_as_text(&kernel.host_drivers()),
    };
    write_state(dir, &state)?;
    Ok(InitReport {
        dir: dir.to_path_buf(),
        state,
    })
}

/// The tree of a sandbox directory given as a source (`--from DIR` of another sandbox).
fn sandbox_tree(dir: &Path) -> Option<PathBuf> {
    (dir.join(STATE_FILE).is_file() && dir.join(HOST_DIR).is_dir()).then(|| dir.join(HOST_DIR))
}

/// Copies a tree: directories, regular files and symlinks as they are (targets unchanged), and
/// nothing else (a FIFO or device node in the source is left out).
fn copy_tree(from: &Path, to: &Path) -> Result<(), SysfsError> {
    std::fs::create_dir_all(to).map_err(|e| err_at(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| err_at(from, e))? {
        let entry = entry.map_err(|e| err_at(from, e))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let ft = entry.file_type().map_err(|e| err_at(&src, e))?;
        if ft.is_symlink() {
            let target = std::fs::read_link(&src).map_err(|e| err_at(&src, e))?;
            std::os::unix::fs::symlink(target, &dst).map_err(|e| err_at(&dst, e))?;
        } else if ft.is_dir() {
            copy_tree(&src, &dst)?;
        } else if ft.is_file() {
            std::fs::copy(&src, &dst).map_err(|e| err_at(&src, e))?;
        }
    }
    Ok(())
}

fn link_name(fs: &RealHost, path: &str) -> Option<String> {
    fs.read_link(path)
        .ok()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

/// Adds the write-only attributes a recording leaves out (it records what can be read), so
/// that the fake kernel finds every file the real one has: each mdev type's `create`, each
/// instance's `remove`, each PCI driver's `bind` and `unbind`, `drivers_probe`, and each PCI
/// device's `driver_override`.
fn add_write_only_files(fs: &RealHost, host_dir: &Path) -> Result<(), SysfsError> {
    let mut wanted: Vec<(String, &str)> = vec![("sys/bus/pci/drivers_probe".to_owned(), "")];
    for p in fs.list("sys/class/mdev_bus").unwrap_or_default() {
        let Ok(pd) = fs.canonicalize(&format!("sys/class/mdev_bus/{p}")) else {
            continue;
        };
        for t in fs
            .list(&format!("{pd}/mdev_supported_types"))
            .unwrap_or_default()
        {
            wanted.push((format!("{pd}/mdev_supported_types/{t}/create"), ""));
        }
        for e in fs.list(&pd).unwrap_or_default() {
            if e.parse::<gpu_core::MdevUuid>().is_ok() {
                wanted.push((format!("{pd}/{e}/remove"), ""));
            }
        }
    }
    for d in fs.list("sys/bus/pci/drivers").unwrap_or_default() {
        for f in ["bind", "unbind"] {
            wanted.push((format!("sys/bus/pci/drivers/{d}/{f}"), ""));
        }
    }
    for d in fs.list("sys/bus/pci/devices").unwrap_or_default() {
        if let Ok(dir) = fs.canonicalize(&format!("sys/bus/pci/devices/{d}")) {
            wanted.push((format!("{dir}/driver_override"), "(null)\n"));
        }
    }
    for (rel, content) in wanted {
        let p = host_dir.join(&rel);
        if p.parent().is_some_and(Path::is_dir) && std::fs::symlink_metadata(&p).is_err() {
            std::fs::write(&p, content).map_err(|e| err_at(&p, e))?;
        }
    }
    Ok(())
}

/// The pools a tree implies: see the module documentation.
fn infer_pools(fs: &RealHost) -> Vec<FakePool> {
    let mut pools = Vec::new();
    // NVIDIA mdev: the parents of one physical GPU (itself, or its VFs) share its framebuffer.
    let mut by_gpu: BTreeMap<String, (Vec<String>, bool)> = BTreeMap::new();
    let mut samples = false;
    for p in fs.list("sys/class/mdev_bus").unwrap_or_default() {
        let base = format!("sys/class/mdev_bus/{p}");
        let nvidia = fs
            .list(&format!("{base}/mdev_supported_types"))
            .unwrap_or_default()
            .iter()
            .any(|t| {
                fs.read_string(&format!("{base}/mdev_supported_types/{t}/description"))
                    .ok()
                    .and_then(|d| TypeDescription::parse(&d).ok())
                    .is_some_and(|d| d.framebuffer_mib.is_some())
            });
        if nvidia {
            let pf = link_name(fs, &format!("{base}/physfn"));
            let vf = pf.is_some();
            let e = by_gpu
                .entry(pf.unwrap_or_else(|| p.clone()))
                .or_insert_with(|| (Vec::new(), vf));
            e.0.push(p);
        } else if matches!(p.as_str(), "mbochs" | "mtty" | "mdpy") {
            samples = true;
        }
    }
    for (_, (parents, vfs)) in by_gpu {
        // VFs made again by enabling SR-IOV offer what the driver registered on them before.
        let types = match parents.first() {
            Some(p) if vfs => nvidia_types(fs, p),
            _ => Vec::new(),
        };
        pools.push(FakePool::NvidiaMdev {
            parents,
            per_parent: vfs.then_some(1),
            types,
        });
    }
    if samples {
        pools.extend(sample_pools().into_iter().filter(|p| match p {
            FakePool::Units { parent, .. } => fs.exists(&format!("sys/class/mdev_bus/{parent}")),
            _ => false,
        }));
    }
    // Vendor-specific VFIO: the VFs of one PF share the types they list and the card's memory.
    let mut by_pf: BTreeMap<PciAddress, (BTreeMap<u32, String>, Vec<u32>)> = BTreeMap::new();
    for d in fs.list("sys/bus/pci/devices").unwrap_or_default() {
        let dir = format!("sys/bus/pci/devices/{d}");
        let Ok(listed) = fs.read_string(&format!("{dir}/nvidia/creatable_vgpu_types")) else {
            continue;
        };
        let Some(pf) = link_name(fs, &format!("{dir}/physfn")).and_then(|p| p.parse().ok()) else {
            continue;
        };
        let e = by_pf.entry(pf).or_default();
        for (id, name) in crate::actuate::vendor::parse_creatable(&listed) {
            e.0.insert(id, name);
        }
        let held: u32 = fs
            .read_string(&format!("{dir}/nvidia/current_vgpu_type"))
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if held != 0 {
            e.1.push(held);
        }
    }
    for (pf, (types, held)) in by_pf {
        let size = |id: &u32| {
            types
                .get(id)
                .and_then(|n| VgpuTypeName::parse(n).ok())
                .map(|n| n.framebuffer_mib())
        };
        let largest = types.keys().filter_map(size).max().unwrap_or(0);
        let used: u64 = held.iter().filter_map(size).sum();
        // With nothing held the largest listed type is the whole card; once types are held the
        // lists show only what still fits beside them, so at least one more of the largest.
        pools.push(FakePool::VendorVfio {
            pf,
            framebuffer_mib: used + largest,
            types: types.into_iter().collect(),
        });
    }
    pools
}

/// The types of mdev parent `p` as `(type directory, name, description)`.
fn nvidia_types(fs: &RealHost, p: &str) -> Vec<(String, String, Option<String>)> {
    let base = format!("sys/class/mdev_bus/{p}/mdev_supported_types");
    let mut out: Vec<_> = fs
        .list(&base)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|t| {
            let name = fs.read_string(&format!("{base}/{t}/name")).ok()?;
            let description = fs.read_string(&format!("{base}/{t}/description")).ok();
            Some((t, name, description))
        })
        .collect();
    out.sort();
    out
}

fn drivers_as_text(d: &BTreeMap<PciAddress, String>) -> BTreeMap<String, String> {
    d.iter().map(|(a, v)| (a.to_string(), v.clone())).collect()
}

fn open_kernel(
    host_dir: &Path,
    pools: &[FakePool],
    drivers: &BTreeMap<String, String>,
) -> Result<FakeKernel, SysfsError> {
    let tree = TreeBuilder::at(host_dir)
        .finish()
        .map_err(|e| err_at(host_dir, e))?;
    let mut k = FakeKernel::new(tree).map_err(|e| err_at(host_dir, e))?;
    for (bdf, drv) in drivers {
        k = k.with_host_driver(bdf, drv);
    }
    Ok(pools.iter().cloned().fold(k, FakeKernel::with_pool))
}

/// The MIG state of a GPU as the sandbox's saved NVML (`DIR/nvml.json`, written by gpu-node's
/// MIG writer) holds it, read each time the kernel asks: GPU instances made by `gpuslice mig
/// apply` in one process are what the VFs list in the next. `None` for a GPU the file does not
/// name (nothing changed its MIG state yet) or a file that does not read.
fn saved_mig(dir: PathBuf) -> impl Fn(&PciAddress) -> Option<FakeMig> + Send + Sync + 'static {
    move |pf| {
        let saved = gpu_nvml::fake::persist::load(&dir).ok()?;
        let g = saved.get(pf)?;
        Some(FakeMig {
            enabled: g.current == gpu_nvml::MigMode::Enabled,
            instances: g
                .instances
                .iter()
                .filter_map(|(_, _, slices, _, size)| {
                    Some((u8::try_from(*slices).ok()?, u8::try_from(*size).ok()?))
                })
                .collect(),
            mixed_size: g.vgpu_mode == Some(gpu_nvml::VgpuMode::Heterogeneous),
        })
    }
}

/// Writes the state file through the one confined writer: a temporary file created exclusively
/// under an unpredictable name beside it, moved into place; a link or non-regular file at
/// `sandbox.json` is refused, never written through.
fn write_state(dir: &Path, state: &SandboxState) -> Result<(), SysfsError> {
    let path = dir.join(STATE_FILE);
    let text = serde_json::to_string_pretty(state)
        .map_err(|e| err_at(&path, io::Error::other(e.to_string())))?;
    Dir::open(dir)
        .and_then(|d| d.write(STATE_FILE, format!("{text}\n").as_bytes()))
        .map_err(|e| err_at(&path, e))
}

/// Takes the write lock of the sandbox in `dir`, waiting at most [`LOCK_WAIT`] for another
/// process's write. The lock file is opened in `dir` never through a link and only when it is a
/// regular file, so taking it cannot create or block on anything outside the sandbox.
fn lock_dir(dir: &Path) -> io::Result<nix::fcntl::Flock<std::fs::File>> {
    use nix::fcntl::{Flock, FlockArg};
    let deadline = Instant::now() + LOCK_WAIT;
    let mut file = Dir::open(dir)?.open_lock(LOCK_FILE)?;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((f, nix::errno::Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                file = f;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err((_, e)) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "sandbox {}: another process holds {LOCK_FILE} ({e})",
                        dir.display()
                    ),
                ));
            }
        }
    }
}

/// A name from the state file that becomes a path component (a parent, a type directory, a
/// driver): one plain name, no `/`, `.` or `..`.
fn check_field_name(path: &Path, field: &str, value: &str) -> Result<(), SysfsError> {
    crate::atomic::check_name(value).map_err(|_| {
        SysfsError::malformed(
            path.display().to_string(),
            0,
            format!("{field}: {value:?} is not a plain name (no `/`, `.` or `..`); not used"),
        )
    })
}

/// The field of a state file that does not decode because an address in it does not parse
/// (`pools[1].pf`), when that is why: the decoder's own message names only a line.
fn field_error(path: &Path, text: &[u8]) -> Option<SysfsError> {
    let v: serde_json::Value = serde_json::from_slice(text).ok()?;
    for (i, pool) in v.get("pools")?.as_array()?.iter().enumerate() {
        if let Some(pf) = pool.get("pf") {
            let ok = pf.as_str().is_some_and(|a| a.parse::<PciAddress>().is_ok());
            if !ok {
                return Some(SysfsError::malformed(
                    path.display().to_string(),
                    0,
                    format!("pools[{i}].pf: {pf} is not a PCI address"),
                ));
            }
        }
    }
    None
}

/// Checks every field of a state file that becomes a path or an address, naming the first that
/// is wrong: a hand-edited file cannot make the fake kernel look or write outside its tree.
fn validate(path: &Path, state: &SandboxState) -> Result<(), SysfsError> {
    for (i, pool) in state.pools.iter().enumerate() {
        match pool {
            FakePool::Units { parent, costs, .. } => {
                check_field_name(path, &format!("pools[{i}].parent"), parent)?;
                for (j, (ty, _)) in costs.iter().enumerate() {
                    check_field_name(path, &format!("pools[{i}].costs[{j}]"), ty)?;
                }
            }
            FakePool::NvidiaMdev { parents, types, .. } => {
                for (j, p) in parents.iter().enumerate() {
                    check_field_name(path, &format!("pools[{i}].parents[{j}]"), p)?;
                }
                for (j, (t, _, _)) in types.iter().enumerate() {
                    check_field_name(path, &format!("pools[{i}].types[{j}]"), t)?;
                }
            }
            FakePool::VendorVfio { types, .. } => {
                for (j, (_, name)) in types.iter().enumerate() {
                    if name.is_empty() || name.chars().any(char::is_control) {
                        return Err(SysfsError::malformed(
                            path.display().to_string(),
                            0,
                            format!("pools[{i}].types[{j}]: {name:?} is not a vGPU type name"),
                        ));
                    }
                }
            }
        }
    }
    for (bdf, driver) in &state.host_drivers {
        if let Err(e) = bdf.parse::<PciAddress>() {
            return Err(SysfsError::malformed(
                path.display().to_string(),
                0,
                format!("hostDrivers: {bdf:?} is not a PCI address ({e})"),
            ));
        }
        check_field_name(path, &format!("hostDrivers[{bdf:?}]"), driver)?;
    }
    Ok(())
}

/// An opened sandbox: the fake kernel over `DIR/host`, every write taken under `DIR`'s lock
/// and the host drivers it learns written back to `DIR/sandbox.json`.
#[derive(Debug)]
pub struct Sandbox {
    dir: PathBuf,
    kernel: FakeKernel,
    state: Mutex<SandboxState>,
}

/// Opens the sandbox in `dir`.
///
/// # Errors
/// [`SysfsError::InvalidRoot`] for a directory that is not a sandbox (no `sandbox.json`, or one
/// of another format), [`SysfsError::Malformed`] for a state file that does not parse,
/// [`SysfsError::Io`] naming what could not be read.
pub fn open(dir: &Path) -> Result<Sandbox, SysfsError> {
    let path = dir.join(STATE_FILE);
    let not_a_sandbox = || SysfsError::InvalidRoot {
        path: format!("{PREFIX}{}", dir.display()),
        why: format!(
            "no {STATE_FILE} there; make a sandbox first with `gpuslice sandbox init {}`",
            dir.display()
        ),
    };
    let base = match Dir::open(dir) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(not_a_sandbox()),
        Err(e) => return Err(err_at(dir, e)),
    };
    // Read with the document cap, only a regular file (a FIFO is refused without being opened).
    let limit = DocumentLimit::from_env().map_err(|e| err_at(&path, e))?;
    if let Ok(crate::atomic::Entry::File { size }) = base.entry(STATE_FILE) {
        if size > u64::try_from(limit.bytes()).unwrap_or(u64::MAX) {
            return Err(err_at(&path, limit.too_large(STATE_FILE, Some(size))));
        }
    }
    let text = match base.read(STATE_FILE, limit.bytes()) {
        Ok(Some(t)) => t,
        Ok(None) => return Err(not_a_sandbox()),
        Err(e) => return Err(err_at(&path, e)),
    };
    let state: SandboxState = serde_json::from_slice(&text).map_err(|e| {
        field_error(&path, &text).unwrap_or_else(|| {
            SysfsError::malformed(path.display().to_string(), e.line(), e.to_string())
        })
    })?;
    if state.format != FORMAT {
        return Err(SysfsError::InvalidRoot {
            path: format!("{PREFIX}{}", dir.display()),
            why: format!(
                "{STATE_FILE} has format {:?}; this gpuslice reads {FORMAT:?}",
                state.format
            ),
        });
    }
    validate(&path, &state)?;
    // The tree is a directory of the sandbox, never a link to one elsewhere.
    let host_dir = dir.join(HOST_DIR);
    match base.sub(HOST_DIR) {
        Ok(Some(_)) => {}
        Ok(None) => {
            return Err(SysfsError::InvalidRoot {
                path: format!("{PREFIX}{}", dir.display()),
                why: format!("no {HOST_DIR} directory there (the sandbox's tree)"),
            });
        }
        Err(e) => {
            return Err(SysfsError::InvalidRoot {
                path: format!("{PREFIX}{}", dir.display()),
                why: e.to_string(),
            });
        }
    }
    // Opening settles the tree and recounts the pools (writes): one process at a time.
    let lock = lock_dir(dir).map_err(|e| err_at(&dir.join(LOCK_FILE), e))?;
    let kernel = open_kernel(&host_dir, &state.pools, &state.host_drivers)?
        .with_mig_source(saved_mig(dir.to_path_buf()));
    drop(lock);
    Ok(Sandbox {
        dir: dir.to_path_buf(),
        kernel,
        state: Mutex::new(state),
    })
}

impl Sandbox {
    /// The sandbox directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The fake kernel.
    pub fn kernel(&self) -> &FakeKernel {
        &self.kernel
    }

    /// Holds `path` open as a VM would (see [`FakeKernel::open_device`]), under the lock.
    ///
    /// # Errors
    /// The lock's timeout; `NotFound` for a device without a VFIO node.
    pub fn open_device(&self, path: &str) -> io::Result<u32> {
        let _lock = self.lock()?;
        self.kernel.open_device(path)
    }

    /// Ends a holder made by [`Sandbox::open_device`].
    ///
    /// # Errors
    /// The lock's timeout; `NotFound` for a process that is not there.
    pub fn close_device(&self, pid: u32) -> io::Result<()> {
        let _lock = self.lock()?;
        self.kernel.close_device(pid)
    }

    /// Reloads the sandbox's vGPU manager (see [`FakeKernel::reload_vgpu_manager`]): every
    /// vGPU is dropped, under the lock.
    ///
    /// # Errors
    /// The lock's timeout; `EBUSY` while a holder has a vGPU open; I/O errors.
    pub fn reload_vgpu_manager(&self) -> io::Result<crate::testing::Reloaded> {
        let _lock = self.lock()?;
        self.kernel.reload_vgpu_manager()
    }

    /// Takes the sandbox's write lock, waiting at most [`LOCK_WAIT`].
    fn lock(&self) -> io::Result<nix::fcntl::Flock<std::fs::File>> {
        lock_dir(&self.dir)
    }

    /// Writes back host drivers the kernel learnt (new VFs) since the state was read.
    fn save_drivers(&self) -> io::Result<()> {
        let now = drivers_as_text(&self.kernel.host_drivers());
        let mut st = match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if st.host_drivers == now {
            return Ok(());
        }
        st.host_drivers = now;
        write_state(&self.dir, &st).map_err(|e| io::Error::other(e.to_string()))
    }
}

impl Host for Sandbox {
    fn read(&self, path: &str) -> io::Result<Vec<u8>> {
        self.kernel.read(path)
    }
    fn read_bounded(&self, path: &str, max: usize) -> io::Result<Vec<u8>> {
        self.kernel.read_bounded(path, max)
    }
    fn write(&self, path: &str, data: &[u8]) -> io::Result<()> {
        let _lock = self.lock()?;
        let r = self.kernel.write(path, data);
        self.save_drivers()?;
        r
    }
    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.kernel.list(dir)
    }
    fn read_link(&self, path: &str) -> io::Result<PathBuf> {
        self.kernel.read_link(path)
    }
    fn exists(&self, path: &str) -> bool {
        self.kernel.exists(path)
    }
    fn run(&self, program: &str, args: &[String], timeout: Duration) -> io::Result<CommandOutput> {
        let _lock = self.lock()?;
        let r = self.kernel.run(program, args, timeout);
        self.save_drivers()?;
        r
    }
    fn root_dir(&self) -> Option<&Path> {
        self.kernel.root_dir()
    }
    fn recorded_vgpu_types(&self, gpu: &PciAddress) -> Option<Vec<(u32, String)>> {
        self.kernel.pools().iter().find_map(|p| match p {
            FakePool::VendorVfio { pf, types, .. } if pf == gpu => Some(types.clone()),
            _ => None,
        })
    }
    fn write_atomic(&self, path: &str, data: &[u8]) -> io::Result<()> {
        self.kernel.write_atomic(path, data)
    }
    fn create_dir_all(&self, path: &str) -> io::Result<()> {
        self.kernel.create_dir_all(path)
    }
}

mod hold;
#[cfg(all(test, feature = "testing"))]
mod tests;
mod text;

pub use hold::HoldError;

/// `message` with every sysfs path it names (`/sys/...`) written where it is under `root`
/// (device nodes such as `/dev/vfio/9` are left as the VM's process names them): `TREE/sys/...`
/// for a directory, `DIR/host/sys/...` for a sandbox, `RECORDING:/sys/...` for a recording. On
/// the local `/` the message is unchanged. No error under another root names a path as if it
/// were this machine's.
pub fn name_under_root(root: &Path, message: &str) -> String {
    let prefix = if let Some(dir) = sandbox_dir(root) {
        dir.join(HOST_DIR).display().to_string()
    } else if crate::is_local_root(root) {
        return message.to_owned();
    } else if crate::confine::is_recording(root) {
        format!("{}:", root.display())
    } else {
        root.display().to_string().trim_end_matches('/').to_owned()
    };
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = rest.find('/') {
        let (before, from) = rest.split_at(i);
        out.push_str(before);
        let boundary = out
            .chars()
            .last()
            .is_none_or(|c| c.is_whitespace() || matches!(c, '(' | '"' | '\'' | '`' | '='));
        if boundary && from.starts_with("/sys/") {
            out.push_str(&prefix);
        }
        out.push('/');
        rest = &from[1..];
    }
    out.push_str(rest);
    out
}
