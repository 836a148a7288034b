//! Parsers of the sysfs attribute formats discovery reads. Pure functions over text, public so
//! other tools can reuse them and so they can be fuzzed.

use gpu_core::nvidia::{TypeDescription, VgpuTypeName};

use crate::error::SysfsError;

/// Parses a VF's `nvidia/creatable_vgpu_types`: an optional header `ID    : vGPU Name`, then one
/// `<decimal ID> : <name>` per line. A file with only the header (a used-up GPU) or nothing at all
/// gives an empty list.
///
/// # Errors
/// [`SysfsError::Malformed`] naming `file` and the 1-based line of the first blank or odd line
/// (no `:`, an ID that is not a positive decimal number, an empty name, a repeated ID).
pub fn parse_creatable_vgpu_types(
    text: &str,
    file: &str,
) -> Result<Vec<(u32, String)>, SysfsError> {
    let mut out: Vec<(u32, String)> = Vec::new();
    if text.trim().is_empty() {
        return Ok(out);
    }
    for (i, raw) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = raw.trim_end_matches('\r');
        let bad = |why: String| SysfsError::malformed(file, line_no, why);
        if line.trim().is_empty() {
            return Err(bad("blank line".to_owned()));
        }
        let Some((id_part, name_part)) = line.split_once(':') else {
            return Err(bad(format!("expected `ID : name`, got {line:?}")));
        };
        let (id_text, name) = (id_part.trim(), name_part.trim());
        if i == 0 && id_text.eq_ignore_ascii_case("id") {
            continue;
        }
        if id_text.is_empty() || !id_text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(format!(
                "type ID {id_text:?} is not a decimal number in {line:?}"
            )));
        }
        let id: u32 = id_text
            .parse()
            .map_err(|_| bad(format!("type ID {id_text:?} is too large")))?;
        if id == 0 {
            return Err(bad(
                "type ID 0 means \"no type\" and cannot be listed".to_owned()
            ));
        }
        if name.is_empty() {
            return Err(bad(format!("type {id} has an empty name")));
        }
        if out.iter().any(|(seen, _)| *seen == id) {
            return Err(bad(format!("type ID {id} is listed twice")));
        }
        out.push((id, name.to_owned()));
    }
    Ok(out)
}

/// Parses a VF's `nvidia/current_vgpu_type`: a decimal type ID, `0` for none.
///
/// # Errors
/// [`SysfsError::Malformed`] naming `file` when the content is not a decimal number.
pub fn parse_current_vgpu_type(text: &str, file: &str) -> Result<u32, SysfsError> {
    let t = text.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SysfsError::malformed(
            file,
            1,
            format!("expected a decimal type ID, got {t:?}"),
        ));
    }
    t.parse()
        .map_err(|_| SysfsError::malformed(file, 1, format!("type ID {t:?} is too large")))
}

/// Parses an NVIDIA mdev type `description`
/// (`num_heads=4, frl_config=60, framebuffer=4096M, max_resolution=7680x4320, max_instance=4`).
/// Descriptions of other drivers (`virtual display, 4 MB video memory`) give an empty result.
///
/// # Errors
/// [`SysfsError::Malformed`] naming `file` when a known key has a malformed value.
pub fn parse_description(text: &str, file: &str) -> Result<TypeDescription, SysfsError> {
    TypeDescription::parse(text).map_err(|e| SysfsError::malformed(file, 1, e.to_string()))
}

/// Parses a PCIe link speed as the kernel prints it (`16.0 GT/s PCIe`, `2.5 GT/s`, `Unknown`)
/// with the one link parser ([`crate::link::parse_speed`]): the rate in GT/s, or `None` when the
/// kernel does not know it.
///
/// # Errors
/// [`SysfsError::Malformed`] naming `file` for any other text.
pub fn parse_link_speed(text: &str, file: &str) -> Result<Option<f64>, SysfsError> {
    crate::link::parse_speed(text).map_err(|e| SysfsError::malformed(file, 1, e.to_string()))
}

/// Parses a PCIe link width with the one link parser ([`crate::link::parse_width`]): the lane
/// count, or `None` for the `0` of a link that reports none.
///
/// # Errors
/// [`SysfsError::Malformed`] naming `file` for any other text.
pub fn parse_link_width(text: &str, file: &str) -> Result<Option<u32>, SysfsError> {
    crate::link::parse_width(text).map_err(|e| SysfsError::malformed(file, 1, e.to_string()))
}

/// Parses an unsigned decimal attribute (`sriov_numvfs`, `current_link_width`, `available_instances`).
///
/// # Errors
/// [`SysfsError::Malformed`] naming `file`.
pub fn parse_u32(text: &str, file: &str) -> Result<u32, SysfsError> {
    let t = text.trim();
    t.parse()
        .map_err(|_| SysfsError::malformed(file, 1, format!("expected a number, got {t:?}")))
}

