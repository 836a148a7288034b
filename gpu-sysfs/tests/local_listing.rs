//! Under `/` the reads below a PCI function resolve beneath the held bus listing
//! (`sys/bus/pci/devices`) and links are read below held directories: on this machine's own
//! sysfs every answer must be the one a plain open from `/` gives, whatever was held before it.

use std::io::ErrorKind;

use gpu_sysfs::{Host, RealHost};

const PCI: &str = "sys/bus/pci/devices";

/// The PCI functions of this machine, or `None` (with the reason printed) where there are none.
fn functions() -> Option<Vec<String>> {
    let mut names: Vec<String> = match std::fs::read_dir(format!("/{PCI}")) {
        Ok(d) => d
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect(),
        Err(e) => {
            println!("SKIPPED: /{PCI} cannot be listed here: {e}");
            return None;
        }
    };
    if names.is_empty() {
        println!("SKIPPED: this machine has no PCI functions");
        return None;
    }
    names.sort();
    Some(names)
}

/// Asserts that our answer for `path` is the plain one: the same value, or an error of the same
/// kind.
fn same<T: PartialEq + std::fmt::Debug>(
    path: &str,
    ours: std::io::Result<T>,
    theirs: std::io::Result<T>,
) {
    assert_eq!(
        ours.is_ok(),
        theirs.is_ok(),
        "{path}: {ours:?} against {theirs:?}"
    );
    match (ours, theirs) {
        (Ok(ours), Ok(theirs)) => assert_eq!(ours, theirs, "{path}"),
        (Err(ours), Err(theirs)) => assert_eq!(ours.kind(), theirs.kind(), "{path}"),
        _ => {}
    }
}

#[test]
fn reads_below_the_bus_listing_give_what_a_plain_open_gives() {
    let Some(names) = functions() else { return };
    let host = RealHost::new("/").unwrap();
    // Twice: the first pass opens the listing and the functions' directories, the second
    // reads through what is held.
    for _ in 0..2 {
        for n in &names {
            for attr in [
                "class",
                "vendor",
                "device",
                "subsystem_vendor",
                "subsystem_device",
            ] {
                let path = format!("{PCI}/{n}/{attr}");
                same(&path, host.read(&path), std::fs::read(format!("/{path}")));
            }
        }
    }
}

#[test]
fn links_below_held_directories_read_as_from_the_root() {
    let Some(names) = functions() else { return };
    let host = RealHost::new("/").unwrap();
    for n in &names {
        // A read first, so the listing (and, after a few, the function's directory) is held.
        let _ = host.read(&format!("{PCI}/{n}/class"));
        for link in ["driver", "iommu_group", "physfn", "subsystem"] {
            let path = format!("{PCI}/{n}/{link}");
            same(
                &path,
                host.read_link(&path),
                std::fs::read_link(format!("/{path}")),
            );
        }
    }
    // A function that is not there is not there, held listing or not.
    let missing = format!("{PCI}/ffff:ff:1f.7/class");
    assert_eq!(host.read(&missing).unwrap_err().kind(), ErrorKind::NotFound);
    let missing_link = format!("{PCI}/ffff:ff:1f.7/driver");
    assert_eq!(
        host.read_link(&missing_link).unwrap_err().kind(),
        ErrorKind::NotFound
    );
}
