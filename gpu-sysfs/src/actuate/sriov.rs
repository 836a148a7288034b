//! Enabling SR-IOV on an NVIDIA GPU with `sriov-manage -e <bdf>`.
//!
//! The script is NVIDIA's supported way (it also prepares the driver), but it may hang, and it may
//! exit 0 without having enabled anything. So it runs with a timeout, its stderr is kept for the
//! error, and `sriov_numvfs` is read afterwards: that, not the exit status, says whether it worked.
//! In a container, the host's copy runs through `chroot <host-root>`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use gpu_core::PciAddress;

use super::{ActuateError, Result, pci_dir, read_opt, require_pci};
use crate::host::Host;

/// Where NVIDIA installs the script.
pub const SRIOV_MANAGE: &str = "/usr/lib/nvidia/sriov-manage";

/// Where `chroot` lives on the host running gpuslice.
pub const CHROOT: &str = "/usr/sbin/chroot";

/// How to run `sriov-manage`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SriovOptions {
    /// Kill it after this long (default 60 s).
    pub timeout: Duration,
    /// Run it as `chroot <dir> <program> -e <bdf>` (the host's root seen from a container).
    pub chroot: Option<String>,
    /// The script (default [`SRIOV_MANAGE`]; a path inside `chroot` when that is set).
    pub program: String,
}

impl Default for SriovOptions {
    fn default() -> Self {
        SriovOptions {
            timeout: Duration::from_secs(60),
            chroot: None,
            program: SRIOV_MANAGE.to_owned(),
        }
    }
}

/// The outcome of [`enable_sriov`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SriovEnabled {
    /// The physical function.
    pub pf: PciAddress,
    /// `sriov_numvfs` afterwards.
    pub numvfs: u32,
    /// The VFs (from `virtfnN`).
    pub vfs: Vec<PciAddress>,
    /// True when this call enabled SR-IOV; false when VFs were already there.
    pub changed: bool,
    /// The command that ran (absent when nothing ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

fn numvfs(host: &dyn Host, pf: &PciAddress) -> Result<Option<u32>> {
    let path = format!("{}/sriov_numvfs", pci_dir(pf));
    Ok(read_opt(host, &path)?.and_then(|s| s.parse().ok()))
}

fn tail(s: &str) -> String {
    let t = s.trim();
    if t.is_empty() {
        return String::new();
    }
    // The last lines carry the reason; whole outputs can be long.
    let lines: Vec<&str> = t.lines().collect();
    let start = lines.len().saturating_sub(5);
    format!(": {}", lines[start..].join(" | "))
}

/// Enables SR-IOV on `pf` through `sriov-manage -e <pf>` and checks `sriov_numvfs` afterwards.
///
/// Idempotent: a PF that already has VFs is reported with `changed: false` and nothing runs.
///
/// # Errors
/// - [`ActuateError::NotFound`]: no such device; [`ActuateError::Unsupported`]: not SR-IOV capable;
/// - [`ActuateError::Timeout`]: the script ran past `opts.timeout` and was killed;
/// - [`ActuateError::CommandFailed`]: it could not start or exited non-zero (its stderr included);
/// - [`ActuateError::SriovNotEnabled`]: it exited 0 but the PF has no VFs.
pub fn enable_sriov(host: &dyn Host, pf: &PciAddress, opts: &SriovOptions) -> Result<SriovEnabled> {
    let dir = require_pci(host, pf)?;
    if host.exists(&format!("{dir}/physfn")) {
        return Err(ActuateError::Unsupported {
            device: pf.to_string(),
            why: "is a virtual function; enable SR-IOV on its physical function".to_owned(),
        });
    }
    let Some(before) = numvfs(host, pf)? else {
        return Err(ActuateError::Unsupported {
            device: pf.to_string(),
            why: "is not SR-IOV capable (no sriov_numvfs)".to_owned(),
        });
    };
    if before > 0 {
        return Ok(SriovEnabled {
            pf: *pf,
            numvfs: before,
            vfs: super::vendor::vfs_of(host, pf),
            changed: false,
            command: None,
        });
    }
    let mut argv: Vec<String> = Vec::new();
    let program = match &opts.chroot {
        Some(root) => {
            argv.push(root.clone());
            argv.push(opts.program.clone());
            CHROOT.to_owned()
        }
        None => opts.program.clone(),
    };
    argv.push("-e".to_owned());
    argv.push(pf.to_string());
    let command = std::iter::once(program.clone())
        .chain(argv.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    let out = host
        .run(&program, &argv, opts.timeout)
        .map_err(|e| ActuateError::CommandFailed {
            program: command.clone(),
            status: if e.kind() == std::io::ErrorKind::NotFound && opts.chroot.is_none() {
                format!("could not start: {e}; from a container, run it through chroot <host-root>")
            } else {
                format!("could not start: {e}")
            },
            stderr: String::new(),
        })?;
    if out.timed_out {
        return Err(ActuateError::Timeout {
            program: command,
            seconds: opts.timeout.as_secs().max(1),
            stderr: tail(&out.stderr),
        });
    }
    if out.status != Some(0) {
        return Err(ActuateError::CommandFailed {
            program: command,
            status: match out.status {
                Some(n) => format!("exit status {n}"),
                None => "killed by a signal".to_owned(),
            },
            stderr: tail(&out.stderr),
        });
    }
    let after = numvfs(host, pf)?.unwrap_or(0);
    if after == 0 {
        let said = if out.stderr.trim().is_empty() {
            &out.stdout
        } else {
            &out.stderr
        };
        return Err(ActuateError::SriovNotEnabled {
            pf: pf.to_string(),
            program: command,
            numvfs: after.to_string(),
            output: tail(said),
        });
    }
    Ok(SriovEnabled {
        pf: *pf,
        numvfs: after,
        vfs: super::vendor::vfs_of(host, pf),
        changed: true,
        command: Some(command),
    })
}

/// The outcome of [`disable_sriov`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SriovDisabled {
    /// The physical function.
    pub pf: PciAddress,
    /// The VFs it had (gone now).
    pub vfs: Vec<PciAddress>,
    /// True when this call disabled SR-IOV; false when the PF had no VFs.
    pub changed: bool,
}

