//! `gpuslice dra prepare|unprepare`: the node side of Kubernetes DRA.
//!
//! A kubelet plugin wrapper forwards the claim it is asked to prepare (as JSON) and gets back the
//! devices to hand to the VM. What was created is recorded under the state directory, one file per
//! claim, so that `unprepare` removes exactly that, a repeated `prepare` answers the same, and
//! `gpuslice export dra` does not subtract the scheduler's own vGPUs from what it publishes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use gpu_sysfs::actuate;
use serde::Serialize;

use crate::cmd::metrics::local_topology;
use crate::common::Global;
use gpu_integrations::dra::model::ResourceSlice;
use gpu_integrations::dra::prepare::{PrepareAction, PrepareInput, PreparedClaim, plan_prepare};
use gpu_integrations::dra::{DEFAULT_DRIVER, rules, store};
use gpu_integrations::handoff::{self, VmDevice};

/// Where prepared claims are recorded by default.
/// Where prepared claims are recorded, inside `--root` unless `--state-dir` says otherwise.
pub const DEFAULT_STATE_DIR: &str = "var/lib/gpuslice/dra";

/// `gpuslice dra` subcommands.
#[derive(Subcommand, Debug)]
pub enum DraCommand {
    /// Create what an allocated ResourceClaim names on this node.
    Prepare(PrepareArgs),
    /// Remove what `prepare` created for a claim.
    Unprepare(UnprepareArgs),
    /// Check ResourceSlices (a YAML stream or a JSON List, any driver's) against the API's limits
    /// and the exclusivity of whole GPUs and vGPUs; exit 1 listing every violation.
    Check(CheckArgs),
}

/// `dra check` arguments.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The file with the slices (`-` for standard input).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The Kubernetes version whose rules apply.
    #[arg(long, default_value = "1.37", value_name = "VERSION")]
    pub k8s_version: gpu_integrations::dra::K8sVersion,
}

/// `dra prepare` arguments.
#[derive(Args, Debug)]
pub struct PrepareArgs {
    /// The ResourceClaim with `status.allocation` (or a bare AllocationResult), JSON or YAML;
    /// `-` reads standard input.
    #[arg(long, value_name = "FILE")]
    pub claim: PathBuf,
    /// The claim's UID, when the input has no `metadata.uid`.
    #[arg(long, value_name = "UID")]
    pub claim_uid: Option<String>,
    /// The DRA driver name the devices were published under.
    #[arg(long, default_value = DEFAULT_DRIVER, value_name = "NAME")]
    pub driver: String,
    /// Where prepared claims are recorded (default: var/lib/gpuslice/dra inside --root).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Print the plan without changing the host.
    #[arg(long)]
    pub dry_run: bool,
}

/// `dra unprepare` arguments.
#[derive(Args, Debug)]
pub struct UnprepareArgs {
    /// The claim's UID.
    #[arg(long, value_name = "UID")]
    pub claim_uid: String,
    /// Where prepared claims are recorded (default: var/lib/gpuslice/dra inside --root).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Remove instances even while a VM holds them open.
    #[arg(long)]
    pub force: bool,
}

/// What `prepare` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PrepareOutput {
    claim_uid: String,
    node: String,
    actions: Vec<PrepareAction>,
    /// QEMU arguments for all devices.
    qemu: Vec<String>,
    /// libvirt XML for all devices.
    libvirt: String,
    /// True when this call changed nothing (already prepared, or a dry run).
    unchanged: bool,
}

/// The claim store: `--state-dir` as given, else [`DEFAULT_STATE_DIR`] inside `--root`.
pub fn state_dir(g: &Global, given: Option<&Path>) -> PathBuf {
    given.map_or_else(|| g.root.join(DEFAULT_STATE_DIR), Path::to_path_buf)
}

