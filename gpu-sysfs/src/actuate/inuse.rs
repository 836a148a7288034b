//! Is a device's VFIO node open by a process?
//!
//! A VM holds a device through `/dev/vfio/<iommu group>` (legacy group interface) or
//! `/dev/vfio/devices/vfioN` (the per-device cdev). Removing an mdev, clearing a VF or unbinding a
//! function a VM holds either blocks in the kernel until the VM lets go, or takes the device from
//! under a running guest; both lose the user's VM. So the file descriptors of every process
//! (`/proc/<pid>/fd/*`, links to what they have open) are checked first.

use std::collections::BTreeMap;

use gpu_core::{Instance, NodeTopology, PciAddress};
use serde::{Deserialize, Serialize};

use super::{ActuateError, Result, link_name};
use crate::host::Host;

/// A process holding a VFIO node open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    /// Process ID.
    pub pid: u32,
    /// Its command name (`/proc/<pid>/comm`), when readable.
    pub command: Option<String>,
    /// The node it has open (`/dev/vfio/7`).
    pub node: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.command {
            Some(c) => write!(f, "pid {} ({c})", self.pid),
            None => write!(f, "pid {}", self.pid),
        }
    }
}

/// The `/dev/vfio` nodes through which a device can be opened: its IOMMU group's node and its
/// VFIO cdev, from the device directory `dir` (`sys/bus/pci/devices/<bdf>`, `sys/bus/mdev/devices/<uuid>`).
pub fn vfio_nodes(host: &dyn Host, dir: &str) -> Vec<String> {
    let mut nodes = Vec::new();
    if let Some(g) = link_name(host, &format!("{dir}/iommu_group")) {
        nodes.push(format!("/dev/vfio/{g}"));
    }
    if let Ok(entries) = host.list(&format!("{dir}/vfio-dev")) {
        for e in entries.into_iter().filter(|e| e.starts_with("vfio")) {
            nodes.push(format!("/dev/vfio/devices/{e}"));
        }
    }
    nodes
}

/// The first process that has one of the device's VFIO nodes open, if any. Processes that vanish
/// or cannot be read while scanning are skipped; a host without `/proc` under the root has none.
pub fn holder_of(host: &dyn Host, dir: &str) -> Option<Holder> {
    let nodes = vfio_nodes(host, dir);
    if nodes.is_empty() {
        return None;
    }
    let mut found = None;
    scan_open_nodes(host, &nodes, |_, h| {
        found = Some(h);
        false
    });
    found
}

/// Walks `/proc/<pid>/fd/*` in pid order and calls `seen(i, holder)` for each open file that is
/// `nodes[i]`, until `seen` answers `false`. The one scan behind [`holder_of`] and
/// [`node_holders`].
fn scan_open_nodes(host: &dyn Host, nodes: &[String], mut seen: impl FnMut(usize, Holder) -> bool) {
    let Ok(entries) = host.list("proc") else {
        return;
    };
    let mut pids: Vec<u32> = entries.iter().filter_map(|p| p.parse().ok()).collect();
    pids.sort_unstable();
    for pid in pids {
        let Ok(fds) = host.list(&format!("proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds {
            let Ok(target) = host.read_link(&format!("proc/{pid}/fd/{fd}")) else {
                continue;
            };
            let t = target.to_string_lossy();
            if let Some(i) = nodes.iter().position(|n| **n == t) {
                let command = host.read_string(&format!("proc/{pid}/comm")).ok();
                let holder = Holder {
                    pid,
                    command,
                    node: nodes[i].clone(),
                };
                if !seen(i, holder) {
                    return;
                }
            }
        }
    }
}

/// The processes holding a node's whole GPUs and vGPU instances open, found in one scan of
/// `/proc` ([`node_holders`]): what `topology` and `gpu list` show under HOLDER, as `vgpu list`
/// does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeHolders {
    gpus: BTreeMap<PciAddress, Holder>,
    /// By mdev UUID or vendor-VFIO VF address, as text.
    instances: BTreeMap<String, Holder>,
}

/// An instance's key in [`NodeHolders`]: its mdev UUID, else its VF's address.
fn instance_key(i: &Instance) -> Option<String> {
    i.uuid
        .map(|u| u.to_string())
        .or_else(|| i.address.map(|a| a.to_string()))
}

impl NodeHolders {
    /// The process holding the whole GPU at `address` open.
    pub fn gpu(&self, address: &PciAddress) -> Option<&Holder> {
        self.gpus.get(address)
    }

    /// The process holding instance `i` open.
    pub fn instance(&self, i: &Instance) -> Option<&Holder> {
        self.instances.get(&instance_key(i)?)
    }

