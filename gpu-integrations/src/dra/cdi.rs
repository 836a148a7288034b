//! The Container Device Interface spec of a prepared claim: what the container runtime adds to
//! the VM's launcher pod so that QEMU can open the devices.
//!
//! One spec file per claim in the CDI directory (`/var/run/cdi`), named after the driver and the
//! claim's UID (`gpu.gpuslice.dev-<uid>.json`): a UID is never reused, so neither is a file or
//! device name. Kind `<driver>/vfio`; per prepared device one CDI device `<uid>-<index>` with
//! the legacy VFIO nodes (`/dev/vfio/vfio` and `/dev/vfio/<group>`; KubeVirt does not open
//! iommufd yet), and on the first device of each request the read-only bind mount of that
//! request's KubeVirt metadata file ([`super::metadata`]).
//!
//! Every file goes through gpuslice's one confined writer ([`gpu_sysfs::atomic`]): the CDI
//! directory and the metadata directory are reached from their parents without following a
//! link, and a claim's metadata directories are made below them the same way, so a link
//! planted at `<kubelet-dir>/plugins/<driver>/metadata` (or anywhere below) is refused, naming
//! it. A file is written to a temporary file created exclusively under an unpredictable name and
//! moved into place, so the runtime never reads half a spec and a link planted at a guessed
//! temporary name is never written through. A link, FIFO or directory where a spec or metadata
//! file belongs is refused without being opened, so a prepare never blocks on it while it holds
//! the node's locks. A file that already holds the same text is left alone (a repeated prepare
//! writes nothing).

use std::path::{Path, PathBuf};

use gpu_sysfs::atomic::Dir;

use serde_json::{Value, json};

use super::claim::PreparedDevice;
use super::metadata::{self, ClaimRef};
use super::names::is_dns_subdomain;
use crate::error::{IntegrationError, Result, fail};

/// The CDI version the specs declare (device nodes and mounts: read by every runtime since).
pub const CDI_VERSION: &str = "0.6.0";
/// The class of the CDI kind (`<driver>/vfio`).
pub const CDI_CLASS: &str = "vfio";

/// Where a driver's CDI specs and KubeVirt metadata files go on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiLayout {
    /// The CDI spec directory (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// The host directory holding the metadata files (`<kubelet-dir>/plugins/<driver>/metadata`).
    pub metadata_dir: PathBuf,
    /// The driver name.
    pub driver: String,
}

/// What [`CdiLayout::write`] put in place for one claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Per prepared device (in order), its CDI device IDs.
    pub device_ids: Vec<Vec<String>>,
    /// The spec file.
    pub spec: PathBuf,
    /// True when a file was written (false: everything was already in place).
    pub changed: bool,
}

/// What [`CdiLayout::render`] makes of one claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The spec's text.
    pub spec: String,
    /// The metadata files it mounts: host path and text.
    pub files: Vec<(PathBuf, String)>,
    /// Per prepared device (in order), its CDI device IDs.
    pub device_ids: Vec<Vec<String>>,
}

/// A UID, request or device name that becomes part of a file or CDI name: letters, digits, `-`,
/// `_` and `.`, not starting with `.`, at most 128 bytes.
fn check_component(what: &str, s: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !ok {
        fail!(
            Invalid, what;
            "{what} {s:?} cannot name a file: letters, digits, '-', '_' and '.' only, not \
             starting with '.', at most 128"
        );
    }
    Ok(())
}

impl CdiLayout {
    /// The layout of `driver` with specs in `cdi_dir` and metadata under `metadata_dir`.
    ///
    /// # Errors
    /// `Invalid` when `driver` is not a DNS subdomain.
    pub fn new(cdi_dir: PathBuf, metadata_dir: PathBuf, driver: &str) -> Result<Self> {
        if !is_dns_subdomain(driver) {
            fail!(Invalid, "driver"; "driver {driver:?} is not a DNS subdomain");
        }
        Ok(CdiLayout {
            cdi_dir,
            metadata_dir,
            driver: driver.to_owned(),
        })
    }

