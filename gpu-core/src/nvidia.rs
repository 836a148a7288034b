//! NVIDIA vGPU type names.
//!
//! Time-sliced types are `<BOARD>-<FB GB><SERIES>` (`A2-4Q`, `L40S-24Q`, `RTX6000-Ada-8C`);
//! MIG-backed types are `<BOARD>-<SLICES>-<FB GB><SERIES>[ME|NOME|MEALL|GFX]` (`A100-3-20C`,
//! `H200X-1-18C`, `DC-1-24QGFX`). A framebuffer of `0` means 512 MiB. Names may carry an `NVIDIA `
//! or `GRID ` prefix, which is not part of the type.
//!
//! The MIG suffixes are attributes of the GPU instance (media engines, graphics); a driver may
//! list only the base name. Callers match the exact name first and fall back to the base name
//! only when the exact one is unknown.

use std::fmt;
use std::str::FromStr;

use crate::error::CoreError;

/// A MIG attribute suffix of a MIG-backed type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MigSuffix {
    /// `ME`: one media engine set.
    Me,
    /// `NOME`: no media engines.
    NoMe,
    /// `MEALL`: all media engines.
    MeAll,
    /// `GFX`: graphics-capable instance.
    Gfx,
}

impl MigSuffix {
    /// The suffix text.
    pub fn as_str(self) -> &'static str {
        match self {
            MigSuffix::Me => "ME",
            MigSuffix::NoMe => "NOME",
            MigSuffix::MeAll => "MEALL",
            MigSuffix::Gfx => "GFX",
        }
    }
}

/// A parsed NVIDIA vGPU type name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VgpuTypeName {
    /// Board part (`A2`, `A100`, `RTX6000-Ada`, `H200X`).
    pub board: String,
    /// MIG slices for MIG-backed types.
    pub mig_slices: Option<u8>,
    /// Framebuffer in GB as written (`0` = 512 MiB).
    pub framebuffer_gb: u32,
    /// Series letter (`A`, `B`, `C`, `Q`).
    pub series: char,
    /// MIG attribute suffix, if any.
    pub suffix: Option<MigSuffix>,
}

/// Removes an `NVIDIA ` or `GRID ` prefix (case-insensitive) and surrounding whitespace.
pub fn strip_prefix(name: &str) -> &str {
    let t = name.trim();
    for p in ["NVIDIA ", "GRID "] {
        if let (Some(head), Some(rest)) = (t.get(..p.len()), t.get(p.len()..)) {
            if head.eq_ignore_ascii_case(p) {
                return rest.trim_start();
            }
        }
    }
    t
}

impl VgpuTypeName {
    /// Parses a name, with or without `NVIDIA `/`GRID ` prefix.
    ///
    /// # Errors
    /// [`CoreError::InvalidTypeName`] naming the input.
    pub fn parse(name: &str) -> Result<Self, CoreError> {
        let bad = |why| CoreError::InvalidTypeName {
            input: name.to_owned(),
            why,
        };
        // A padded name is a typo in a file or on a command line (`" A100-5C"`): refused, so
        // that what a user wrote and what gpuslice matched are the same text.
        if name.trim() != name {
            return Err(bad(
                "leading or trailing whitespace; write the name without it",
            ));
        }
        let t = strip_prefix(name);
        let (head, last) = t
            .rsplit_once('-')
            .ok_or(bad("expected BOARD-SIZE<SERIES>"))?;
        let digits_end = last
            .find(|c: char| !c.is_ascii_digit())
            .ok_or(bad("missing series letter"))?;
        if digits_end == 0 {
            return Err(bad("missing framebuffer size before the series letter"));
        }
        let framebuffer_gb: u32 = last[..digits_end]
            .parse()
            .map_err(|_| bad("framebuffer size too large"))?;
        let rest = &last[digits_end..];
        let mut chars = rest.chars();
        let series = chars.next().ok_or(bad("missing series letter"))?;
        if !matches!(series, 'A' | 'B' | 'C' | 'Q') {
            return Err(bad("series must be A, B, C or Q"));
        }
        let suffix = match chars.as_str() {
            "" => None,
            "ME" => Some(MigSuffix::Me),
            "NOME" => Some(MigSuffix::NoMe),
            "MEALL" => Some(MigSuffix::MeAll),
            "GFX" => Some(MigSuffix::Gfx),
            _ => {
                return Err(bad(
                    "unknown suffix after the series letter (expected ME, NOME, MEALL or GFX)",
                ));
            }
        };
        let (board, mig_slices) = match head.rsplit_once('-') {
            Some((b, s))
                if !b.is_empty() && !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()) =>
            {
                let n: u8 = s.parse().map_err(|_| bad("MIG slice count too large"))?;
                if n == 0 || n > 8 {
                    return Err(bad("MIG slice count must be 1 to 8"));
                }
                (b.to_owned(), Some(n))
            }
            _ => (head.to_owned(), None),
        };
        if board.is_empty()
            || !board
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-')
        {
            return Err(bad("board must be letters, digits and '-'"));
        }
        if suffix.is_some() && mig_slices.is_none() {
            return Err(bad("MIG suffixes only apply to MIG-backed types"));
        }
        Ok(Self {
            board,
            mig_slices,
            framebuffer_gb,
            series,
            suffix,
        })
    }

    /// Framebuffer in MiB (`0` means 512 MiB).
    pub fn framebuffer_mib(&self) -> u64 {
        if self.framebuffer_gb == 0 {
            512
        } else {
            u64::from(self.framebuffer_gb) * 1024
        }
    }

    /// True for MIG-backed types.
    pub fn is_mig(&self) -> bool {
        self.mig_slices.is_some()
    }

    /// The name without its MIG suffix.
    pub fn base(&self) -> VgpuTypeName {
        VgpuTypeName {
            suffix: None,
            ..self.clone()
        }
    }
}

