//! Turns `data/pci.ids` (the PCI ID database's vendor, device and subsystem lines) into the
//! name table discovery reads: one text of every name and two sorted indexes of plain
//! little-endian integers into it. The table holds no pointers, so the loader relocates nothing
//! in it when a process starts, and a look-up touches only the few pages it reads.
//!
//! `pci_devices.bin`: per device, sorted by (vendor, device), five `u32`: the key
//! `vendor << 16 | device`, the name's offset and length in `pci_names.txt`, and the first
//! subsystem record and the number of them. `pci_subsystems.bin`: per subsystem, three `u32`:
//! `subvendor << 16 | subdevice`, the name's offset and length.

use std::error::Error;
use std::path::PathBuf;

struct Device {
    key: u32,
    name: (u32, u32),
    subsystems: Vec<(u32, (u32, u32))>,
}

fn hex4(s: &str) -> Option<u32> {
    if s.len() == 4 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        u32::from_str_radix(s, 16).ok()
    } else {
        None
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=data/pci.ids");
    println!("cargo:rerun-if-changed=build.rs");
    let text = std::fs::read_to_string("data/pci.ids")?;
    let mut names = String::new();
    let mut add = |name: &str| -> Result<(u32, u32), Box<dyn Error>> {
        let off = u32::try_from(names.len())?;
        names.push_str(name);
        Ok((off, u32::try_from(name.len())?))
    };
    let mut devices: Vec<Device> = Vec::new();
    let mut vendor: Option<u32> = None;
    for (n, line) in text.lines().enumerate() {
        let bad = || format!("data/pci.ids line {}: {line:?} is not a PCI ID line", n + 1);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(rest) = line.strip_prefix("\t\t") {
            // `\t\tSSSS SSSS  name`: a subsystem of the device before it.
            let (ids, name) = rest.split_once("  ").ok_or_else(bad)?;
            let (sv, sd) = ids.split_once(' ').ok_or_else(bad)?;
            let key = (hex4(sv).ok_or_else(bad)? << 16) | hex4(sd).ok_or_else(bad)?;
            let name = add(name)?;
            devices
                .last_mut()
                .ok_or_else(bad)?
                .subsystems
                .push((key, name));
        } else if let Some(rest) = line.strip_prefix('\t') {
            let (id, name) = rest.split_once("  ").ok_or_else(bad)?;
            let v = vendor.ok_or_else(bad)?;
            let key = (v << 16) | hex4(id).ok_or_else(bad)?;
            devices.push(Device {
                key,
                name: add(name)?,
                subsystems: Vec::new(),
            });
        } else if line.starts_with("C ") {
            // The class lists follow the vendors; they are not read.
            break;
        } else {
            let (id, _) = line.split_once("  ").ok_or_else(bad)?;
            vendor = Some(hex4(id).ok_or_else(bad)?);
        }
    }
    // A device listed twice keeps its first entry, as a reader going down the file would.
    devices.sort_by_key(|d| d.key);
    devices.dedup_by_key(|d| d.key);
    let mut dev_bin: Vec<u8> = Vec::with_capacity(devices.len() * 20);
    let mut sub_bin: Vec<u8> = Vec::new();
    let mut subs = 0u32;
    for d in &devices {
        let count = u32::try_from(d.subsystems.len())?;
        for v in [d.key, d.name.0, d.name.1, subs, count] {
            dev_bin.extend_from_slice(&v.to_le_bytes());
        }
        for (key, (off, len)) in &d.subsystems {
            for v in [*key, *off, *len] {
                sub_bin.extend_from_slice(&v.to_le_bytes());
            }
        }
        subs += count;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    std::fs::write(out.join("pci_names.txt"), &names)?;
    std::fs::write(out.join("pci_devices.bin"), &dev_bin)?;
    std::fs::write(out.join("pci_subsystems.bin"), &sub_bin)?;
    Ok(())
}