fn vm_devices(g: &Global, actions: &[PrepareAction]) -> Vec<VmDevice> {
    let mut out = Vec::new();
    let functions = |address| {
        local_topology(g)
            .ok()
            .and_then(|t| handoff::address_devices(&t, &address).ok())
            .unwrap_or_else(|| vec![VmDevice::Pci { address }])
    };
    for a in actions {
        match a {
            PrepareAction::BindGpu { address, .. } => out.extend(functions(*address)),
            PrepareAction::CreateMdev { uuid, .. } => out.push(VmDevice::Mdev { uuid: *uuid }),
            PrepareAction::SetVfType { vf, .. } => out.push(VmDevice::Pci { address: *vf }),
        }
    }
    out
}

fn output(g: &Global, claim: &PreparedClaim, unchanged: bool) -> anyhow::Result<ExitCode> {
    let devices = vm_devices(g, &claim.actions);
    let out = PrepareOutput {
        claim_uid: claim.claim_uid.clone(),
        node: claim.node.clone(),
        actions: claim.actions.clone(),
        qemu: handoff::qemu_args(&devices),
        libvirt: handoff::libvirt_xml(&devices),
        unchanged,
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(ExitCode::SUCCESS)
}

fn host(g: &Global) -> anyhow::Result<gpu_sysfs::RealHost> {
    if g.root.is_file() {
        bail!("prepare and unprepare change the host: --root must be a directory, not a recording");
    }
    Ok(gpu_sysfs::RealHost::new(&g.root)?)
}

/// Undoes `actions` (newest first), reporting but not stopping at failures.
fn undo(host: &dyn gpu_sysfs::Host, actions: &[PrepareAction], force: bool) -> Vec<String> {
    let mut errors = Vec::new();
    for a in actions.iter().rev() {
        let r = match a {
            PrepareAction::BindGpu { address, .. } => {
                actuate::release_gpu(host, address, force).map(|_| ())
            }
            PrepareAction::CreateMdev { uuid, .. } => {
                actuate::remove_mdev(host, uuid, force).map(|_| ())
            }
            PrepareAction::SetVfType { vf, .. } => actuate::clear_vf(host, vf, force).map(|_| ()),
        };
        if let Err(e) = r {
            errors.push(e.to_string());
        }
    }
    errors
}

/// Carries out one action; true when it changed the host (false: already in that state).
fn apply(host: &dyn gpu_sysfs::Host, a: &PrepareAction) -> anyhow::Result<bool> {
    Ok(match a {
        PrepareAction::BindGpu { address, .. } => actuate::bind_gpu(host, address)?.changed(),
        PrepareAction::CreateMdev {
            parent,
            type_id,
            uuid,
            ..
        } => {
            actuate::create_mdev(
                host,
                &actuate::MdevCreate {
                    parent: parent.clone(),
                    type_id: type_id.clone(),
                    uuid: *uuid,
                },
            )?
            .changed
        }
        PrepareAction::SetVfType { vf, type_id, .. } => {
            let num = type_id.vendor_vfio_number().with_context(|| {
                format!("type {type_id} of VF {vf} is not a vendor-VFIO number")
            })?;
            actuate::set_vf_type(host, vf, num, false)?.changed
        }
    })
}

/// Runs `gpuslice dra`.
///
/// # Errors
/// When the claim cannot be read or mapped, or the host refuses a change (already-made changes
/// of the same call are undone).
pub fn run(g: &Global, c: DraCommand) -> anyhow::Result<ExitCode> {
    match c {
        DraCommand::Prepare(a) => prepare(g, &a),
        DraCommand::Unprepare(a) => unprepare(g, &a),
        DraCommand::Check(a) => check(&a),
    }
}

fn read_input(path: &Path) -> anyhow::Result<String> {
    if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("cannot read standard input")
    } else {
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
    }
}

/// The ResourceSlices of a YAML stream or a JSON `List` (other kinds are skipped).
///
/// # Errors
/// When a document is not YAML/JSON or a ResourceSlice does not have the v1 shape.
pub fn parse_slices(text: &str) -> anyhow::Result<Vec<ResourceSlice>> {
    use serde::Deserialize as _;
    let mut docs: Vec<serde_json::Value> = Vec::new();
    for (i, d) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let v = serde_json::Value::deserialize(d).with_context(|| format!("document {}", i + 1))?;
        match v.get("items").and_then(|x| x.as_array()) {
            Some(items) if v.get("kind").and_then(|k| k.as_str()) == Some("List") => {
                docs.extend(items.iter().cloned())
            }
            _ if v.is_null() => {}
            _ => docs.push(v),
        }
    }
    docs.into_iter()
        .filter(|d| d.get("kind").and_then(|k| k.as_str()) == Some("ResourceSlice"))
        .enumerate()
        .map(|(i, d)| serde_json::from_value(d).with_context(|| format!("ResourceSlice {}", i + 1)))
        .collect()
}

