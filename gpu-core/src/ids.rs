//! Validated identities: mdev UUIDs, vGPU type IDs, vGPU parent IDs and sizes in MiB.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::address::PciAddress;
use crate::error::CoreError;

macro_rules! serde_via_string {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// The namespace of gpuslice's UUIDv5 derivations (a fixed, random UUID).
const GPUSLICE_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0x6f0c_7c1e_93a4_4d57_9a55_2b1e_8f3d_aa01);

/// The UUID of a mediated device, always in lowercase hyphenated form.
///
/// The kernel compares UUIDs case-insensitively (`EEXIST` for an upper-case duplicate) but lists
/// them in lowercase; keeping one form avoids two spellings of one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MdevUuid(uuid::Uuid);

impl MdevUuid {
    /// The stable UUID of a Machine's device: UUIDv5 of `machine`, `request` and `index`.
    ///
    /// Starting the same Machine again yields the same UUID, so the instance is re-created under
    /// the name the VM definition already uses.
    pub fn for_machine(machine: &str, request: &str, index: u32) -> Self {
        // NUL separators keep ("a", "b/c") and ("a/b", "c") apart.
        let name = format!("machine\0{machine}\0{request}\0{index}");
        Self(uuid::Uuid::new_v5(&GPUSLICE_NAMESPACE, name.as_bytes()))
    }

    /// The stable UUID of a slot in a declarative layout: UUIDv5 of node, GPU address and slot.
    pub fn for_layout_slot(node: &str, gpu: &PciAddress, slot: u32) -> Self {
        let name = format!("layout\0{node}\0{gpu}\0{slot}");
        Self(uuid::Uuid::new_v5(&GPUSLICE_NAMESPACE, name.as_bytes()))
    }

    /// The stable UUID of a slot in a declarative layout on a virtual mdev parent (the kernel's
    /// sample driver `mbochs`): UUIDv5 of node, parent name and slot. Kept apart from
    /// [`MdevUuid::for_layout_slot`], so a parent name never collides with a GPU address.
    pub fn for_named_parent_slot(node: &str, parent: &str, slot: u32) -> Self {
        let name = format!("layout-parent\0{node}\0{parent}\0{slot}");
        Self(uuid::Uuid::new_v5(&GPUSLICE_NAMESPACE, name.as_bytes()))
    }

    /// The underlying UUID.
    pub fn as_uuid(&self) -> &uuid::Uuid {
        &self.0
    }
}

impl FromStr for MdevUuid {
    type Err = CoreError;

    /// Accepts exactly the hyphenated 36-character form (either case), surrounding whitespace
    /// ignored; the kernel rejects every other form with `EINVAL`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let bad = || CoreError::InvalidUuid {
            input: s.to_owned(),
        };
        if t.len() != 36 {
            return Err(bad());
        }
        for (i, b) in t.bytes().enumerate() {
            let ok = if matches!(i, 8 | 13 | 18 | 23) {
                b == b'-'
            } else {
                b.is_ascii_hexdigit()
            };
            if !ok {
                return Err(bad());
            }
        }
        uuid::Uuid::parse_str(t).map(Self).map_err(|_| bad())
    }
}

impl fmt::Display for MdevUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.hyphenated())
    }
}
serde_via_string!(MdevUuid);

/// A vGPU type identifier as the host names it: an mdev type directory (`nvidia-746`,
/// `mbochs-small`) or a vendor-VFIO type number (`1155`).
///
/// Only `[A-Za-z0-9._-]` is allowed, not starting with `.`, so an ID can never name a path outside
/// its parent's type directory.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VgpuTypeId(String);

impl VgpuTypeId {
    /// The ID as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The decimal number of a vendor-VFIO type (`1155`), if the ID is one.
    pub fn vendor_vfio_number(&self) -> Option<u32> {
        if self.0.bytes().all(|b| b.is_ascii_digit()) {
            self.0.parse().ok()
        } else {
            None
        }
    }

    /// The ID of vendor-VFIO type number `n` (`1155`): a decimal number is always a valid ID, so
    /// this cannot fail.
    pub fn vendor_vfio(n: u32) -> Self {
        Self(n.to_string())
    }

    /// The numeric part after the last `-` (`nvidia-746` → 746), or the whole ID when numeric.
    pub fn number(&self) -> Option<u32> {
        self.vendor_vfio_number()
            .or_else(|| self.0.rsplit_once('-').and_then(|(_, n)| n.parse().ok()))
    }
}

