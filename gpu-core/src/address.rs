//! PCI addresses (`DOMAIN:BUS:DEVICE.FUNCTION`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::CoreError;

/// A PCI function address such as `0000:08:00.4` or, behind Intel VMD, `10000:00:00.0`.
///
/// Ordering is numeric (domain, bus, device, function), never textual: `0000:0a:00.0` sorts after
/// `0000:09:00.0` and `10000:00:00.0` after `ffff:ff:1f.7`. The canonical text form has a domain of
/// at least four lowercase hex digits; serde goes through that form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    domain: u32,
    bus: u8,
    device: u8,
    function: u8,
}

impl PciAddress {
    /// Builds an address from its parts.
    ///
    /// # Errors
    /// [`CoreError::InvalidPciAddress`] when `device > 0x1f` or `function > 7`.
    pub fn new(domain: u32, bus: u8, device: u8, function: u8) -> Result<Self, CoreError> {
        if device > 0x1f {
            return Err(CoreError::InvalidPciAddress {
                input: format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"),
                why: "device number above 0x1f",
            });
        }
        if function > 7 {
            return Err(CoreError::InvalidPciAddress {
                input: format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"),
                why: "function number above 7",
            });
        }
        Ok(Self {
            domain,
            bus,
            device,
            function,
        })
    }

    /// PCI domain (segment).
    pub fn domain(&self) -> u32 {
        self.domain
    }
    /// Bus number.
    pub fn bus(&self) -> u8 {
        self.bus
    }
    /// Device (slot) number, 0..=0x1f.
    pub fn device(&self) -> u8 {
        self.device
    }
    /// Function number, 0..=7.
    pub fn function(&self) -> u8 {
        self.function
    }

    /// True when both addresses are in the same slot (same domain, bus and device).
    pub fn same_slot(&self, other: &PciAddress) -> bool {
        self.domain == other.domain && self.bus == other.bus && self.device == other.device
    }

    /// A DNS-label form (`0000-08-00-4`), used where `:` and `.` are not allowed.
    pub fn dns_label(&self) -> String {
        format!(
            "{:04x}-{:02x}-{:02x}-{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

fn hex_field<T>(
    input: &str,
    field: &str,
    max_digits: usize,
    why: &'static str,
) -> Result<T, CoreError>
where
    T: TryFrom<u64>,
{
    if field.is_empty() || field.len() > max_digits || !field.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(CoreError::InvalidPciAddress {
            input: input.to_owned(),
            why,
        });
    }
    let value = u64::from_str_radix(field, 16).map_err(|_| CoreError::InvalidPciAddress {
        input: input.to_owned(),
        why,
    })?;
    T::try_from(value).map_err(|_| CoreError::InvalidPciAddress {
        input: input.to_owned(),
        why,
    })
}

impl FromStr for PciAddress {
    type Err = CoreError;

    /// Parses `DOMAIN:BUS:DEVICE.FUNCTION` (domain 1–8 hex digits) or the short `BUS:DEVICE.FUNCTION`
    /// (domain 0), case-insensitively, surrounding whitespace ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let input = s.trim();
        let (head, function) = input.rsplit_once('.').ok_or(CoreError::InvalidPciAddress {
            input: s.to_owned(),
            why: "missing '.FUNCTION'",
        })?;
        let mut parts = head.split(':');
        let fields = (parts.next(), parts.next(), parts.next(), parts.next());
        let (domain, bus, device) = match fields {
            (Some(d), Some(b), Some(dev), None) => (d, b, dev),
            (Some(b), Some(dev), None, None) => ("0", b, dev),
            _ => {
                return Err(CoreError::InvalidPciAddress {
                    input: s.to_owned(),
                    why: "expected DOMAIN:BUS:DEVICE.FUNCTION",
                });
            }
        };
        let domain: u32 = hex_field(s, domain, 8, "domain must be 1 to 8 hex digits")?;
        let bus: u8 = hex_field(s, bus, 2, "bus must be 1 or 2 hex digits")?;
        let device: u8 = hex_field(s, device, 2, "device must be 1 or 2 hex digits")?;
        let function: u8 = hex_field(s, function, 1, "function must be one digit 0-7")?;
        Self::new(domain, bus, device, function).map_err(|e| match e {
            CoreError::InvalidPciAddress { why, .. } => CoreError::InvalidPciAddress {
                input: s.to_owned(),
                why,
            },
            other => other,
        })
    }
}

impl fmt::Display for PciAddress {
    /// `DDDD:BB:DD.F` in lower-case hex (a domain past `ffff` takes up to 8 digits). Written by
    /// hand rather than with `write!`: discovery formats an address into every path it reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut buf = [0u8; 17];
        let digits = (8 - self.domain.leading_zeros() as usize / 4).max(4);
        let mut at = 0;
        for i in (0..digits).rev() {
            buf[at] = HEX[((self.domain >> (i * 4)) & 0xf) as usize];
            at += 1;
        }
        for (sep, v) in [(b':', self.bus), (b':', self.device)] {
            buf[at] = sep;
            buf[at + 1] = HEX[usize::from(v >> 4)];
            buf[at + 2] = HEX[usize::from(v & 0xf)];
            at += 3;
        }
        buf[at] = b'.';
        buf[at + 1] = HEX[usize::from(self.function & 0xf)];
        at += 2;
        // Only ASCII hex digits and separators were written.
        f.write_str(std::str::from_utf8(&buf[..at]).map_err(|_| fmt::Error)?)
    }
}

