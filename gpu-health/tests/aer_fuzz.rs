//! Properties of the AER parser: no input makes it panic, and well-formed files read back exactly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpu_health::aer::parse_aer;
use gpu_health::link::{parse_speed, parse_width};
use proptest::prelude::*;

proptest! {
    // `GPUSLICE_FUZZ_CASES` asks for a longer run (see the README).
    #![proptest_config(ProptestConfig::with_cases(gpu_core::testing::fuzz_cases(2000)))]

    #[test]
    fn arbitrary_text_never_panics_the_aer_parser(text in any::<String>()) {
        let _ = parse_aer(&text);
    }

    #[test]
    fn near_miss_lines_never_panic_the_aer_parser(
        text in "([A-Za-z_]{0,12}[ \t]{0,2}[-+0-9a-f]{0,22}\n?){0,8}"
    ) {
        if let Ok(c) = parse_aer(&text) {
            // Whatever was accepted is consistent.
            prop_assert!(c.counts.iter().all(|(n, _)| !n.is_empty()));
        }
    }

    #[test]
    fn arbitrary_text_never_panics_the_link_parsers(text in any::<String>()) {
        let _ = parse_width(&text);
        let _ = parse_speed(&text);
    }

    #[test]
    fn a_well_formed_file_reads_back_exactly(
        counts in proptest::collection::btree_map("[A-Z][A-Za-z]{1,12}", any::<u64>(), 1..20),
        total in proptest::option::of(any::<u64>()),
    ) {
        let mut text = String::new();
        for (name, n) in &counts {
            text.push_str(&format!("{name} {n}\n"));
        }
        if let Some(t) = total {
            text.push_str(&format!("TOTAL_ERR_FATAL {t}\n"));
        }
        let c = parse_aer(&text).unwrap();
        let read: Vec<(String, u64)> = c.counts.clone();
        let want: Vec<(String, u64)> = counts.iter().map(|(k, v)| (k.clone(), *v)).collect();
        prop_assert_eq!(read, want);
        let sum = counts.values().fold(0u64, |a, b| a.saturating_add(*b));
        prop_assert_eq!(c.total, total.unwrap_or(sum));
    }
}
