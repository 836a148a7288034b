//! The PCI scan: every function under `sys/bus/pci/devices`, read lazily so that a host with
//! hundreds of VFs costs about one read per fact discovery actually needs.

use std::collections::{BTreeMap, BTreeSet};

use gpu_core::{ClassCode, Function, Gpu, Link, PciAddress, Sriov, Vendor};

use super::parse;
use super::read;
use crate::host::Host;
use crate::link::{LinkFile, LinkFiles};

/// The bus view every PCI function is listed in.
pub(crate) const PCI_DEVICES: &str = "sys/bus/pci/devices";

/// One PCI function and the facts read about it so far (`None` = not read yet).
#[derive(Debug, Default)]
pub(crate) struct Func {
    class: Option<Option<ClassCode>>,
    vendor: Option<Option<u16>>,
    device: Option<Option<u16>>,
    driver: Option<Option<String>>,
    physfn: Option<Option<PciAddress>>,
    pub warnings: Vec<String>,
}

/// All PCI functions of the host, in numeric address order.
#[derive(Debug)]
pub(crate) struct PciTable<'h> {
    pub host: &'h dyn Host,
    pub funcs: BTreeMap<PciAddress, Func>,
    /// The link files of each GPU read, for the health grading to reuse.
    pub links: BTreeMap<PciAddress, LinkFiles>,
}

/// The directory of a function in the bus view.
pub(crate) fn dir(addr: &PciAddress) -> String {
    format!("{PCI_DEVICES}/{addr}")
}

/// The path of one attribute of a function in the bus view (one allocation).
pub(crate) fn attr(addr: &PciAddress, name: &str) -> String {
    format!("{PCI_DEVICES}/{addr}/{name}")
}

impl<'h> PciTable<'h> {
    /// Takes the bus listing; attributes are read on demand.
    pub fn scan(host: &'h dyn Host, entries: &[String], node_warnings: &mut Vec<String>) -> Self {
        let mut funcs = BTreeMap::new();
        for e in entries {
            match e.parse::<PciAddress>() {
                Ok(a) => {
                    funcs.insert(a, Func::default());
                }
                Err(err) => node_warnings.push(format!("{PCI_DEVICES}/{e}: {err}")),
            }
        }
        PciTable {
            host,
            funcs,
            links: BTreeMap::new(),
        }
    }

    fn func(&mut self, a: &PciAddress) -> &mut Func {
        self.funcs.entry(*a).or_default()
    }

    /// The function's class, read once.
    pub fn class(&mut self, a: &PciAddress) -> Option<ClassCode> {
        let host = self.host;
        let f = self.func(a);
        if f.class.is_none() {
            f.class = Some(read::parsed(
                host,
                &attr(a, "class"),
                &mut f.warnings,
                read::class,
            ));
        }
        f.class.flatten()
    }

    /// The vendor ID, read once.
    pub fn vendor(&mut self, a: &PciAddress) -> Option<u16> {
        let host = self.host;
        let f = self.func(a);
        if f.vendor.is_none() {
            f.vendor = Some(read::parsed(
                host,
                &attr(a, "vendor"),
                &mut f.warnings,
                read::hex16,
            ));
        }
        f.vendor.flatten()
    }

    /// The device ID, read once.
    pub fn device(&mut self, a: &PciAddress) -> Option<u16> {
        let host = self.host;
        let f = self.func(a);
        if f.device.is_none() {
            f.device = Some(read::parsed(
                host,
                &attr(a, "device"),
                &mut f.warnings,
                read::hex16,
            ));
        }
        f.device.flatten()
    }

    /// The bound driver's name, read once.
    pub fn driver(&mut self, a: &PciAddress) -> Option<String> {
        let host = self.host;
        let f = self.func(a);
        if f.driver.is_none() {
            f.driver = Some(read::link_name(host, &attr(a, "driver"), &mut f.warnings));
        }
        f.driver.clone().flatten()
    }

    /// The PF of a VF, read once; `None` for a function that is not a VF.
    pub fn physfn(&mut self, a: &PciAddress) -> Option<PciAddress> {
        let host = self.host;
        let f = self.func(a);
        if f.physfn.is_none() {
            let name = read::link_name(host, &attr(a, "physfn"), &mut f.warnings);
            let pf = match name.map(|n| n.parse::<PciAddress>()) {
                Some(Ok(p)) => Some(p),
                Some(Err(e)) => {
                    f.warnings.push(format!("{}: {e}", attr(a, "physfn")));
                    None
                }
                None => None,
            };
            f.physfn = Some(pf);
        }
        f.physfn.flatten()
    }