    /// [`CdiLayout::new`] with the metadata where the kubelet plugin of `driver` keeps it:
    /// `<kubelet_dir>/plugins/<driver>/metadata`.
    ///
    /// # Errors
    /// As [`CdiLayout::new`].
    pub fn under_kubelet(cdi_dir: PathBuf, kubelet_dir: &Path, driver: &str) -> Result<Self> {
        let metadata = kubelet_dir.join("plugins").join(driver).join("metadata");
        Self::new(cdi_dir, metadata, driver)
    }

    /// The CDI kind: `<driver>/vfio`.
    pub fn kind(&self) -> String {
        format!("{}/{CDI_CLASS}", self.driver)
    }

    /// The spec file of claim `uid`.
    ///
    /// # Errors
    /// `Invalid` for a UID that cannot name a file.
    pub fn spec_path(&self, uid: &str) -> Result<PathBuf> {
        check_component("claim UID", uid)?;
        Ok(self.cdi_dir.join(format!("{}-{uid}.json", self.driver)))
    }

    /// The host directory of claim `uid`'s metadata files.
    ///
    /// # Errors
    /// `Invalid` for a UID that cannot name a file.
    pub fn claim_metadata_dir(&self, uid: &str) -> Result<PathBuf> {
        check_component("claim UID", uid)?;
        Ok(self.metadata_dir.join(uid))
    }

    /// The host file of `request`'s metadata of claim `uid`.
    fn metadata_file(&self, uid: &str, request: &str) -> Result<PathBuf> {
        check_component("request", request)?;
        Ok(self
            .claim_metadata_dir(uid)?
            .join(request)
            .join(format!("{}-metadata.json", self.driver)))
    }

    /// The spec of `claim` with `devices`, the metadata files it mounts (host path, text), and
    /// per device its CDI device IDs.
    ///
    /// # Errors
    /// `Invalid` for a UID or request that cannot name a file; `NotFound` for a device whose
    /// VFIO group is not known (a VM could not open it).
    pub fn render(&self, claim: &ClaimRef, devices: &[PreparedDevice]) -> Result<Rendered> {
        check_component("claim UID", &claim.uid)?;
        let kind = self.kind();
        let mut files = Vec::new();
        let mut cdi_devices = Vec::new();
        let mut ids = Vec::new();
        let mut mounted: Vec<&str> = Vec::new();
        for (i, d) in devices.iter().enumerate() {
            if d.vfio_devices.is_empty() {
                fail!(
                    NotFound, &d.device;
                    "device {} of request {}: its IOMMU group is not known, so there is no \
                     /dev/vfio node to give the VM",
                    d.device, d.request
                );
            }
            // /dev/vfio/vfio first: the container opens it before the group.
            let mut nodes: Vec<&String> = d.vfio_devices.iter().collect();
            nodes.sort_by_key(|p| p.as_str() != "/dev/vfio/vfio");
            let mut edits = json!({
                "deviceNodes": nodes.iter().map(|p| json!({ "path": p })).collect::<Vec<_>>(),
            });
            let request = metadata::base_request(&d.request);
            if !mounted.contains(&request) {
                mounted.push(request);
                let host = self.metadata_file(&claim.uid, request)?;
                let object = metadata::device_metadata(claim, &self.driver, request, devices);
                if let Some(o) = edits.as_object_mut() {
                    o.insert(
                        "mounts".to_owned(),
                        json!([{
                            "hostPath": host.display().to_string(),
                            "containerPath": metadata::container_path(claim, request, &self.driver),
                            "options": ["ro", "nosuid", "nodev", "bind"],
                        }]),
                    );
                }
                files.push((host, metadata::render(&object)));
            }
            let name = format!("{}-{i}", claim.uid);
            ids.push(vec![format!("{kind}={name}")]);
            cdi_devices.push(json!({ "name": name, "containerEdits": edits }));
        }
        let spec: Value = json!({
            "cdiVersion": CDI_VERSION,
            "kind": kind,
            "devices": cdi_devices,
        });
        let text = serde_json::to_string_pretty(&spec)
            .map_err(|e| IntegrationError::render("the CDI spec", e))?;
        Ok(Rendered {
            spec: text + "\n",
            files,
            device_ids: ids,
        })
    }