impl FromStr for VgpuTypeName {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for VgpuTypeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.board)?;
        if let Some(s) = self.mig_slices {
            write!(f, "-{s}")?;
        }
        write!(f, "-{}{}", self.framebuffer_gb, self.series)?;
        if let Some(s) = self.suffix {
            f.write_str(s.as_str())?;
        }
        Ok(())
    }
}

/// The board part of the vGPU type names NVIDIA's driver gives an NVIDIA GPU with PCI device ID
/// `device_id` (`0x26b9` -> `L40S`, as in `L40S-24Q`), for the boards whose names are
/// established; `None` for any other. It is used only to refuse a name for another board when no
/// source names the GPU's own types; resolving names to IDs always goes through the driver.
pub fn vgpu_board(device_id: u16) -> Option<&'static str> {
    Some(match device_id {
        0x1eb8 => "T4",
        0x20f1 => "A100",
        0x20b0 => "A100X",
        0x25b6 => "A2",
        0x26b9 => "L40S",
        0x2335 => "H200X",
        _ => return None,
    })
}

/// Compares two profile names the way users mean them: case-insensitive, ignoring the
/// `NVIDIA `/`GRID ` prefix.
pub fn names_match(a: &str, b: &str) -> bool {
    strip_prefix(a).eq_ignore_ascii_case(strip_prefix(b))
}

/// Facts parsed from an mdev type `description`: NVIDIA's
/// `num_heads=4, frl_config=60, framebuffer=4096M, max_resolution=7680x4320, max_instance=4`, or
/// the size the kernel's sample display drivers state (mbochs: `virtual display, 64 MB video
/// memory`, where MB is 2^20 bytes: 64 MiB of framebuffer per instance).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypeDescription {
    /// `framebuffer=` in MiB.
    pub framebuffer_mib: Option<u64>,
    /// `max_instance=`.
    pub max_instance: Option<u32>,
    /// `num_heads=`.
    pub num_heads: Option<u32>,
    /// `max_resolution=`.
    pub max_resolution: Option<String>,
    /// The video memory a sample display driver states (`64 MB video memory`), in MiB. Kept
    /// apart from `framebuffer_mib`, which only NVIDIA's drivers write.
    pub video_memory_mib: Option<u64>,
}

impl TypeDescription {
    /// The framebuffer per instance the description states: NVIDIA's `framebuffer=`, else a
    /// sample display driver's video memory.
    pub fn instance_mib(&self) -> Option<u64> {
        self.framebuffer_mib.or(self.video_memory_mib)
    }
}

impl TypeDescription {
    /// Parses a description; keys it does not know are ignored (newer drivers add some).
    ///
    /// # Errors
    /// [`CoreError::InvalidSize`] when a known key has a malformed value.
    pub fn parse(text: &str) -> Result<Self, CoreError> {
        let mut d = TypeDescription::default();
        for part in text.split(',') {
            let Some((k, v)) = part.split_once('=') else {
                if let Some(mib) = video_memory_mib(part) {
                    d.video_memory_mib = Some(mib);
                }
                continue;
            };
            let (k, v) = (k.trim(), v.trim());
            let num = |v: &str| -> Result<u32, CoreError> {
                v.parse().map_err(|_| CoreError::InvalidSize {
                    input: format!("{k}={v}"),
                    why: "not a number",
                })
            };
            match k {
                "framebuffer" => {
                    d.framebuffer_mib = Some(crate::ids::MiB::parse_quantity(v)?.get())
                }
                "max_instance" => d.max_instance = Some(num(v)?),
                "num_heads" => d.num_heads = Some(num(v)?),
                "max_resolution" => d.max_resolution = Some(v.to_owned()),
                _ => {}
            }
        }
        Ok(d)
    }
}