impl VgpuTypeId {
    /// Builds an ID without validation; only for trusted constants in tests. Production code
    /// parses ([`FromStr`]) or builds a vendor-VFIO number ([`VgpuTypeId::vendor_vfio`]).
    #[doc(hidden)]
    pub fn from_str_unchecked(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl FromStr for VgpuTypeId {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let bad = |why| CoreError::InvalidTypeId {
            input: s.to_owned(),
            why,
        };
        if t.is_empty() {
            return Err(bad("empty"));
        }
        if t.len() > 128 {
            return Err(bad("longer than 128 characters"));
        }
        if t.starts_with('.') {
            return Err(bad("must not start with '.'"));
        }
        if !t
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(bad("only letters, digits, '-', '_' and '.' are allowed"));
        }
        Ok(Self(t.to_owned()))
    }
}

impl fmt::Display for VgpuTypeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
serde_via_string!(VgpuTypeId);

/// A vGPU parent: a PCI function (a GPU or one of its VFs) or a plain device name such as the
/// kernel sample driver `mbochs`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ParentId {
    /// A PCI function.
    Pci(PciAddress),
    /// A virtual device, named as in `/sys/class/mdev_bus/<name>`.
    Named(String),
}

impl ParentId {
    /// The PCI address, when the parent is a PCI function.
    pub fn pci(&self) -> Option<PciAddress> {
        match self {
            ParentId::Pci(a) => Some(*a),
            ParentId::Named(_) => None,
        }
    }
}

impl FromStr for ParentId {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if let Ok(a) = t.parse::<PciAddress>() {
            return Ok(ParentId::Pci(a));
        }
        let bad = |why| CoreError::InvalidParent {
            input: s.to_owned(),
            why,
        };
        if t.is_empty() {
            return Err(bad("empty"));
        }
        if t.contains(':') {
            return Err(bad("looks like a PCI address but is not a valid one"));
        }
        if t.starts_with('.') || t.len() > 128 {
            return Err(bad("not a valid device name"));
        }
        if !t
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(bad(
                "only letters, digits, '-', '_' and '.' are allowed in a device name",
            ));
        }
        Ok(ParentId::Named(t.to_owned()))
    }
}

impl fmt::Display for ParentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParentId::Pci(a) => a.fmt(f),
            ParentId::Named(n) => f.write_str(n),
        }
    }
}
serde_via_string!(ParentId);

/// A size in mebibytes. JSON carries a plain integer (`framebufferMiB: 4096`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct MiB(pub u64);

impl MiB {
    /// The value in MiB.
    pub fn get(self) -> u64 {
        self.0
    }

    /// Parses a quantity as orchestrators write it: `80Gi`, `512Mi`, `1Ti`, `4096M` (NVIDIA's
    /// `framebuffer=4096M` means MiB), `16G`, or a bare number of MiB.
    ///
    /// Decimal suffixes (`G` = 10^9 bytes only with the Kubernetes-style explicit `GB`) are not
    /// guessed at: `M` and `G` follow NVIDIA's binary meaning; `MB`/`GB` are decimal and rounded up.
    ///
    /// # Errors
    /// [`CoreError::InvalidSize`] naming the input.
    pub fn parse_quantity(s: &str) -> Result<Self, CoreError> {
        let t = s.trim();
        let bad = |why| CoreError::InvalidSize {
            input: s.to_owned(),
            why,
        };
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        if num.is_empty() {
            return Err(bad(
                "expected a number followed by an optional unit (Mi, Gi, Ti)",
            ));
        }
        let n: u64 = num.parse().map_err(|_| bad("number too large"))?;
        let mib = match unit.trim() {
            "" | "Mi" | "M" | "MiB" => Some(n),
            "Gi" | "G" | "GiB" => n.checked_mul(1024),
            "Ti" | "T" | "TiB" => n.checked_mul(1024 * 1024),
            "Ki" | "KiB" => Some(n.div_ceil(1024)),
            "MB" => n.checked_mul(1_000_000).map(|b| b.div_ceil(1 << 20)),
            "GB" => n.checked_mul(1_000_000_000).map(|b| b.div_ceil(1 << 20)),
            _ => return Err(bad("unknown unit (use Mi, Gi or Ti)")),
        };
        mib.map(MiB).ok_or_else(|| bad("size too large"))
    }
}

impl fmt::Display for MiB {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 >= 1024 && self.0 % 1024 == 0 {
            write!(f, "{}Gi", self.0 / 1024)
        } else {
            write!(f, "{}Mi", self.0)
        }
    }
}

