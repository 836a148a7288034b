//! GPU vendors, their name families and the per-node naming rule.

use serde::{Deserialize, Serialize};

use crate::address::PciAddress;

/// A GPU vendor as far as gpuslice cares. JSON: `nvidia`, `amd`, `intel`, `matrox`, `aspeed`,
/// `other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    /// NVIDIA, PCI vendor `10de`.
    Nvidia,
    /// AMD/ATI, PCI vendor `1002`.
    Amd,
    /// Intel, PCI vendor `8086`.
    Intel,
    /// Matrox (server BMC VGA), PCI vendor `102b`.
    Matrox,
    /// ASPEED (server BMC VGA), PCI vendor `1a03`.
    Aspeed,
    /// Any other vendor.
    Other,
}

impl Vendor {
    /// The vendor of a PCI vendor ID.
    pub fn from_pci_id(id: u16) -> Self {
        match id {
            0x10de => Vendor::Nvidia,
            0x1002 => Vendor::Amd,
            0x8086 => Vendor::Intel,
            0x102b => Vendor::Matrox,
            0x1a03 => Vendor::Aspeed,
            _ => Vendor::Other,
        }
    }

    /// The vendor as the JSON spells it (`nvidia`, `amd`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
            Vendor::Intel => "intel",
            Vendor::Matrox => "matrox",
            Vendor::Aspeed => "aspeed",
            Vendor::Other => "other",
        }
    }

    /// The family prefix of per-node GPU names (`nvidia0`, `radeon0`, ...). AMD is `radeon`.
    pub fn family(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "radeon",
            Vendor::Intel => "intel",
            Vendor::Matrox => "matrox",
            Vendor::Aspeed => "aspeed",
            Vendor::Other => "gpu",
        }
    }

    /// Parses a vendor as users write it: `nvidia`, `amd`, `radeon`, `intel`, `matrox`, `aspeed`,
    /// or a PCI vendor ID (`10de`, `0x10de`). Case-insensitive.
    pub fn parse_loose(s: &str) -> Option<Self> {
        VendorRef::parse(s).map(|r| r.vendor)
    }

    /// The vendor whose family prefix is `family` (`radeon` → AMD).
    pub fn from_family(family: &str) -> Option<Self> {
        [
            Vendor::Nvidia,
            Vendor::Amd,
            Vendor::Intel,
            Vendor::Matrox,
            Vendor::Aspeed,
            Vendor::Other,
        ]
        .into_iter()
        .find(|v| v.family() == family)
    }
}

/// A vendor as a request writes it, parsed once: the vendor, and the exact PCI vendor ID when one
/// was written (`0x1af4` matches only that ID, though its vendor is [`Vendor::Other`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VendorRef {
    /// The vendor.
    pub vendor: Vendor,
    /// The PCI vendor ID written, when the text was one.
    pub pci_id: Option<u16>,
}

impl VendorRef {
    /// Parses `nvidia`, `amd`, `ati`, `radeon`, `intel`, `matrox`, `aspeed`, `other`, `gpu`, or a
    /// PCI vendor ID of four hexadecimal digits (`10de`, `0x10de`). Case-insensitive.
    pub fn parse(s: &str) -> Option<Self> {
        let t = s.trim().to_ascii_lowercase();
        let named = |vendor| {
            Some(VendorRef {
                vendor,
                pci_id: None,
            })
        };
        match t.as_str() {
            "nvidia" => named(Vendor::Nvidia),
            "amd" | "ati" | "radeon" => named(Vendor::Amd),
            "intel" => named(Vendor::Intel),
            "matrox" => named(Vendor::Matrox),
            "aspeed" => named(Vendor::Aspeed),
            "other" | "gpu" => named(Vendor::Other),
            _ => {
                let hex = t.strip_prefix("0x").unwrap_or(&t);
                if hex.len() != 4 {
                    return None;
                }
                let id = u16::from_str_radix(hex, 16).ok()?;
                Some(VendorRef {
                    vendor: Vendor::from_pci_id(id),
                    pci_id: Some(id),
                })
            }
        }
    }
}

/// Assigns per-node names: family prefix plus an index counted in numeric address order within
/// the family. Returns the names in the order of `gpus`.
pub fn assign_names(gpus: &[(PciAddress, Vendor)]) -> Vec<String> {
    let mut order: Vec<usize> = (0..gpus.len()).collect();
    order.sort_by_key(|&i| gpus[i].0);
    let mut counters: std::collections::BTreeMap<&'static str, u32> = Default::default();
    let mut names = vec![String::new(); gpus.len()];
    for i in order {
        let fam = gpus[i].1.family();
        let n = counters.entry(fam).or_insert(0);
        names[i] = format!("{fam}{n}");
        *n += 1;
    }
    names
}

/// Splits a per-node GPU name into family and index (`radeon1` → (`radeon`, 1)).
pub fn split_name(name: &str) -> Option<(&str, u32)> {
    let idx = name.find(|c: char| c.is_ascii_digit())?;
    let (fam, num) = name.split_at(idx);
    if fam.is_empty() || (num.len() > 1 && num.starts_with('0')) {
        return None;
    }
    Some((fam, num.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_address_order_per_family() {
        let a = |s: &str| s.parse::<PciAddress>().unwrap();
        let gpus = [
            (a("0000:0a:00.0"), Vendor::Nvidia),
            (a("0000:03:00.0"), Vendor::Amd),
            (a("0000:09:00.0"), Vendor::Nvidia),
            (a("0000:00:02.0"), Vendor::Intel),
            (a("0000:04:00.0"), Vendor::Amd),
            (a("0000:05:00.0"), Vendor::Other),
        ];
        assert_eq!(
            assign_names(&gpus),
            ["nvidia1", "radeon0", "nvidia0", "intel0", "radeon1", "gpu0"]
        );
    }

    #[test]
    fn vendor_parsing() {
        assert_eq!(Vendor::parse_loose("AMD"), Some(Vendor::Amd));
        assert_eq!(Vendor::parse_loose("radeon"), Some(Vendor::Amd));
        assert_eq!(Vendor::parse_loose("0x10de"), Some(Vendor::Nvidia));
        assert_eq!(Vendor::parse_loose("banana"), None);
        assert_eq!(Vendor::from_pci_id(0x1a03).family(), "aspeed");
        assert_eq!(split_name("radeon12"), Some(("radeon", 12)));
        assert_eq!(split_name("radeon"), None);
        assert_eq!(split_name("nvidia01"), None);
    }
}
