//! Fuzzing by property: the decoders of operator-written documents (layout YAML, Machine, fleet,
//! node topology), the NVIDIA type-name and description parsers and the label escaper never panic
//! and never take long, whatever the text.
//!
//! `GPUSLICE_FUZZ_CASES` sets the cases per target (default 256, a few seconds in `cargo test`;
//! see the README for a long run).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use gpu_core::layout::LayoutFile;
use gpu_core::limits::escape_label_value;
use gpu_core::nvidia::{TypeDescription, VgpuTypeName};
use gpu_core::{Fleet, Machine, NodeTopology};
use proptest::prelude::*;

fn cases() -> u32 {
    gpu_core::testing::fuzz_cases(256)
}

/// YAML-ish text: the structural characters, keys the decoders know, numbers at the edges.
fn yamlish() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("version: v1\n".to_owned()),
        Just("vgpu-configs:\n".to_owned()),
        Just("  a:\n".to_owned()),
        Just("    - devices: all\n".to_owned()),
        Just("      vgpu-devices:\n".to_owned()),
        Just("        A2-4Q: 4\n".to_owned()),
        Just("    mbochs: {mbochs-small: 4294967295}\n".to_owned()),
        Just("name: m\n".to_owned()),
        Just("devices:\n".to_owned()),
        Just("  - {name: x, count: -1}\n".to_owned()),
        Just("nodes: []\n".to_owned()),
        Just("[".to_owned()),
        Just("]".to_owned()),
        Just("{".to_owned()),
        Just("}".to_owned()),
        Just("- ".to_owned()),
        Just(": ".to_owned()),
        Just("\"".to_owned()),
        Just("'".to_owned()),
        Just("&a ".to_owned()),
        Just("*a ".to_owned()),
        Just("!!binary ".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("-0".to_owned()),
        Just("\n".to_owned()),
        Just("  ".to_owned()),
        "[a-zA-Z0-9 :,._-]{0,12}",
    ];
    proptest::collection::vec(token, 0..48).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn layout_yaml_never_panics(text in yamlish()) {
        let _ = LayoutFile::parse(&text);
    }

    #[test]
    fn layout_yaml_of_any_text_never_panics(text in any::<String>()) {
        let _ = LayoutFile::parse(&text);
    }

    #[test]
    fn machine_and_fleet_decoding_never_panics(text in yamlish()) {
        let _ = Machine::from_text(&text);
        let _ = Fleet::from_text(&text);
        let _ = NodeTopology::from_text(&text);
    }

    #[test]
    fn accepted_layouts_never_ask_for_more_than_a_gpu_holds(text in yamlish()) {
        if let Ok(f) = LayoutFile::parse(&text) {
            for c in &f.configs {
                for e in &c.entries {
                    let json = serde_json::to_value(&e.want).unwrap();
                    let counts = json.to_string();
                    prop_assert!(!counts.contains("4294967295"), "{counts}");
                }
            }
        }
    }

    #[test]
    fn nvidia_type_names_and_descriptions_never_panic(
        name in "(NVIDIA |GRID )?[A-Z]{0,2}[0-9]{0,4}[A-Za-z]?(-[0-9]{0,3}){0,2}-?[0-9]{0,6}[A-Z]{0,3}",
        desc in "((num_heads|framebuffer|max_instance|frl_config|max_resolution)=[0-9MGx-]{0,24}, ?){0,6}",
        any_text in any::<String>(),
    ) {
        if let Ok(n) = VgpuTypeName::parse(&name) {
            let _ = n.framebuffer_mib();
        }
        let _ = VgpuTypeName::parse(&any_text);
        let _ = TypeDescription::parse(&desc);
        let _ = TypeDescription::parse(&any_text);
    }

    /// The metrics renderer's escaping: an escaped value has no raw line break and no quote that
    /// is not escaped, so it cannot end its label or its line.
    #[test]
    fn escaped_label_values_cannot_end_a_label_or_a_line(value in any::<String>()) {
        let e = escape_label_value(&value);
        prop_assert!(!e.contains('\n'));
        let mut chars = e.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => prop_assert!(matches!(chars.next(), Some('\\' | '"' | 'n'))),
                '"' => prop_assert!(false, "raw quote in {e:?}"),
                _ => {}
            }
        }
    }
}