/// Accepts a size as a number of MiB or a quantity string (`80Gi`).
pub(crate) mod quantity {
    use super::MiB;
    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Num(u64),
        Text(String),
    }

    pub fn serialize<S: Serializer>(v: &Option<MiB>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(m) => s.collect_str(m),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<MiB>, D::Error> {
        match Option::<Raw>::deserialize(d)? {
            None => Ok(None),
            Some(Raw::Num(n)) => Ok(Some(MiB(n))),
            Some(Raw::Text(t)) => MiB::parse_quantity(&t)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vendor_vfio_type_number_is_the_id_parsing_gives() {
        for n in [0, 7, 1155, u32::MAX] {
            let built = VgpuTypeId::vendor_vfio(n);
            assert_eq!(built, n.to_string().parse::<VgpuTypeId>().unwrap());
            assert_eq!(built.vendor_vfio_number(), Some(n));
        }
    }

    #[test]
    fn uuid_is_lowercased_and_validated() {
        let u: MdevUuid = "DE306C9F-A714-4373-A290-DC15D4E49B71".parse().unwrap();
        assert_eq!(u.to_string(), "de306c9f-a714-4373-a290-dc15d4e49b71");
        for bad in [
            "not-a-uuid",
            "12345678-1234-1234-1234-12345678zzzz",
            "de306c9fa7144373a290dc15d4e49b71",
            "{de306c9f-a714-4373-a290-dc15d4e49b71}",
            "",
        ] {
            let e = bad.parse::<MdevUuid>().unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")));
        }
    }

    #[test]
    fn machine_uuid_is_stable_and_distinct() {
        let a = MdevUuid::for_machine("vm1", "gpu", 0);
        assert_eq!(a, MdevUuid::for_machine("vm1", "gpu", 0));
        assert_ne!(a, MdevUuid::for_machine("vm1", "gpu", 1));
        assert_ne!(a, MdevUuid::for_machine("vm2", "gpu", 0));
        assert_ne!(
            MdevUuid::for_machine("a", "b/c", 0),
            MdevUuid::for_machine("a/b", "c", 0)
        );
        assert_eq!(a.as_uuid().get_version_num(), 5);
    }

    #[test]
    fn named_parent_slots_are_stable_and_apart_from_gpu_slots() {
        let a = MdevUuid::for_named_parent_slot("lab", "mbochs", 0);
        assert_eq!(a, MdevUuid::for_named_parent_slot("lab", "mbochs", 0));
        assert_ne!(a, MdevUuid::for_named_parent_slot("lab", "mbochs", 1));
        assert_ne!(a, MdevUuid::for_named_parent_slot("lab", "mtty", 0));
        assert_ne!(a, MdevUuid::for_named_parent_slot("other", "mbochs", 0));
        assert_eq!(a.as_uuid().get_version_num(), 5);
    }

    #[test]
    fn type_ids_cannot_escape_a_directory() {
        assert_eq!(
            "nvidia-746".parse::<VgpuTypeId>().unwrap().number(),
            Some(746)
        );
        assert_eq!(
            "1155".parse::<VgpuTypeId>().unwrap().vendor_vfio_number(),
            Some(1155)
        );
        assert_eq!("mbochs-small".parse::<VgpuTypeId>().unwrap().number(), None);
        for bad in ["", "../x", "a/b", "..", ".hidden", "a b"] {
            assert!(bad.parse::<VgpuTypeId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn parent_is_address_or_name() {
        assert_eq!(
            "0000:08:00.4".parse::<ParentId>().unwrap(),
            ParentId::Pci("0000:08:00.4".parse().unwrap())
        );
        assert_eq!(
            "mbochs".parse::<ParentId>().unwrap(),
            ParentId::Named("mbochs".into())
        );
        assert!("0000:08:00".parse::<ParentId>().is_err());
        assert!("../mbochs".parse::<ParentId>().is_err());
    }

    #[test]
    fn quantities() {
        assert_eq!(MiB::parse_quantity("80Gi").unwrap(), MiB(81920));
        assert_eq!(MiB::parse_quantity("4096M").unwrap(), MiB(4096));
        assert_eq!(MiB::parse_quantity("512").unwrap(), MiB(512));
        assert_eq!(MiB::parse_quantity("1Ti").unwrap(), MiB(1 << 20));
        assert!(MiB::parse_quantity("Gi").is_err());
        assert!(MiB::parse_quantity("12Xi").is_err());
        assert!(MiB::parse_quantity("99999999999999999999Gi").is_err());
        assert_eq!(MiB(81920).to_string(), "80Gi");
        assert_eq!(MiB(512).to_string(), "512Mi");
    }
}
