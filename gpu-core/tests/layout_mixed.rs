#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A layout entry's `mixed-sizes` opt-in: read as a boolean, refused otherwise naming where.

use gpu_core::layout::LayoutFile;

fn parse(extra: &str) -> Result<LayoutFile, gpu_core::layout::LayoutError> {
    LayoutFile::parse(&format!(
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n{extra}      vgpu-devices:\n        L40S-24Q: 1\n        L40S-12Q: 2\n"
    ))
}

#[test]
fn mixed_sizes_is_an_opt_in_boolean_of_an_nvidia_entry() {
    let f = parse("      mixed-sizes: true\n").unwrap();
    assert!(f.configs[0].entries[0].mixed_sizes);
    let f = parse("").unwrap();
    assert!(!f.configs[0].entries[0].mixed_sizes, "off unless asked");
    let e = parse("      mixed-sizes: sometimes\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "vgpu-configs.c[0].mixed-sizes: expected true or false"
    );
}
