//! The doctor's checks of what gpuslice hands to others: the KubeVirt release that will run the
//! node's VMs, and the licensing files a guest's cloud-init writes.
//!
//! [`diagnose`] runs the node's own checks ([`gpu_sysfs::doctor::diagnose`]) and adds these:
//!
//! - `kubevirt-version`: SR-IOV vGPUs (NVIDIA's vendor-specific VFIO framework: L4, L40S, H100,
//!   H200, B200) reach a KubeVirt VM only from KubeVirt 1.9 (the VF discovery merged as
//!   kubevirt/kubevirt#16890; gpuslice issue 46). A node does not show KubeVirt's release, so the
//!   version is what the caller read (`--kubevirt-version`, from the `KubeVirt` CR's
//!   `status.observedKubeVirtVersion`) and the check says where it came from. When virt-handler
//!   runs here and no version is given, the check says the version cannot be seen; it never
//!   guesses one.
//! - `guest-license`: a cloud-config whose `gridd.conf` asks for a license (`FeatureType` other
//!   than `0`) must also write a client configuration token ([`crate::cloud_init`]).

use gpu_core::{NodeTopology, VgpuFramework};
use gpu_sysfs::Host;
use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::doctor::{Check, Diagnosis, Verdict};
use serde::Deserialize;

use crate::cloud_init::{FeatureType, GRIDD_CONF, TOKEN_DIR};
use crate::error::{IntegrationError, Result, error};

/// The first KubeVirt release whose VMs take SR-IOV (vendor-VFIO) vGPUs.
pub const KUBEVIRT_SRIOV_VGPU: KubevirtVersion = KubevirtVersion { major: 1, minor: 9 };

/// The name of the doctor check the node's own checks emit when virt-handler runs here.
const VIRT_HANDLER_CHECK: &str = "kubevirt-mdev-gate";

/// A KubeVirt release, major and minor (`v1.9.0`, `1.9`, `1.10.1-rc.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubevirtVersion {
    /// Major release.
    pub major: u32,
    /// Minor release.
    pub minor: u32,
}

impl std::fmt::Display for KubevirtVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl std::str::FromStr for KubevirtVersion {
    type Err = IntegrationError;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || error!(Invalid, "KubeVirt version"; "KubeVirt version {s:?}: expected MAJOR.MINOR[.PATCH] such as v1.9.0");
        let t = s.trim();
        let t = t.strip_prefix('v').unwrap_or(t);
        let mut parts = t.split(['.', '-', '+']);
        let major = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let minor = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        Ok(KubevirtVersion { major, minor })
    }
}

/// What the caller read for the checks beyond the node's own.
#[derive(Debug, Clone, Default)]
pub struct GuestOptions {
    /// The KubeVirt release and where it was read from (`--kubevirt-version`).
    pub kubevirt: Option<(KubevirtVersion, String)>,
    /// A rendered cloud-config and where it was read from (its file name).
    pub cloud_config: Option<(String, String)>,
}

/// The node's checks ([`gpu_sysfs::doctor::diagnose`]) and then `kubevirt-version` and
/// `guest-license` where `opts` or the node give something to check.
///
/// # Errors
/// Only when the root cannot be discovered at all.
pub fn diagnose(
    host: &dyn Host,
    node: &str,
    opts: &GuestOptions,
) -> std::result::Result<Diagnosis, gpu_sysfs::SysfsError> {
    let mut d = gpu_sysfs::doctor::diagnose(host, node)?;
    let virt_handler = d.checks.iter().any(|c| c.check == VIRT_HANDLER_CHECK);
    if opts.kubevirt.is_some() || virt_handler {
        let topology = discover(host, &DiscoverOptions::new(node))?;
        d.checks.push(kubevirt_version(
            opts.kubevirt.as_ref().map(|(v, from)| (*v, from.as_str())),
            &topology,
        ));
    }
    if let Some((text, from)) = &opts.cloud_config {
        d.checks.push(license_check(text, from));
    }
    d.verdict = d
        .checks
        .iter()
        .map(|c| c.verdict)
        .max()
        .unwrap_or(Verdict::Ok);
    Ok(d)
}

fn check(
    verdict: Verdict,
    check: &str,
    subject: Option<String>,
    message: String,
    fix: Option<String>,
) -> Check {
    Check {
        check: check.to_owned(),
        subject,
        verdict,
        message,
        fix,
    }
}

/// The `kubevirt-version` check: `version` with where it was read from, against the node's
/// SR-IOV vGPU GPUs; without a version (virt-handler runs here, the caller named none), a
/// warning that it cannot be seen.
pub fn kubevirt_version(
    version: Option<(KubevirtVersion, &str)>,
    topology: &NodeTopology,
) -> Check {
    let sriov: Vec<String> = topology
        .gpus
        .iter()
        .filter(|g| g.vgpu_framework == Some(VgpuFramework::VendorVfio))
        .map(|g| g.name.clone())
        .collect();
    const NAME: &str = "kubevirt-version";
    let Some((v, from)) = version else {
        return check(
            Verdict::Warn,
            NAME,
            Some("virt-handler".to_owned()),
            format!(
                "KubeVirt runs here but its version cannot be seen from this node (SR-IOV vGPUs need KubeVirt {KUBEVIRT_SRIOV_VGPU} or later); not checked"
            ),
            Some("give --kubevirt-version, as `kubectl get kubevirt -A -o jsonpath='{.items[0].status.observedKubeVirtVersion}'` prints it".to_owned()),
        );
    };
    if sriov.is_empty() {
        return check(
            Verdict::Ok,
            NAME,
            None,
            format!("KubeVirt {v} (read from {from}); no SR-IOV vGPU GPU on this node"),
            None,
        );
    }
    if v < KUBEVIRT_SRIOV_VGPU {
        return check(
            Verdict::Fail,
            NAME,
            Some(sriov.join(", ")),
            format!(
                "KubeVirt {v} (read from {from}) cannot give SR-IOV (vendor-VFIO) vGPUs to VMs: they need KubeVirt {KUBEVIRT_SRIOV_VGPU} or later"
            ),
            Some(format!(
                "upgrade KubeVirt to {KUBEVIRT_SRIOV_VGPU} or later"
            )),
        );
    }
    check(
        Verdict::Ok,
        NAME,
        Some(sriov.join(", ")),
        format!("KubeVirt {v} (read from {from}) gives SR-IOV vGPUs to VMs"),
        None,
    )
}