/// `64 MB video memory` (a sample display driver's description part): the MiB it states.
fn video_memory_mib(part: &str) -> Option<u64> {
    let number = part.trim().strip_suffix("MB video memory")?.trim_end();
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    number.parse().ok().filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_sliced_names() {
        let n = VgpuTypeName::parse("NVIDIA A2-4Q").unwrap();
        assert_eq!(
            (
                n.board.as_str(),
                n.mig_slices,
                n.framebuffer_mib(),
                n.series,
                n.suffix
            ),
            ("A2", None, 4096, 'Q', None)
        );
        let n = VgpuTypeName::parse("RTX6000-Ada-8C").unwrap();
        assert_eq!(
            (n.board.as_str(), n.mig_slices, n.framebuffer_gb),
            ("RTX6000-Ada", None, 8)
        );
        assert_eq!(
            VgpuTypeName::parse("GRID T4-0B").unwrap().framebuffer_mib(),
            512
        );
        assert_eq!(
            VgpuTypeName::parse("NVIDIA L40S-24Q").unwrap().to_string(),
            "L40S-24Q"
        );
    }

    #[test]
    fn mig_backed_names_and_suffixes() {
        let n = VgpuTypeName::parse("GRID A100-3-20C").unwrap();
        assert_eq!(
            (n.board.as_str(), n.mig_slices, n.framebuffer_gb, n.series),
            ("A100", Some(3), 20, 'C')
        );
        let n = VgpuTypeName::parse("A100-1-5CME").unwrap();
        assert_eq!(n.suffix, Some(MigSuffix::Me));
        assert_eq!(n.base().to_string(), "A100-1-5C");
        assert_eq!(
            VgpuTypeName::parse("DC-1-24QGFX").unwrap().suffix,
            Some(MigSuffix::Gfx)
        );
        assert_eq!(
            VgpuTypeName::parse("H200X-1-18CNOME").unwrap().suffix,
            Some(MigSuffix::NoMe)
        );
        assert_eq!(
            VgpuTypeName::parse("H200X-1-18CMEALL").unwrap().suffix,
            Some(MigSuffix::MeAll)
        );
        assert!(
            VgpuTypeName::parse("NVIDIA H200X-141C")
                .unwrap()
                .mig_slices
                .is_none()
        );
    }

    #[test]
    fn only_the_series_a_b_c_and_q_exist() {
        for bad in ["A16-8E", "A2-4X", "L40S-24G"] {
            let e = VgpuTypeName::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("A, B, C or Q"), "{e}");
        }
        for good in ["A16-8A", "A2-4B", "A100-40C", "L40S-24Q"] {
            assert!(VgpuTypeName::parse(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn rejects_malformed_names() {
        for bad in [
            "",
            "A2",
            "A2-Q",
            "A2-4",
            "A2-4q",
            "A2-4QX",
            "-4Q",
            "A2-4QME",
            "A100-0-5C",
            "A 2-4Q",
        ] {
            let e = VgpuTypeName::parse(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn name_matching_ignores_prefix_and_case() {
        assert!(names_match("GRID A100-3-20C", "a100-3-20c"));
        assert!(names_match("NVIDIA A2-4Q", "A2-4Q"));
        assert!(!names_match("A2-4Q", "A2-4C"));
    }

    #[test]
    fn parses_descriptions() {
        let d = TypeDescription::parse("num_heads=4, frl_config=60, framebuffer=4096M, max_resolution=7680x4320, max_instance=4").unwrap();
        assert_eq!(d.framebuffer_mib, Some(4096));
        assert_eq!(d.max_instance, Some(4));
        assert_eq!(d.max_resolution.as_deref(), Some("7680x4320"));
        assert_eq!(
            TypeDescription::parse("virtual display, 64 MB video memory\n")
                .unwrap()
                .instance_mib(),
            Some(64)
        );
        assert_eq!(
            TypeDescription::parse("virtual display, 64 MB video memory")
                .unwrap()
                .framebuffer_mib,
            None
        );
        assert_eq!(
            TypeDescription::parse("Single port serial").unwrap(),
            TypeDescription::default()
        );
        assert_eq!(
            TypeDescription::parse("virtual display, lots of MB video memory").unwrap(),
            TypeDescription::default()
        );
        assert!(TypeDescription::parse("framebuffer=lots").is_err());
    }
}