    /// Records what a PF's `virtfnN` links say, so VFs need no `physfn` read of their own.
    pub fn set_physfn(&mut self, vf: &PciAddress, pf: PciAddress) {
        self.func(vf).physfn = Some(Some(pf));
    }

    /// Takes the warnings collected on a function.
    pub fn take_warnings(&mut self, a: &PciAddress) -> Vec<String> {
        self.funcs
            .get_mut(a)
            .map(|f| std::mem::take(&mut f.warnings))
            .unwrap_or_default()
    }

    /// All function addresses, in numeric order.
    pub fn addresses(&self) -> Vec<PciAddress> {
        self.funcs.keys().copied().collect()
    }

    /// True when a PF's `virtfnN` link already named this function as its VF.
    pub fn known_vf(&self, a: &PciAddress) -> bool {
        self.funcs
            .get(a)
            .is_some_and(|f| matches!(f.physfn, Some(Some(_))))
    }

    /// Reads everything a GPU entry needs: the GPU and the names in its directory, or `None`
    /// when the function turns out to be a VF (it has a `physfn` link).
    pub fn read_gpu(&mut self, a: &PciAddress) -> Option<(Gpu, BTreeSet<String>)> {
        let host = self.host;
        let d = dir(a);
        let mut w: Vec<String> = Vec::new();
        let entries: BTreeSet<String> = read::list(host, &d, &mut w).into_iter().collect();
        if entries.contains("physfn") {
            let pf = self.physfn(a);
            if pf.is_some() {
                return None;
            }
        } else {
            self.func(a).physfn = Some(None);
        }
        let has = |n: &str| entries.contains(n);
        let vendor = self.vendor(a).unwrap_or(0);
        let device = self.device(a).unwrap_or(0);
        let class = self.class(a).unwrap_or_default();
        let mut g = Gpu::new(String::new(), *a, vendor, device, class.0);
        if has("subsystem_vendor") {
            g.subsystem_vendor_id =
                read::parsed(host, &format!("{d}/subsystem_vendor"), &mut w, read::hex16)
                    .map(gpu_core::PciId);
        }
        if has("subsystem_device") {
            g.subsystem_device_id =
                read::parsed(host, &format!("{d}/subsystem_device"), &mut w, read::hex16)
                    .map(gpu_core::PciId);
        }
        g.model = model_name(vendor, device, g.subsystem_vendor_id, g.subsystem_device_id);
        g.driver = self.driver(a);
        if has("numa_node") {
            g.numa_node = read::parsed(
                host,
                &format!("{d}/numa_node"),
                &mut w,
                parse::parse_numa_node,
            )
            .flatten();
        }
        if has("iommu_group") {
            g.iommu_group = match read::link_name(host, &format!("{d}/iommu_group"), &mut w) {
                Some(n) => match n.parse() {
                    Ok(v) => Some(v),
                    Err(_) => {
                        w.push(format!("{d}/iommu_group: group {n:?} is not a number"));
                        None
                    }
                },
                None => None,
            };
        }
        if has("boot_vga") {
            g.boot_vga = read::text(host, &format!("{d}/boot_vga"), &mut w).as_deref() == Some("1");
        }
        let files = LinkFiles::read(host, &d, Some(&entries));
        g.link = link_state(&d, &files, &mut w);
        self.links.insert(*a, files);
        if has("sriov_totalvfs") {
            let total = read::parsed(
                host,
                &format!("{d}/sriov_totalvfs"),
                &mut w,
                parse::parse_u32,
            );
            let num = read::parsed(host, &format!("{d}/sriov_numvfs"), &mut w, parse::parse_u32);
            let mut vfs: Vec<(u32, PciAddress)> = Vec::new();
            for e in entries.iter().filter(|e| e.starts_with("virtfn")) {
                let Ok(n) = e["virtfn".len()..].parse::<u32>() else {
                    continue;
                };
                let path = format!("{d}/{e}");
                match read::link_name(host, &path, &mut w).map(|s| s.parse::<PciAddress>()) {
                    Some(Ok(vf)) => vfs.push((n, vf)),
                    Some(Err(err)) => w.push(format!("{path}: {err}")),
                    None => {}
                }
            }
            // virtfn10 comes after virtfn9: order by the number, not the text.
            vfs.sort_by_key(|(n, _)| *n);
            for (_, vf) in &vfs {
                self.set_physfn(vf, *a);
            }
            let vfs: Vec<PciAddress> = vfs.into_iter().map(|(_, v)| v).collect();
            // What the VFs themselves report wins; the capability's field covers no VFs yet.
            let vf_device_id = vfs
                .first()
                .and_then(|vf| self.device(vf))
                .or_else(|| {
                    has("sriov_vf_device")
                        .then(|| {
                            read::parsed(host, &format!("{d}/sriov_vf_device"), &mut w, read::hex16)
                        })
                        .flatten()
                })
                .map(gpu_core::PciId);
            g.sriov = Some(Sriov {
                total_vfs: total.unwrap_or(0),
                num_vfs: num.unwrap_or(vfs.len() as u32),
                vfs,
                vf_device_id,
                ..Sriov::default()
            });
        }
        g.vendor = Vendor::from_pci_id(vendor);
        let mut own = self.take_warnings(a);
        own.append(&mut w);
        g.warnings = own;
        Some((g, entries))
    }