/// One `write_files` entry of a cloud-config, as far as this check reads it.
#[derive(Deserialize)]
struct Entry {
    path: String,
    #[serde(default)]
    content: String,
    #[serde(default)]
    encoding: Option<String>,
}

#[derive(Deserialize)]
struct Doc {
    #[serde(default)]
    write_files: Vec<Entry>,
}

/// The `guest-license` check of a rendered cloud-config read from `from`: a `gridd.conf` that
/// asks for a license must come with a client configuration token.
pub fn license_check(text: &str, from: &str) -> Check {
    const NAME: &str = "guest-license";
    let subject = Some(from.to_owned());
    let render = "render it with `gpuslice export cloud-init --license-token FILE`".to_owned();
    let doc: Doc = match serde_yaml_ng::from_str(text) {
        Ok(d) => d,
        Err(e) => {
            return check(
                Verdict::Fail,
                NAME,
                subject,
                format!("not a cloud-config: {e}"),
                Some(render),
            );
        }
    };
    let Some(gridd) = doc.write_files.iter().find(|f| f.path == GRIDD_CONF) else {
        return check(
            Verdict::Warn,
            NAME,
            subject,
            format!("writes no {GRIDD_CONF}: the guest driver keeps its own FeatureType"),
            Some(render),
        );
    };
    if gridd.encoding.is_some() {
        return check(
            Verdict::Warn,
            NAME,
            subject,
            format!("{GRIDD_CONF} is encoded; its FeatureType cannot be read here"),
            None,
        );
    }
    // The last setting wins, as gridd reads it.
    let feature = gridd
        .content
        .lines()
        .rev()
        .find_map(|l| {
            l.trim()
                .strip_prefix("FeatureType")
                .and_then(|r| r.trim_start().strip_prefix('='))
        })
        .map(str::parse::<FeatureType>);
    let feature = match feature {
        Some(Ok(f)) => f,
        Some(Err(e)) => return check(Verdict::Fail, NAME, subject, e.to_string(), None),
        None => {
            return check(
                Verdict::Warn,
                NAME,
                subject,
                format!("{GRIDD_CONF} sets no FeatureType"),
                None,
            );
        }
    };
    if !feature.needs_token() {
        return check(
            Verdict::Ok,
            NAME,
            subject,
            "FeatureType=0: the guest acquires no license, no token needed".to_owned(),
            None,
        );
    }
    let token = doc.write_files.iter().find(|f| {
        f.path
            .strip_prefix(TOKEN_DIR)
            .and_then(|r| r.strip_prefix('/'))
            .is_some_and(|n| n.ends_with(".tok"))
            && !f.content.trim().is_empty()
    });
    match token {
        Some(t) => check(
            Verdict::Ok,
            NAME,
            subject,
            format!(
                "FeatureType={} ({}) with the token {}",
                feature.code(),
                feature.describe(),
                t.path
            ),
            None,
        ),
        None => check(
            Verdict::Fail,
            NAME,
            subject,
            format!(
                "FeatureType={} ({}) but no client configuration token in {TOKEN_DIR}/: the guest will stay unlicensed",
                feature.code(),
                feature.describe()
            ),
            Some(render),
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::cloud_init::{guest_files, to_yaml};

    #[test]
    fn kubevirt_versions_parse_with_or_without_v_and_patch() {
        assert_eq!(
            "v1.9.0".parse::<KubevirtVersion>().unwrap(),
            KUBEVIRT_SRIOV_VGPU
        );
        assert_eq!(
            "1.10.1-rc.0".parse::<KubevirtVersion>().unwrap(),
            KubevirtVersion {
                major: 1,
                minor: 10
            }
        );
        assert!("1.10.1-rc.0".parse::<KubevirtVersion>().unwrap() > KUBEVIRT_SRIOV_VGPU);
        for bad in ["", "v", "1", "one.two", "1.x"] {
            assert!(bad.parse::<KubevirtVersion>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_cloud_config_asking_for_a_license_without_a_token_fails() {
        let no_token = "#cloud-config\nwrite_files:\n- path: /etc/nvidia/gridd.conf\n  content: |\n    FeatureType=4\n";
        let c = license_check(no_token, "user-data");
        assert_eq!(c.verdict, Verdict::Fail);
        assert!(c.message.contains("FeatureType=4"), "{}", c.message);
        assert!(c.fix.unwrap().contains("--license-token"));
    }

    #[test]
    fn what_export_cloud_init_renders_passes_the_check() {
        let licensed = guest_files(Some((b"tok", Some("a.tok"))), FeatureType::Vgpu).unwrap();
        assert_eq!(
            license_check(&to_yaml(&licensed).unwrap(), "f").verdict,
            Verdict::Ok
        );
        let free = guest_files(None, FeatureType::Unlicensed).unwrap();
        assert_eq!(
            license_check(&to_yaml(&free).unwrap(), "f").verdict,
            Verdict::Ok
        );
    }
}
