//! Invariants of grading over generated signals: worse signals never give a better verdict, and
//! a verdict other than Healthy or Unknown always says why.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpu_core::HealthState;
use gpu_health::aer::{AerReadings, parse_aer};
use gpu_health::grade::{ExpectedWidth, History};
use gpu_health::link::LinkReadings;
use gpu_health::{GpuTelemetry, Policy, Reading, RowRemap, Signals, WidthBasis, grade};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Raw {
    fatal: u64,
    nonfatal: u64,
    width: u32,
    ecc_unc: u64,
    ecc_cor: u64,
    retired: u64,
    pending: bool,
    remap_failure: bool,
    remap_pending: bool,
    temp: u32,
}

fn raw() -> impl Strategy<Value = Raw> {
    (
        0u64..3,
        0u64..3,
        prop::sample::select(vec![1u32, 4, 8, 16]),
        0u64..3,
        0u64..2000,
        0u64..80,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        20u32..110,
    )
        .prop_map(
            |(fatal, nonfatal, width, ecc_unc, ecc_cor, retired, pending, rf, rp, temp)| Raw {
                fatal,
                nonfatal,
                width,
                ecc_unc,
                ecc_cor,
                retired,
                pending,
                remap_failure: rf,
                remap_pending: rp,
                temp,
            },
        )
}

fn signals(r: &Raw) -> Signals {
    let aer = |name: &str, total: &str, n: u64| {
        Reading::Value(parse_aer(&format!("{name} {n}\n{total} {n}\n")).unwrap())
    };
    let mut t = GpuTelemetry::nominal(16384);
    t.ecc_uncorrected_volatile = Reading::Value(r.ecc_unc);
    t.ecc_corrected_volatile = Reading::Value(r.ecc_cor);
    t.retired_pages_dbe = Reading::Value(r.retired);
    t.pages_pending_retirement = Reading::Value(r.pending);
    t.row_remap = Reading::Value(RowRemap {
        corrected_rows: 0,
        uncorrected_rows: 0,
        pending: r.remap_pending,
        failure: r.remap_failure,
    });
    t.temperature_c = Reading::Value(r.temp);
    Signals {
        aer: AerReadings {
            correctable: aer("RxErr", "TOTAL_ERR_COR", 0),
            nonfatal: aer("CmpltTO", "TOTAL_ERR_NONFATAL", r.nonfatal),
            fatal: aer("DLP", "TOTAL_ERR_FATAL", r.fatal),
        },
        link: LinkReadings {
            current_width: Reading::Value(r.width),
            max_width: Reading::Value(16),
            current_speed_gts: Reading::Value(2.5),
            max_speed_gts: Reading::Value(16.0),
        },
        telemetry: Some(t),
    }
}

fn state(r: &Raw) -> (HealthState, Vec<String>) {
    let expected = ExpectedWidth {
        lanes: 16,
        basis: WidthBasis::MaxWidth,
    };
    let h = grade(
        &Policy::default(),
        &signals(r),
        Some(&expected),
        &History::default(),
    );
    (h.state, h.reasons)
}

/// Every way of making one signal worse.
fn worsen(r: &Raw, which: usize) -> Raw {
    let mut w = r.clone();
    match which {
        0 => w.fatal += 1,
        1 => w.nonfatal += 1,
        2 => w.width = (w.width / 2).max(1),
        3 => w.ecc_unc += 1,
        4 => w.ecc_cor += 500,
        5 => w.retired += 10,
        6 => w.pending = true,
        7 => w.remap_failure = true,
        8 => w.remap_pending = true,
        _ => w.temp += 5,
    }
    w
}

proptest! {
    #[test]
    fn a_worse_signal_never_gives_a_better_verdict(r in raw(), which in 0usize..10) {
        let (before, _) = state(&r);
        let (after, _) = state(&worsen(&r, which));
        prop_assert!(after.rank() >= before.rank(), "{before:?} -> {after:?}");
    }

    #[test]
    fn degraded_and_unhealthy_verdicts_always_give_reasons(r in raw()) {
        let (s, reasons) = state(&r);
        prop_assert_ne!(s, HealthState::Unknown, "every signal was read");
        prop_assert_eq!(s == HealthState::Healthy, reasons.is_empty());
    }

    #[test]
    fn link_speed_alone_never_changes_a_verdict(r in raw(), speed in 1u32..64) {
        let mut s = signals(&r);
        let expected = ExpectedWidth { lanes: 16, basis: WidthBasis::MaxWidth };
        let base = grade(&Policy::default(), &s, Some(&expected), &History::default());
        s.link.current_speed_gts = Reading::Value(f64::from(speed) / 2.0);
        let other = grade(&Policy::default(), &s, Some(&expected), &History::default());
        prop_assert_eq!(base, other);
    }
}