fn check(a: &CheckArgs) -> anyhow::Result<ExitCode> {
    let slices = parse_slices(&read_input(&a.file)?)?;
    let violations = rules::check(&slices, a.k8s_version);
    for v in &violations {
        println!("{v}");
    }
    if violations.is_empty() {
        eprintln!(
            "gpuslice: {} slices hold the Kubernetes {} rules",
            slices.len(),
            a.k8s_version
        );
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::from(1))
    }
}

fn prepare(g: &Global, a: &PrepareArgs) -> anyhow::Result<ExitCode> {
    let text = read_input(&a.claim)?;
    let input: PrepareInput = gpu_core::decode_text("ResourceClaim", &text)?;
    let uid = a
        .claim_uid
        .clone()
        .or_else(|| input.claim_uid().map(str::to_owned))
        .context("the claim has no metadata.uid; pass --claim-uid")?;
    let path = store::claim_path(&state_dir(g, a.state_dir.as_deref()), &uid)?;
    if path.exists() {
        let claim = store::read_claim(&path)?;
        return output(g, &claim, true);
    }
    let node = local_topology(g)?;
    let actions = plan_prepare(input.allocation()?, &uid, &a.driver, &node)
        .with_context(|| format!("claim {uid}"))?;
    let planned = PreparedClaim {
        claim_uid: uid.clone(),
        node: node.node.clone(),
        actions,
        found: vec![],
    };
    if a.dry_run {
        return output(g, &planned, true);
    }
    let host = host(g)?;
    // Only what this call changes is recorded for unprepare to undo: a device already in the
    // wanted state (found) is held by the claim but left as it is afterwards.
    let mut done = Vec::new();
    let mut found = Vec::new();
    for action in &planned.actions {
        let changed = match apply(&host, action) {
            Ok(c) => c,
            Err(e) => {
                let undo_errors = undo(&host, &done, false);
                let mut msg = format!("claim {uid}: {e:#}");
                if !undo_errors.is_empty() {
                    msg.push_str(&format!(
                        "; undoing the earlier steps also failed: {}",
                        undo_errors.join("; ")
                    ));
                }
                bail!(msg);
            }
        };
        if changed {
            done.push(action.clone());
        } else {
            found.push(action.clone());
        }
    }
    let claim = PreparedClaim {
        actions: done,
        found,
        ..planned
    };
    store::write_claim(&path, &claim)?;
    output(g, &claim, false)
}

fn unprepare(g: &Global, a: &UnprepareArgs) -> anyhow::Result<ExitCode> {
    let path = store::claim_path(&state_dir(g, a.state_dir.as_deref()), &a.claim_uid)?;
    if !path.exists() {
        // Unprepare must be idempotent: kubelet retries it.
        println!(
            "{}",
            serde_json::json!({"claimUid": a.claim_uid, "removed": []})
        );
        return Ok(ExitCode::SUCCESS);
    }
    let claim = store::read_claim(&path)?;
    let host = host(g)?;
    let errors = undo(&host, &claim.actions, a.force);
    if !errors.is_empty() {
        bail!("claim {}: {}", a.claim_uid, errors.join("; "));
    }
    std::fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
    let removed: Vec<String> = claim
        .actions
        .iter()
        .map(|x| match x {
            PrepareAction::BindGpu { address, .. } => address.to_string(),
            PrepareAction::CreateMdev { uuid, .. } => uuid.to_string(),
            PrepareAction::SetVfType { vf, .. } => vf.to_string(),
        })
        .collect();
    println!(
        "{}",
        serde_json::json!({"claimUid": a.claim_uid, "removed": removed})
    );
    Ok(ExitCode::SUCCESS)
}
