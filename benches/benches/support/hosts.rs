//! The host shapes users have, as discovered trees: an L40S with 16 vendor-VFIO VFs, an A2 with
//! 16 mdev VFs, an 8-GPU H200 in MIG mode (16 VFs per GPU) and a whole-GPU passthrough host, on
//! the fake kernel, discovered through `gpu_health::open_node` (what the bindings' `discover`
//! calls). Shared by the `place` bench and the `host_trees` example that writes the trees for
//! the Python and Node benches.

use std::io;
use std::path::{Path, PathBuf};

use gpu_core::NodeTopology;
use gpu_sysfs::testing::{FakeKernel, fixtures};

/// A host tree held for as long as it is needed: the fake kernel or tree owns the directory.
pub enum HostTree {
    Kernel(Box<FakeKernel>),
    Tree(gpu_sysfs::testing::builder::Tree),
}

impl HostTree {
    /// The root standing for `/`.
    pub fn root(&self) -> &Path {
        match self {
            HostTree::Kernel(k) => k.root(),
            HostTree::Tree(t) => t.root(),
        }
    }
}

/// The four hosts, by short name.
///
/// # Errors
/// A tree that cannot be written.
pub fn host_trees() -> io::Result<Vec<(&'static str, HostTree)>> {
    Ok(vec![
        (
            "l40s",
            HostTree::Kernel(Box::new(FakeKernel::l40s_vendor_vfio_host(16)?)),
        ),
        (
            "a2",
            HostTree::Kernel(Box::new(FakeKernel::a2_mdev_host()?)),
        ),
        ("h200", HostTree::Tree(fixtures::h200_host(&[])?)),
        (
            "whole",
            HostTree::Kernel(Box::new(FakeKernel::passthrough_host()?)),
        ),
    ])
}

/// Discovers a tree as the bindings do.
///
/// # Errors
/// The discovery error, as text.
pub fn discover(root: &Path, node: &str) -> Result<NodeTopology, String> {
    gpu_health::open_node(root, &gpu_health::NodeRequest::new(node.to_owned()))
        .map(|c| c.topology)
        .map_err(|e| format!("discovering {}: {e}", root.display()))
}

/// The four hosts discovered, by short name.
///
/// # Errors
/// As [`host_trees`] and [`discover`].
pub fn discovered_hosts() -> Result<Vec<(&'static str, NodeTopology)>, String> {
    let trees = host_trees().map_err(|e| format!("writing the host trees: {e}"))?;
    trees
        .iter()
        .map(|(name, t)| discover(t.root(), "proto").map(|topo| (*name, topo)))
        .collect()
}

/// Copies the four trees into `dir/<name>` (symlinks kept as written), for other processes to
/// discover.
///
/// # Errors
/// A tree that cannot be written or copied.
pub fn write_host_trees(dir: &Path) -> Result<Vec<(&'static str, PathBuf)>, String> {
    let trees = host_trees().map_err(|e| format!("writing the host trees: {e}"))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut out = Vec::new();
    for (name, t) in &trees {
        let to = dir.join(name);
        if to.exists() {
            std::fs::remove_dir_all(&to).map_err(|e| format!("{}: {e}", to.display()))?;
        }
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(t.root())
            .arg(&to)
            .status()
            .map_err(|e| format!("cp: {e}"))?;
        if !status.success() {
            return Err(format!(
                "cp -a {} {} failed",
                t.root().display(),
                to.display()
            ));
        }
        out.push((*name, to));
    }
    Ok(out)
}