    /// Writes the metadata files and then the spec of `claim` (each atomically; files already
    /// holding the same text are left alone).
    ///
    /// # Errors
    /// [`CdiLayout::render`]'s; `State` when a directory or file cannot be written (what was
    /// written by this call is removed again).
    pub fn write(&self, claim: &ClaimRef, devices: &[PreparedDevice]) -> Result<Written> {
        let Rendered {
            spec,
            files,
            device_ids,
        } = self.render(claim, devices)?;
        let spec_path = self.spec_path(&claim.uid)?;
        let mut changed = false;
        let mut result = Ok(());
        for (path, text) in &files {
            result = self.write_metadata(path, text).map(|c| changed |= c);
            if result.is_err() {
                break;
            }
        }
        if result.is_ok() {
            result = self.write_spec(&spec_path, &spec).map(|c| changed |= c);
        }
        if let Err(e) = result {
            // Best effort: what a failed write leaves would only be found by this claim's
            // unprepare, which removes the same paths.
            let _ = self.remove(&claim.uid);
            return Err(e);
        }
        Ok(Written {
            device_ids,
            spec: spec_path,
            changed,
        })
    }

    /// Writes the spec file `path` (in [`CdiLayout::cdi_dir`]) unless it holds `text` already.
    fn write_spec(&self, path: &Path, text: &str) -> Result<bool> {
        let name = file_name(path)?;
        Dir::create_named(&self.cdi_dir)
            .and_then(|d| d.write_if_changed(name, text.as_bytes()))
            .map_err(|e| IntegrationError::state("cannot write", path, e))
    }

    /// Writes the metadata file `path` (below [`CdiLayout::metadata_dir`], as
    /// [`CdiLayout::render`] names it) unless it holds `text` already; the claim's and the
    /// request's directories are made below the metadata directory, never through a link.
    fn write_metadata(&self, path: &Path, text: &str) -> Result<bool> {
        let name = file_name(path)?;
        let rel = path
            .parent()
            .and_then(|p| p.strip_prefix(&self.metadata_dir).ok())
            .and_then(Path::to_str)
            .ok_or_else(|| {
                IntegrationError::state(
                    "cannot write",
                    path,
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "not below the metadata directory",
                    ),
                )
            })?;
        Dir::create_named(&self.metadata_dir)
            .and_then(|d| d.create_sub(rel))
            .and_then(|d| d.write_if_changed(name, text.as_bytes()))
            .map_err(|e| IntegrationError::state("cannot write", path, e))
    }

    /// Removes the spec and the metadata files of claim `uid`; what is not there is no error.
    ///
    /// # Errors
    /// `Invalid` for a UID that cannot name a file; `State` when a file cannot be removed.
    pub fn remove(&self, uid: &str) -> Result<()> {
        let spec = self.spec_path(uid)?;
        let name = file_name(&spec)?;
        match Dir::named(&self.cdi_dir) {
            Ok(Some(d)) => {
                d.remove(name)
                    .map_err(|e| IntegrationError::state("cannot remove CDI spec", &spec, e))?;
            }
            Ok(None) => {}
            Err(e) => return Err(IntegrationError::state("cannot remove CDI spec", &spec, e)),
        }
        let dir = self.claim_metadata_dir(uid)?;
        match Dir::named(&self.metadata_dir) {
            Ok(Some(d)) => d
                .remove_tree(uid)
                .map(|_| ())
                .map_err(|e| IntegrationError::state("cannot remove device metadata", dir, e)),
            Ok(None) => Ok(()),
            Err(e) => Err(IntegrationError::state(
                "cannot remove device metadata",
                dir,
                e,
            )),
        }
    }
}