/// Parses `numa_node`: `-1` (no node) gives `None`.
///
/// # Errors
/// [`SysfsError::Malformed`] naming `file`.
pub fn parse_numa_node(text: &str, file: &str) -> Result<Option<u32>, SysfsError> {
    let t = text.trim();
    match t.parse::<i64>() {
        Ok(n) if n < 0 => Ok(None),
        Ok(n) => u32::try_from(n)
            .map(Some)
            .map_err(|_| SysfsError::malformed(file, 1, format!("NUMA node {n} is out of range"))),
        Err(_) => Err(SysfsError::malformed(
            file,
            1,
            format!("expected a NUMA node number, got {t:?}"),
        )),
    }
}

/// Facts an NVIDIA type name gives: framebuffer in MiB, and MIG slices and memory for MIG-backed
/// types. `None` for names that are not NVIDIA vGPU names (`mbochs-small`).
pub fn facts_from_type_name(name: &str) -> Option<(u64, Option<u8>, Option<u32>)> {
    let n = VgpuTypeName::parse(name).ok()?;
    Some((
        n.framebuffer_mib(),
        n.mig_slices,
        n.mig_slices.map(|_| n.framebuffer_gb),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "sys/bus/pci/devices/0000:26:00.4/nvidia/creatable_vgpu_types";

    #[test]
    fn creatable_types_tolerate_the_header() {
        let t = "ID    : vGPU Name\n1155  : NVIDIA L40S-24Q\n2164  : NVIDIA L40S-3B\n";
        assert_eq!(
            parse_creatable_vgpu_types(t, FILE).unwrap(),
            vec![
                (1155, "NVIDIA L40S-24Q".to_owned()),
                (2164, "NVIDIA L40S-3B".to_owned())
            ]
        );
        assert!(
            parse_creatable_vgpu_types("ID    : vGPU Name\n", FILE)
                .unwrap()
                .is_empty()
        );
        assert!(parse_creatable_vgpu_types("", FILE).unwrap().is_empty());
        assert_eq!(
            parse_creatable_vgpu_types("1155 : NVIDIA L40S-24Q", FILE).unwrap(),
            vec![(1155, "NVIDIA L40S-24Q".to_owned())]
        );
    }

    #[test]
    fn creatable_types_reject_blank_and_odd_lines_naming_file_and_line() {
        for (text, line) in [
            ("ID : vGPU Name\n1155 : A\n\n1156 : B\n", 3),
            ("ID : vGPU Name\nsomething odd\n", 2),
            ("ID : vGPU Name\nx12 : A\n", 2),
            ("ID : vGPU Name\n12 :\n", 2),
            ("ID : vGPU Name\n0 : none\n", 2),
            ("1 : A\n1 : B\n", 2),
            ("ID : vGPU Name\nID : vGPU Name\n", 2),
            ("99999999999 : A\n", 1),
        ] {
            let e = parse_creatable_vgpu_types(text, FILE).unwrap_err();
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("{FILE}:{line}: ")), "{msg}");
        }
    }

    #[test]
    fn current_type_is_a_number() {
        assert_eq!(parse_current_vgpu_type("0\n", "f").unwrap(), 0);
        assert_eq!(parse_current_vgpu_type("1155", "f").unwrap(), 1155);
        assert!(parse_current_vgpu_type("", "f").is_err());
        assert!(parse_current_vgpu_type("-1", "f").is_err());
    }

    #[test]
    fn link_speeds_and_numa_nodes() {
        assert_eq!(
            parse_link_speed("16.0 GT/s PCIe\n", "f").unwrap(),
            Some(16.0)
        );
        assert_eq!(parse_link_speed("2.5 GT/s", "f").unwrap(), Some(2.5));
        assert_eq!(parse_link_speed("Unknown", "f").unwrap(), None);
        assert!(parse_link_speed("fast", "f").is_err());
        assert!(parse_link_speed("NaN GT/s", "f").is_err());
        assert_eq!(parse_numa_node("-1\n", "f").unwrap(), None);
        assert_eq!(parse_numa_node("1", "f").unwrap(), Some(1));
        assert!(parse_numa_node("one", "f").is_err());
    }

    #[test]
    fn type_names_give_sizes_and_mig_facts() {
        assert_eq!(
            facts_from_type_name("NVIDIA A2-4Q"),
            Some((4096, None, None))
        );
        assert_eq!(
            facts_from_type_name("NVIDIA H200X-1-18C"),
            Some((18 * 1024, Some(1), Some(18)))
        );
        assert_eq!(facts_from_type_name("mbochs-small"), None);
    }

    #[test]
    fn descriptions_name_the_file_when_malformed() {
        let e = parse_description("framebuffer=lots", "t/description").unwrap_err();
        assert!(e.to_string().starts_with("t/description:1: "), "{e}");
    }
}
