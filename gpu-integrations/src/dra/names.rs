//! Name and quantity rules of the Kubernetes API that the DRA objects must follow.

/// True for a DNS label (RFC 1123): 1–63 of `[a-z0-9-]`, starting and ending alphanumeric.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// True for a DNS subdomain (RFC 1123): at most 253 characters of dot-separated DNS labels.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// True for a C identifier of at most 32 characters, as device attribute and capacity names are.
pub fn is_c_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    match bytes.next() {
        Some(b) if b.is_ascii_alphabetic() || b == b'_' => {}
        _ => return false,
    }
    s.len() <= 32 && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// True for a qualified attribute or capacity name: a C identifier, or `domain/identifier` with a
/// DNS subdomain of at most 63 characters as the domain.
pub fn is_qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        None => is_c_identifier(s),
        Some((domain, id)) => domain.len() <= 63 && is_dns_subdomain(domain) && is_c_identifier(id),
    }
}

/// True for a label value: at most 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends (or empty).
pub fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric()))
}

/// A quantity of MiB: `16Gi` when whole GiB, else `4096Mi`... written the way Kubernetes
/// canonicalizes binary quantities.
pub fn mib_quantity(mib: u64) -> String {
    if mib > 0 && mib % (1024 * 1024) == 0 {
        format!("{}Ti", mib / (1024 * 1024))
    } else if mib > 0 && mib % 1024 == 0 {
        format!("{}Gi", mib / 1024)
    } else {
        format!("{mib}Mi")
    }
}

/// Parses the quantities gpuslice writes (a plain integer or an integer with a binary suffix
/// `Ki`/`Mi`/`Gi`/`Ti`) into base units; `None` for anything else.
pub fn parse_quantity(s: &str) -> Option<u128> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u128 = num.parse().ok()?;
    let mult: u128 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// The C-identifier form of a profile name for a boolean attribute: `NVIDIA A2-4Q` →
/// `profile_A2_4Q`; `None` when longer than 32 characters.
pub fn profile_attribute(name: &str) -> Option<String> {
    let short = gpu_core::nvidia::strip_prefix(name);
    let id: String = std::iter::once("profile_".to_owned())
        .chain(short.chars().map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_string()
            } else {
                "_".to_owned()
            }
        }))
        .collect();
    is_c_identifier(&id).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels_are_lowercase_and_short() {
        assert!(is_dns_label("gpu-0000-08-00-0"));
        for bad in ["", "-a", "a-", "A", "a.b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        assert!(is_dns_subdomain("gpu.gpuslice.dev"));
        assert!(!is_dns_subdomain("gpu..dev"));
    }

    #[test]
    fn attribute_names_are_c_identifiers_or_qualified() {
        assert!(is_qualified_name("type"));
        assert!(is_qualified_name("resource.kubernetes.io/pciBusID"));
        assert!(!is_qualified_name("memory-slice-0"));
        assert!(!is_qualified_name("0abc"));
        assert!(!is_qualified_name(&"a".repeat(33)));
    }

    #[test]
    fn quantities_round_trip() {
        assert_eq!(mib_quantity(16384), "16Gi");
        assert_eq!(mib_quantity(46068), "46068Mi");
        assert_eq!(mib_quantity(1 << 20), "1Ti");
        assert_eq!(parse_quantity("16Gi"), parse_quantity("16384Mi"));
        assert_eq!(parse_quantity("7"), Some(7));
        assert_eq!(parse_quantity("1.5Gi"), None);
    }

    #[test]
    fn profile_attributes_are_identifiers() {
        assert_eq!(
            profile_attribute("NVIDIA A2-4Q").as_deref(),
            Some("profile_A2_4Q")
        );
        assert_eq!(
            profile_attribute("GRID A100-3-20C").as_deref(),
            Some("profile_A100_3_20C")
        );
        assert_eq!(profile_attribute(&"X".repeat(40)), None);
    }
}
