//! Remembered vendor-VFIO type names.
//!
//! A full GPU lists no creatable types, so the type of an existing VF is a bare number that
//! discovery can name only through a resolver (NVML). Without one, an apply would not recognize
//! its own work and would re-create it every time, as NVIDIA's tool does. So every name gpuslice
//! sees listed (or sets) is remembered in `run/gpuslice/vgpu-type-names.json` under the root. `/run`
//! is cleared at boot, exactly when VF types are (type IDs also change only with the driver, which
//! clears every VF), so the memory never outlives the numbering it describes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use gpu_core::{NodeTopology, PciAddress, VgpuFramework};

use crate::resolver::{TypeInfo, TypeNameResolver};

/// Where the names are kept, relative to the host root.
pub const NAMES_PATH: &str = "run/gpuslice/vgpu-type-names.json";

/// Type ID → name, as remembered, consulted after an optional resolver.
#[derive(Debug, Clone, Default)]
pub struct RememberedNames {
    names: BTreeMap<u32, String>,
    inner: Option<Arc<dyn TypeNameResolver>>,
}

impl RememberedNames {
    /// The names remembered under `root` (none when the file is missing or unreadable: it is
    /// only a memory, and discovery reports what stays unnamed). The file is read through the
    /// confined reader ([`crate::atomic::Dir::read`]): bounded, only a regular file, never
    /// through a link.
    pub fn load(root: &Path, inner: Option<Arc<dyn TypeNameResolver>>) -> Self {
        let (dir, name) = NAMES_PATH.rsplit_once('/').unwrap_or(("", NAMES_PATH));
        let names = crate::atomic::Dir::open(root)
            .and_then(|r| r.sub(dir))
            .ok()
            .flatten()
            .and_then(|d| d.read(name, MAX_NAMES_BYTES).ok().flatten())
            .and_then(|b| parse(&b))
            .unwrap_or_default();
        RememberedNames { names, inner }
    }

    /// The names remembered on `host`, read through the host (confined to its root; a recording
    /// or a host without the file remembers none), consulted after `inner`.
    pub fn read(host: &dyn crate::host::Host, inner: Option<Arc<dyn TypeNameResolver>>) -> Self {
        let names = host
            .read_bounded(NAMES_PATH, MAX_NAMES_BYTES)
            .ok()
            .and_then(|b| parse(&b))
            .unwrap_or_default();
        RememberedNames { names, inner }
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Learns the names of the vendor-VFIO types `topology` lists or names; true when any is new.
    pub fn learn(&mut self, topology: &NodeTopology) -> bool {
        let mut changed = false;
        for p in &topology.mediated_devices.parents {
            if p.framework != VgpuFramework::VendorVfio {
                continue;
            }
            let listed = p.profiles.iter().map(|pr| (&pr.id, Some(&pr.name)));
            let held = p
                .instances
                .iter()
                .map(|i| (&i.profile, i.profile_name.as_ref()));
            for (id, name) in listed.chain(held) {
                if let (Some(n), Some(name)) = (id.vendor_vfio_number(), name) {
                    if self.names.get(&n) != Some(name) {
                        self.names.insert(n, name.clone());
                        changed = true;
                    }
                }
            }
        }
        changed
    }

    /// Every remembered type number and its name.
    pub fn names(&self) -> &BTreeMap<u32, String> {
        &self.names
    }

    /// The remembered number whose name is exactly `name` (prefixes `NVIDIA `/`GRID ` aside,
    /// no MIG suffix stripped).
    pub fn id_of_exact(&self, name: &str) -> Option<u32> {
        self.names
            .iter()
            .find(|(_, n)| gpu_core::nvidia::names_match(n, name))
            .map(|(id, _)| *id)
    }

    /// Remembers one name; true when it is new.
    pub fn remember(&mut self, id: u32, name: &str) -> bool {
        if self.names.get(&id).map(String::as_str) == Some(name) {
            return false;
        }
        self.names.insert(id, name.to_owned());
        true
    }

    /// Writes the memory to [`NAMES_PATH`] through the host's atomic writer
    /// ([`crate::host::Host::write_atomic`], on a real tree the one confined writer of [`crate::atomic`]: a
    /// reader never sees half, and nothing is written through a link).
    ///
    /// # Errors
    /// The I/O error.
    pub fn save(&self, host: &dyn crate::host::Host) -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(&self.names).map_err(std::io::Error::other)?;
        host.write_atomic(NAMES_PATH, &text)
    }
}

/// The largest names file read (a few hundred types of a few dozen bytes each fit many times).
const MAX_NAMES_BYTES: usize = 1 << 20;

/// The remembered names in `bytes`; names that are not a type's (empty, padded) are dropped, so
/// a hand-edited file cannot name a type in a way no command would accept.
fn parse(bytes: &[u8]) -> Option<BTreeMap<u32, String>> {
    let mut names = serde_json::from_slice::<BTreeMap<u32, String>>(bytes).ok()?;
    names.retain(|_, n| !n.is_empty() && n.trim() == n);
    Some(names)
}

impl TypeNameResolver for RememberedNames {
    fn resolve(&self, gpu: &PciAddress, id: u32) -> Option<TypeInfo> {
        if let Some(found) = self.inner.as_ref().and_then(|r| r.resolve(gpu, id)) {
            return Some(found);
        }
        self.names.get(&id).map(|name| TypeInfo {
            name: name.clone(),
            framebuffer_mib: gpu_core::nvidia::VgpuTypeName::parse(name)
                .ok()
                .map(|n| n.framebuffer_mib()),
            max_instances: None,
        })
    }

    fn supported(&self, gpu: &PciAddress) -> Option<Vec<(u32, TypeInfo)>> {
        self.inner.as_ref().and_then(|r| r.supported(gpu))
    }

    fn gpu_instances(&self, gpu: &PciAddress) -> crate::resolver::GpuInstances {
        match &self.inner {
            Some(r) => r.gpu_instances(gpu),
            None => crate::resolver::GpuInstances::Unsupported(
                "no NVML: the remembered names do not know GPU instances".to_owned(),
            ),
        }
    }
}