    /// The companion functions of a GPU: same slot, same vendor, not a GPU themselves.
    pub fn companions(&mut self, gpu: &PciAddress, vendor: u16) -> Vec<Function> {
        let same_slot: Vec<PciAddress> = self
            .funcs
            .range(PciAddress::new(gpu.domain(), gpu.bus(), gpu.device(), 0).unwrap_or(*gpu)..)
            .take_while(|(a, _)| a.same_slot(gpu))
            .map(|(a, _)| *a)
            .collect();
        let mut out = Vec::new();
        for a in same_slot {
            // VFs in the card's slot are its parents, not companion functions.
            if a == *gpu || self.known_vf(&a) || self.class(&a).is_some_and(|c| c.is_gpu()) {
                continue;
            }
            if self.vendor(&a) != Some(vendor) {
                continue;
            }
            out.push(Function {
                address: a,
                class: self.class(&a).unwrap_or_default(),
                device_id: gpu_core::PciId(self.device(&a).unwrap_or(0)),
                driver: self.driver(&a),
            });
        }
        out
    }
}

/// The link state of the files in `d`, with a warning for each that cannot be read or parsed;
/// `None` when the function has none of them.
fn link_state(d: &str, files: &LinkFiles, w: &mut Vec<String>) -> Option<Link> {
    fn value<T>(
        d: &str,
        name: &str,
        f: &LinkFile,
        w: &mut Vec<String>,
        parse: fn(&str, &str) -> Result<Option<T>, crate::SysfsError>,
    ) -> Option<T> {
        let path = format!("{d}/{name}");
        match f {
            LinkFile::Absent => None,
            LinkFile::Unreadable(e) => {
                w.push(format!("{path}: {e}"));
                None
            }
            LinkFile::Text(t) => parse(t, &path).unwrap_or_else(|e| {
                w.push(e.to_string());
                None
            }),
        }
    }
    let [cw, mw, cs, ms] = LinkFiles::NAMES;
    let link = Link {
        current_width: value(d, cw, &files.current_width, w, parse::parse_link_width),
        max_width: value(d, mw, &files.max_width, w, parse::parse_link_width),
        current_speed_gts: value(d, cs, &files.current_speed, w, parse::parse_link_speed),
        max_speed_gts: value(d, ms, &files.max_speed, w, parse::parse_link_speed),
    };
    let any = [
        &files.current_width,
        &files.max_width,
        &files.current_speed,
        &files.max_speed,
    ]
    .iter()
    .any(|f| **f != LinkFile::Absent);
    any.then_some(link)
}

/// The model name from the PCI ID database: the chip's name, followed by the board's name when
/// the database knows these subsystem IDs (`MGA G200EH (iLO4)`); empty when unknown.
pub(crate) fn model_name(
    vendor: u16,
    device: u16,
    sub_vendor: Option<gpu_core::PciId>,
    sub_device: Option<gpu_core::PciId>,
) -> String {
    let subsystem = sub_vendor.zip(sub_device).map(|(v, d)| (v.0, d.0));
    match super::pci_names::lookup(vendor, device, subsystem) {
        None => String::new(),
        Some((chip, None)) => chip.to_owned(),
        Some((chip, Some(board))) if board.contains(chip) => board.to_owned(),
        Some((chip, Some(board))) => format!("{chip} ({board})"),
    }
}