/// The file name of a path this module made (always one).
fn file_name(path: &Path) -> Result<&str> {
    path.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
        IntegrationError::state(
            "cannot write",
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b0d6a3c-5c1e-4c57-9d2a-111111111111";

    fn layout(dir: &Path) -> CdiLayout {
        CdiLayout::new(dir.join("cdi"), dir.join("meta"), "gpu.gpuslice.dev").expect("layout")
    }

    fn claim() -> ClaimRef {
        ClaimRef {
            name: "vm-gpu".to_owned(),
            namespace: "default".to_owned(),
            uid: UID.to_owned(),
            pod_claim_name: None,
            guest: serde_json::Map::new(),
        }
    }

    fn gpu(group: Option<u32>) -> PreparedDevice {
        PreparedDevice {
            request: "gpu".to_owned(),
            pool: "node-a".to_owned(),
            device: "gpu-0000-3b-00-0".to_owned(),
            pci_address: Some("0000:3b:00.0".parse().expect("address")),
            mdev_uuid: None,
            iommu_group: group,
            vfio_devices: group
                .map(|g| vec![format!("/dev/vfio/{g}"), "/dev/vfio/vfio".to_owned()])
                .unwrap_or_default(),
            found: false,
        }
    }

    #[test]
    fn a_claim_gets_one_spec_with_its_vfio_nodes_and_the_metadata_mount() {
        let t = tempfile::tempdir().expect("tempdir");
        let l = layout(t.path());
        let w = l.write(&claim(), &[gpu(Some(12))]).expect("write");
        assert!(w.changed);
        assert_eq!(
            w.device_ids,
            vec![vec![format!("gpu.gpuslice.dev/vfio={UID}-0")]]
        );
        let spec: Value =
            serde_json::from_str(&std::fs::read_to_string(&w.spec).expect("spec")).expect("json");
        assert_eq!(spec["cdiVersion"], CDI_VERSION);
        assert_eq!(spec["kind"], "gpu.gpuslice.dev/vfio");
        let edits = &spec["devices"][0]["containerEdits"];
        assert_eq!(edits["deviceNodes"][0]["path"], "/dev/vfio/vfio");
        assert_eq!(edits["deviceNodes"][1]["path"], "/dev/vfio/12");
        let mount = &edits["mounts"][0];
        assert_eq!(
            mount["containerPath"],
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-gpu/gpu/gpu.gpuslice.dev-metadata.json"
        );
        let host = PathBuf::from(mount["hostPath"].as_str().expect("host path"));
        let meta: Value =
            serde_json::from_str(&std::fs::read_to_string(&host).expect("metadata")).expect("json");
        assert_eq!(
            meta["requests"][0]["devices"][0]["attributes"]["resource.kubernetes.io/pciBusID"]["string"],
            "0000:3b:00.0"
        );
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(t.path().join("cdi"))
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn writing_the_same_claim_again_writes_nothing_and_remove_takes_everything_away() {
        let t = tempfile::tempdir().expect("tempdir");
        let l = layout(t.path());
        let first = l.write(&claim(), &[gpu(Some(12))]).expect("write");
        let again = l.write(&claim(), &[gpu(Some(12))]).expect("write");
        assert!(!again.changed);
        assert_eq!(first.device_ids, again.device_ids);
        l.remove(UID).expect("remove");
        assert!(!first.spec.exists());
        assert!(!t.path().join("meta").join(UID).exists());
        l.remove(UID).expect("a second remove is no error");
    }

    #[test]
    fn a_device_without_a_vfio_group_or_a_uid_that_is_a_path_writes_nothing() {
        let t = tempfile::tempdir().expect("tempdir");
        let l = layout(t.path());
        let e = l.write(&claim(), &[gpu(None)]).expect_err("no group");
        assert!(e.to_string().contains("IOMMU group"), "{e}");
        let mut bad = claim();
        bad.uid = "../etc".to_owned();
        let e = l.write(&bad, &[gpu(Some(1))]).expect_err("bad uid");
        assert!(e.to_string().contains("claim UID"), "{e}");
        assert!(!t.path().join("cdi").exists());
        assert!(CdiLayout::new(t.path().into(), t.path().into(), "Not_A_Driver").is_err());
    }

    /// Runs `f` on another thread; a call that has not answered in 10 s fails the test (a FIFO
    /// opened by mistake blocks forever).
    fn promptly<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the call blocked")
    }

    #[test]
    fn a_link_planted_at_the_metadata_directory_is_refused_naming_it_and_nothing_lands_outside() {
        let t = tempfile::tempdir().expect("tempdir");
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).expect("outside");
        std::os::unix::fs::symlink(&outside, t.path().join("meta")).expect("link");
        let l = layout(t.path());
        let e = l.write(&claim(), &[gpu(Some(12))]).expect_err("a link");
        assert!(e.to_string().contains("meta is a link"), "{e}");
        assert_eq!(std::fs::read_dir(&outside).expect("dir").count(), 0);
        assert!(
            !t.path()
                .join("cdi")
                .join(format!("gpu.gpuslice.dev-{UID}.json"))
                .exists()
        );
    }

    #[test]
    fn a_link_planted_at_a_claims_metadata_directory_is_refused_and_removal_does_not_follow_it() {
        let t = tempfile::tempdir().expect("tempdir");
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).expect("outside");
        std::fs::write(outside.join("keep"), "x").expect("keep");
        std::fs::create_dir(t.path().join("meta")).expect("meta");
        std::os::unix::fs::symlink(&outside, t.path().join("meta").join(UID)).expect("link");
        let l = layout(t.path());
        let e = l.write(&claim(), &[gpu(Some(12))]).expect_err("a link");
        assert!(e.to_string().contains(&format!("{UID} is a link")), "{e}");
        assert_eq!(std::fs::read_dir(&outside).expect("dir").count(), 1);
        l.remove(UID).expect("the link itself is removed");
        assert!(outside.join("keep").exists());
        assert!(!t.path().join("meta").join(UID).exists());
    }

    #[test]
    fn a_link_planted_at_the_old_guessable_temporary_name_is_left_alone_with_its_target() {
        let t = tempfile::tempdir().expect("tempdir");
        let victim = t.path().join("victim");
        std::fs::write(&victim, "keep").expect("victim");
        let cdi = t.path().join("cdi");
        std::fs::create_dir(&cdi).expect("cdi");
        let name = format!("gpu.gpuslice.dev-{UID}.json");
        let planted = cdi.join(format!(".{name}.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).expect("link");
        let w = layout(t.path())
            .write(&claim(), &[gpu(Some(12))])
            .expect("write");
        assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "keep");
        assert!(
            planted
                .symlink_metadata()
                .expect("still there")
                .file_type()
                .is_symlink()
        );
        let spec = w.spec.symlink_metadata().expect("spec");
        assert!(
            spec.file_type().is_file(),
            "the spec is a file, not the link"
        );
    }

    #[test]
    fn a_fifo_at_the_spec_path_is_refused_promptly_naming_it() {
        let t = tempfile::tempdir().expect("tempdir");
        let cdi = t.path().join("cdi");
        std::fs::create_dir(&cdi).expect("cdi");
        let fifo = cdi.join(format!("gpu.gpuslice.dev-{UID}.json"));
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let l = layout(t.path());
        let e = promptly(move || l.write(&claim(), &[gpu(Some(12))]).expect_err("a FIFO"));
        assert!(
            e.to_string()
                .contains(&format!("gpu.gpuslice.dev-{UID}.json is a FIFO")),
            "{e}"
        );
    }
}