/// Why a VF keeps SR-IOV on: the vGPU it holds (mdev instances on it, or a vendor-VFIO type),
/// or the process that holds it open. `None` for a VF that can go.
fn vf_in_use(host: &dyn Host, vf: &PciAddress) -> Result<Option<String>> {
    let dir = pci_dir(vf);
    let instances: Vec<String> = host
        .list(&dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.parse::<gpu_core::MdevUuid>().is_ok() && host.exists(&format!("{dir}/{e}/mdev_type"))
        })
        .collect();
    if !instances.is_empty() {
        return Ok(Some(format!(
            "VF {vf} holds mdev instance(s) {}",
            instances.join(", ")
        )));
    }
    if super::vendor::is_vendor_vfio_vf(host, vf) {
        let t = super::vendor::current_type(host, vf)?;
        if t != 0 {
            return Ok(Some(format!("VF {vf} holds vGPU type {t}")));
        }
    }
    Ok(super::holder_of(host, &dir).map(|h| format!("VF {vf} is open by {h} ({})", h.node)))
}

/// Disables SR-IOV on `pf`: `0` written to `sriov_numvfs` (the kernel's own interface, the one a
/// layout's rollback uses), and `sriov_numvfs` read back.
///
/// Refused while any VF holds a vGPU (an mdev instance, a vendor-VFIO type) or is open by a
/// process, naming it: the VFs go away with their devices, under any VM using them. Idempotent:
/// a PF without VFs is reported with `changed: false` and nothing is written.
///
/// # Errors
/// - [`ActuateError::NotFound`]: no such device; [`ActuateError::Unsupported`]: a VF, or not
///   SR-IOV capable;
/// - [`ActuateError::VfInUse`]: a VF holds a vGPU or is open (nothing written);
/// - errors of the write; [`ActuateError::NotApplied`] when VFs are still there afterwards.
pub fn disable_sriov(host: &dyn Host, pf: &PciAddress) -> Result<SriovDisabled> {
    let dir = require_pci(host, pf)?;
    if host.exists(&format!("{dir}/physfn")) {
        return Err(ActuateError::Unsupported {
            device: pf.to_string(),
            why: "is a virtual function; disable SR-IOV on its physical function".to_owned(),
        });
    }
    let Some(before) = numvfs(host, pf)? else {
        return Err(ActuateError::Unsupported {
            device: pf.to_string(),
            why: "is not SR-IOV capable (no sriov_numvfs)".to_owned(),
        });
    };
    let vfs = super::vendor::vfs_of(host, pf);
    if before == 0 {
        return Ok(SriovDisabled {
            pf: *pf,
            vfs,
            changed: false,
        });
    }
    for vf in &vfs {
        if let Some(why) = vf_in_use(host, vf)? {
            return Err(ActuateError::VfInUse {
                pf: pf.to_string(),
                why,
            });
        }
    }
    let path = format!("{dir}/sriov_numvfs");
    super::write(host, &path, b"0")?;
    let after = numvfs(host, pf)?.unwrap_or(0);
    if after != 0 {
        return Err(ActuateError::NotApplied {
            path: format!("/{path}"),
            wrote: "0".to_owned(),
            found: after.to_string(),
        });
    }
    Ok(SriovDisabled {
        pf: *pf,
        vfs,
        changed: true,
    })
}