    /// True when nothing is held open.
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty() && self.instances.is_empty()
    }

    /// Adds `holder` to each GPU (`gpus[]`, by `address`) and each instance
    /// (`mediatedDevices.parents[].instances[]`) of a `NodeTopology` document held open: its
    /// keys stay, one is added.
    pub fn annotate_topology(&self, doc: &mut serde_json::Value) {
        if let Some(gpus) = doc.get_mut("gpus") {
            self.annotate_gpus(gpus);
        }
        let parents = doc
            .get_mut("mediatedDevices")
            .and_then(|m| m.get_mut("parents"))
            .and_then(serde_json::Value::as_array_mut);
        for p in parents.into_iter().flatten() {
            let instances = p
                .get_mut("instances")
                .and_then(serde_json::Value::as_array_mut);
            for i in instances.into_iter().flatten() {
                let key = ["uuid", "address"].iter().find_map(|k| {
                    i.get(*k)
                        .and_then(serde_json::Value::as_str)
                        .map(str::to_owned)
                });
                if let Some(h) = key.and_then(|k| self.instances.get(&k)) {
                    insert_holder(i, h);
                }
            }
        }
    }

    /// Adds `holder` to each GPU of a list of `Gpu` documents held open.
    pub fn annotate_gpus(&self, gpus: &mut serde_json::Value) {
        for g in gpus.as_array_mut().into_iter().flatten() {
            let address = g
                .get("address")
                .and_then(serde_json::Value::as_str)
                .and_then(|a| a.parse::<PciAddress>().ok());
            if let Some(h) = address.and_then(|a| self.gpus.get(&a)) {
                insert_holder(g, h);
            }
        }
    }
}

fn insert_holder(obj: &mut serde_json::Value, h: &Holder) {
    if let (Some(o), Ok(v)) = (obj.as_object_mut(), serde_json::to_value(h)) {
        o.insert("holder".to_owned(), v);
    }
}

/// `node` as a document (camelCase keys) with `holder` (`pid`, `command`, `node`) on each whole
/// GPU and vGPU instance a process holds open ([`node_holders`]): what `gpuslice topology -o
/// json` prints of a host, and what the bindings' `discover(holders)` returns.
pub fn held_topology(host: &dyn Host, node: &NodeTopology) -> serde_json::Value {
    let mut doc = serde_json::to_value(node).unwrap_or_default();
    node_holders(host, node).annotate_topology(&mut doc);
    doc
}

/// Which processes hold `node`'s whole GPUs and vGPU instances (mdevs, vendor-VFIO VFs) open
/// through their VFIO nodes, from one scan of `/proc` (as [`holder_of`] reads it). A root
/// without `/proc` (a recording) holds nothing.
pub fn node_holders(host: &dyn Host, node: &NodeTopology) -> NodeHolders {
    enum Of {
        Gpu(PciAddress),
        Instance(String),
    }
    let mut nodes: Vec<String> = Vec::new();
    let mut of: Vec<Of> = Vec::new();
    // Only a GPU bound to vfio-pci can be open through VFIO; the scan is skipped when no device
    // can be.
    for g in node
        .gpus
        .iter()
        .filter(|g| g.driver.as_deref() == Some("vfio-pci"))
    {
        for n in vfio_nodes(host, &super::pci_dir(&g.address)) {
            nodes.push(n);
            of.push(Of::Gpu(g.address));
        }
    }
    for p in &node.mediated_devices.parents {
        for i in &p.instances {
            let dir = match (i.uuid, i.address) {
                (Some(u), _) => format!("sys/bus/mdev/devices/{u}"),
                (None, Some(a)) => super::pci_dir(&a),
                (None, None) => continue,
            };
            let Some(key) = instance_key(i) else { continue };
            for n in vfio_nodes(host, &dir) {
                nodes.push(n);
                of.push(Of::Instance(key.clone()));
            }
        }
    }
    let mut out = NodeHolders::default();
    if nodes.is_empty() {
        return out;
    }
    scan_open_nodes(host, &nodes, |i, h| {
        match &of[i] {
            Of::Gpu(a) => {
                out.gpus.entry(*a).or_insert(h);
            }
            Of::Instance(k) => {
                out.instances.entry(k.clone()).or_insert(h);
            }
        }
        true
    });
    out
}

/// Fails with [`ActuateError::InUse`] when the device is held open, unless `force`.
pub(crate) fn refuse_if_open(host: &dyn Host, device: &str, dir: &str, force: bool) -> Result<()> {
    if force {
        return Ok(());
    }
    match holder_of(host, dir) {
        Some(h) => Err(ActuateError::InUse {
            device: device.to_owned(),
            holder: h.to_string(),
            node: h.node,
        }),
        None => Ok(()),
    }
}