impl Serialize for PciAddress {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PciAddress {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> PciAddress {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn parses_and_prints_canonical_form() {
        assert_eq!(addr("0000:08:00.4").to_string(), "0000:08:00.4");
        assert_eq!(addr("0000:AF:1F.7").to_string(), "0000:af:1f.7");
        assert_eq!(addr("08:00.4").to_string(), "0000:08:00.4");
        assert_eq!(addr(" 0000:08:00.4\n").to_string(), "0000:08:00.4");
    }

    #[test]
    fn accepts_domains_wider_than_four_digits() {
        let vmd = addr("10000:00:00.0");
        assert_eq!(vmd.domain(), 0x10000);
        assert_eq!(vmd.to_string(), "10000:00:00.0");
    }

    proptest::proptest! {
        #[test]
        fn prints_as_the_format_string_would_and_parses_back(
            domain in proptest::prop_oneof![0u32..=0xffff, proptest::num::u32::ANY],
            bus: u8,
            device in 0u8..=0x1f,
            function in 0u8..=7,
        ) {
            let a = PciAddress::new(domain, bus, device, function).unwrap();
            let text = a.to_string();
            proptest::prop_assert_eq!(
                &text,
                &format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}")
            );
            proptest::prop_assert_eq!(text.parse::<PciAddress>().unwrap(), a);
        }
    }

    #[test]
    fn orders_numerically_not_textually() {
        let mut v = [
            addr("10000:00:00.0"),
            addr("0000:0a:00.0"),
            addr("0000:09:00.0"),
            addr("ffff:ff:1f.7"),
        ];
        v.sort();
        let s: Vec<String> = v.iter().map(ToString::to_string).collect();
        assert_eq!(
            s,
            [
                "0000:09:00.0",
                "0000:0a:00.0",
                "ffff:ff:1f.7",
                "10000:00:00.0"
            ]
        );
    }

    #[test]
    fn rejects_bad_input_naming_it() {
        for bad in [
            "",
            "0000:08:00",
            "0000:08:20.0",
            "0000:08:00.8",
            "zz:00.0",
            "0000:100:00.0",
            "1:2:3:4.0",
            "../../etc.0",
        ] {
            let err = bad.parse::<PciAddress>().expect_err(bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn same_slot_and_dns_label() {
        assert!(addr("0000:01:00.0").same_slot(&addr("0000:01:00.1")));
        assert!(!addr("0000:01:00.0").same_slot(&addr("0000:01:01.0")));
        assert_eq!(addr("0000:08:00.4").dns_label(), "0000-08-00-4");
    }

    #[test]
    fn serde_goes_through_the_string_form() {
        let a = addr("0000:08:00.4");
        let json = serde_json::to_string(&a).unwrap_or_default();
        assert_eq!(json, "\"0000:08:00.4\"");
        let back: PciAddress = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, a);
        assert!(serde_json::from_str::<PciAddress>("\"nope\"").is_err());
    }
}
