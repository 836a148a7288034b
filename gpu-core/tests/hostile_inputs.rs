//! Hostile documents and names: refused fast, before anything is allocated by what they ask
//! for, with an error naming the field and the value.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::time::{Duration, Instant};

use gpu_core::layout::LayoutFile;
use gpu_core::{Fleet, Machine, NodeTopology};

#[test]
fn a_layout_asking_for_four_billion_vgpus_is_refused_at_the_count() {
    let text = "version: v1\nvgpu-configs:\n  x:\n    mbochs: {mbochs-small: 4294967295}\n";
    let e = LayoutFile::parse(text).unwrap_err().to_string();
    assert!(e.contains("mbochs-small"), "{e}");
    assert!(e.contains("4294967295 is more than any GPU holds"), "{e}");
    let ok = "version: v1\nvgpu-configs:\n  x:\n    mbochs: {mbochs-small: 1024}\n";
    LayoutFile::parse(ok).unwrap();
}

#[test]
fn a_document_of_nested_brackets_is_refused_fast_in_every_decoder() {
    let nested = "[".repeat(200_000);
    let as_layout = format!("version: v1\nvgpu-configs: {nested}");
    let start = Instant::now();
    let errors = [
        LayoutFile::parse(&as_layout).unwrap_err().to_string(),
        Machine::from_text(&nested).unwrap_err().to_string(),
        Fleet::from_text(&format!("nodes: {nested}"))
            .unwrap_err()
            .to_string(),
        NodeTopology::from_text(&nested).unwrap_err().to_string(),
    ];
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    for e in errors {
        assert!(e.contains("nested more than 64 levels"), "{e}");
    }
}

#[test]
fn a_decode_error_names_the_field_path_and_the_value() {
    let e = Machine::from_text("name: m\ndevices:\n  - {name: x, count: -1}\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("devices[0].count"), "{e}");
    assert!(e.contains("-1"), "{e}");
    let e = Machine::from_text(r#"{"name": "m", "devices": [{"name": "x", "count": "many"}]}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("devices[0].count"), "{e}");
    assert!(e.contains("many"), "{e}");
}

#[test]
fn names_that_could_be_paths_or_inject_output_are_refused() {
    for bad in [
        "a/b", "..", "a..b", "../etc", "a\nb", "a\"b", "a b", "a\u{0}b", "-x", "",
    ] {
        assert!(gpu_core::validate_name(bad).is_err(), "{bad:?}");
    }
    for good in ["node-1", "gpu01.example.com", "rack_3"] {
        gpu_core::validate_name(good).unwrap();
    }
    let e = Machine::from_text("name: \"vm\\nevil\"\ndevices: []\n").unwrap_err();
    assert!(e.to_string().contains("vm\\nevil"), "{e}");
}

#[test]
fn a_fleet_with_a_node_name_that_could_be_a_path_is_refused() {
    for bad in ["../etc", "a/b", "n\\nevil"] {
        let text = format!("nodes:\n  - node: \"{bad}\"\n");
        let e = Fleet::from_text(&text).unwrap_err().to_string();
        assert!(e.contains("invalid"), "{bad}: {e}");
    }
    Fleet::from_text("nodes:\n  - node: n1\n").unwrap();
}
