//! Every grading rule, at and around each threshold, on signals built in memory.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpu_core::{HealthState, PciId};
use gpu_health::aer::{AerReadings, parse_aer};
use gpu_health::grade::{BoardIds, ExpectedWidth, History, expected_width};
use gpu_health::link::LinkReadings;
use gpu_health::policy::{LinkFallback, Policy};
use gpu_health::{GpuTelemetry, Limit, Reading, RowRemap, Signals, WidthBasis, grade};

fn aer(cor: u64, nonfatal: u64, fatal: u64) -> AerReadings {
    AerReadings {
        correctable: Reading::Value(
            parse_aer(&format!("RxErr {cor}\nTOTAL_ERR_COR {cor}\n")).unwrap(),
        ),
        nonfatal: Reading::Value(
            parse_aer(&format!(
                "CmpltTO {nonfatal}\nTOTAL_ERR_NONFATAL {nonfatal}\n"
            ))
            .unwrap(),
        ),
        fatal: Reading::Value(
            parse_aer(&format!("DLP {fatal}\nTOTAL_ERR_FATAL {fatal}\n")).unwrap(),
        ),
    }
}

fn no_aer() -> AerReadings {
    AerReadings {
        correctable: Reading::Unsupported,
        nonfatal: Reading::Unsupported,
        fatal: Reading::Unsupported,
    }
}

fn link(cur: u32, max: u32, cur_speed: f64, max_speed: f64) -> LinkReadings {
    LinkReadings {
        current_width: Reading::Value(cur),
        max_width: Reading::Value(max),
        current_speed_gts: Reading::Value(cur_speed),
        max_speed_gts: Reading::Value(max_speed),
    }
}

fn no_link() -> LinkReadings {
    LinkReadings {
        current_width: Reading::Unsupported,
        max_width: Reading::Unsupported,
        current_speed_gts: Reading::Unsupported,
        max_speed_gts: Reading::Unsupported,
    }
}

fn sysfs_only(aer: AerReadings, link: LinkReadings) -> Signals {
    Signals {
        aer,
        link,
        telemetry: None,
    }
}

fn with_telemetry(edit: impl FnOnce(&mut GpuTelemetry)) -> Signals {
    let mut t = GpuTelemetry::nominal(16384);
    edit(&mut t);
    Signals {
        aer: aer(0, 0, 0),
        link: link(16, 16, 16.0, 16.0),
        telemetry: Some(t),
    }
}

fn verdict(s: &Signals) -> (HealthState, Vec<String>) {
    verdict_with(&Policy::default(), s)
}

fn verdict_with(p: &Policy, s: &Signals) -> (HealthState, Vec<String>) {
    let expected = ExpectedWidth {
        lanes: 16,
        basis: WidthBasis::MaxWidth,
    };
    let h = grade(p, s, Some(&expected), &History::default());
    (h.state, h.reasons)
}

fn healthy() -> (HealthState, Vec<String>) {
    (HealthState::Healthy, vec![])
}

#[test]
fn a_gpu_with_every_signal_nominal_is_healthy() {
    assert_eq!(verdict(&with_telemetry(|_| {})), healthy());
}

#[test]
fn a_gpu_none_of_whose_signals_could_be_read_is_unknown() {
    let s = Signals {
        aer: no_aer(),
        link: no_link(),
        telemetry: Some(GpuTelemetry::unknown("NVML unavailable")),
    };
    assert_eq!(
        verdict(&s),
        (
            HealthState::Unknown,
            vec!["no health signal could be read".to_owned()]
        )
    );
}

#[test]
fn one_readable_signal_is_enough_for_a_verdict() {
    let s = sysfs_only(no_aer(), link(16, 16, 2.5, 16.0));
    assert_eq!(verdict(&s), healthy());
}

#[test]
fn any_fatal_aer_error_makes_a_gpu_unhealthy() {
    assert_eq!(
        verdict(&sysfs_only(aer(0, 0, 1), no_link())),
        (
            HealthState::Unhealthy,
            vec!["AER fatal 1 (DLP 1)".to_owned()]
        )
    );
    assert_eq!(verdict(&sysfs_only(aer(0, 0, 0), no_link())), healthy());
}

#[test]
fn the_fatal_limit_is_a_threshold_above_which_the_rule_trips() {
    let mut p = Policy::default();
    p.aer.fatal_max = Limit::Max(2);
    assert_eq!(
        verdict_with(&p, &sysfs_only(aer(0, 0, 2), no_link())),
        healthy()
    );
    assert_eq!(
        verdict_with(&p, &sysfs_only(aer(0, 0, 3), no_link())).0,
        HealthState::Unhealthy
    );
    p.aer.fatal_max = Limit::Off;
    assert_eq!(
        verdict_with(&p, &sysfs_only(aer(0, 0, 900), no_link())),
        healthy()
    );
}

#[test]
fn non_fatal_aer_errors_since_boot_degrade_without_a_baseline() {
    assert_eq!(
        verdict(&sysfs_only(aer(0, 3, 0), no_link())),
        (
            HealthState::Degraded,
            vec!["AER non-fatal 3 (CmpltTO 3)".to_owned()]
        )
    );
}

#[test]
fn non_fatal_aer_errors_degrade_only_when_they_grew_since_the_baseline() {
    let p = Policy::default();
    let s = sysfs_only(aer(0, 5, 0), no_link());
    let h = |before| {
        grade(
            &p,
            &s,
            None,
            &History {
                aer_nonfatal: Some(before),
                ..History::default()
            },
        )
    };
    assert_eq!(h(5).state, HealthState::Healthy);
    assert_eq!(
        h(4).reasons,
        ["AER non-fatal +1 since baseline, 5 in all (CmpltTO 5)"]
    );
    // A counter lower than the baseline was reset: all of it is new.
    assert_eq!(h(9).reasons, ["AER non-fatal 5 (CmpltTO 5)"]);
}

#[test]
fn correctable_aer_errors_are_ignored_unless_the_policy_asks() {
    let s = sysfs_only(aer(250, 0, 0), no_link());
    assert_eq!(verdict(&s), healthy());
    let mut p = Policy::default();
    p.aer.correctable_growth_max = Limit::Max(249);
    assert_eq!(
        verdict_with(&p, &s),
        (
            HealthState::Degraded,
            vec!["AER correctable +250 (RxErr 250)".to_owned()]
        )
    );
    p.aer.correctable_growth_max = Limit::Max(250);
    assert_eq!(verdict_with(&p, &s), healthy());
}

#[test]
fn a_link_narrower_than_expected_is_degraded_and_speed_never_counts() {
    assert_eq!(
        verdict(&sysfs_only(no_aer(), link(8, 16, 16.0, 16.0))),
        (HealthState::Degraded, vec!["link x8 of x16".to_owned()])
    );
    // Idle GPUs drop to 2.5 GT/s by design.
    assert_eq!(
        verdict(&sysfs_only(no_aer(), link(16, 16, 2.5, 16.0))),
        healthy()
    );
    let none = grade(
        &Policy::default(),
        &sysfs_only(no_aer(), link(8, 16, 2.5, 16.0)),
        None,
        &History::default(),
    );
    assert_eq!(
        none.state,
        HealthState::Healthy,
        "no expected width, no judgement"
    );
}

#[test]
fn uncorrectable_ecc_makes_a_gpu_unhealthy_volatile_or_aggregate() {
    assert_eq!(
        verdict(&with_telemetry(
            |t| t.ecc_uncorrected_volatile = Reading::Value(3)
        )),
        (
            HealthState::Unhealthy,
            vec!["uncorrectable ECC 3 (volatile)".to_owned()]
        )
    );
    assert_eq!(
        verdict(&with_telemetry(
            |t| t.ecc_uncorrected_aggregate = Reading::Value(1)
        )),
        (
            HealthState::Unhealthy,
            vec!["uncorrectable ECC 1 (aggregate)".to_owned()]
        )
    );
    let mut p = Policy::default();
    p.ecc.uncorrectable_aggregate_max = Limit::Off;
    assert_eq!(
        verdict_with(
            &p,
            &with_telemetry(|t| t.ecc_uncorrected_aggregate = Reading::Value(7))
        ),
        healthy()
    );
}

#[test]
fn correctable_ecc_degrades_above_its_threshold() {
    let at = |n| {
        verdict(&with_telemetry(|t| {
            t.ecc_corrected_volatile = Reading::Value(n)
        }))
    };
    assert_eq!(at(1000), healthy());
    assert_eq!(
        at(1001),
        (
            HealthState::Degraded,
            vec!["correctable ECC 1001 (volatile)".to_owned()]
        )
    );
    let mut p = Policy::default();
    p.ecc.correctable_aggregate_max = Limit::Max(10);
    assert_eq!(
        verdict_with(
            &p,
            &with_telemetry(|t| t.ecc_corrected_aggregate = Reading::Value(11))
        )
        .1,
        ["correctable ECC 11 (aggregate)"]
    );
}

#[test]
fn a_failed_row_remapping_is_unhealthy_and_a_pending_one_degraded() {
    let remap = |pending, failure| {
        verdict(&with_telemetry(|t| {
            t.row_remap = Reading::Value(RowRemap {
                corrected_rows: 0,
                uncorrected_rows: 1,
                pending,
                failure,
            })
        }))
    };
    assert_eq!(
        remap(false, true),
        (
            HealthState::Unhealthy,
            vec!["row remapping failed".to_owned()]
        )
    );
    assert_eq!(
        remap(true, false),
        (
            HealthState::Degraded,
            vec!["row remapping pending (reset needed)".to_owned()]
        )
    );
    assert_eq!(remap(false, false), healthy());
    let mut p = Policy::default();
    p.row_remap.pending_degrades = false;
    assert_eq!(
        verdict_with(
            &p,
            &with_telemetry(|t| t.row_remap = Reading::Value(RowRemap {
                pending: true,
                ..RowRemap::default()
            }))
        ),
        healthy()
    );
}

#[test]
fn retired_pages_above_the_limit_are_unhealthy() {
    let pages = |sbe, dbe| {
        verdict(&with_telemetry(|t| {
            t.retired_pages_sbe = Reading::Value(sbe);
            t.retired_pages_dbe = Reading::Value(dbe);
        }))
    };
    assert_eq!(pages(40, 20), healthy());
    assert_eq!(
        pages(40, 21),
        (
            HealthState::Unhealthy,
            vec!["retired pages 61 (limit 60)".to_owned()]
        )
    );
    // One cause unreadable: the other still counts.
    assert_eq!(
        verdict(&with_telemetry(|t| {
            t.retired_pages_sbe = Reading::Unsupported;
            t.retired_pages_dbe = Reading::Value(61);
        }))
        .0,
        HealthState::Unhealthy
    );
}

#[test]
fn pages_pending_retirement_degrade() {
    assert_eq!(
        verdict(&with_telemetry(
            |t| t.pages_pending_retirement = Reading::Value(true)
        )),
        (
            HealthState::Degraded,
            vec!["pages pending retirement (reset needed)".to_owned()]
        )
    );
}

#[test]
fn temperature_is_judged_against_the_gpus_own_thresholds_at_each_edge() {
    let temp = |c| verdict(&with_telemetry(|t| t.temperature_c = Reading::Value(c)));
    assert_eq!(temp(89), healthy());
    assert_eq!(
        temp(90),
        (
            HealthState::Degraded,
            vec!["temperature 90C at or above slowdown 90C".to_owned()]
        )
    );
    assert_eq!(temp(94).0, HealthState::Degraded);
    assert_eq!(
        temp(95),
        (
            HealthState::Unhealthy,
            vec!["temperature 95C at or above shutdown 95C".to_owned()]
        )
    );
    let mut p = Policy::default();
    p.temperature.slowdown_margin_c = 5;
    p.temperature.shutdown_margin_c = 3;
    let t = |c| verdict_with(&p, &with_telemetry(|t| t.temperature_c = Reading::Value(c))).0;
    assert_eq!(t(84), HealthState::Healthy);
    assert_eq!(t(85), HealthState::Degraded);
    assert_eq!(t(92), HealthState::Unhealthy);
}

#[test]
fn a_temperature_without_thresholds_is_not_judged() {
    assert_eq!(
        verdict(&with_telemetry(|t| {
            t.temperature_c = Reading::Value(120);
            t.slowdown_c = Reading::Unsupported;
            t.shutdown_c = Reading::unknown("NVML: timeout");
        })),
        healthy()
    );
}

#[test]
fn pcie_replays_count_only_when_the_policy_sets_a_limit() {
    let s = with_telemetry(|t| t.pcie_replay_counter = Reading::Value(500));
    assert_eq!(verdict(&s), healthy());
    let mut p = Policy::default();
    p.pcie.replay_growth_max = Limit::Max(100);
    assert_eq!(verdict_with(&p, &s).1, ["PCIe replays +500"]);
    let h = grade(
        &p,
        &s,
        None,
        &History {
            pcie_replays: Some(450),
            ..History::default()
        },
    );
    assert_eq!(h.state, HealthState::Healthy);
}

#[test]
fn a_lost_gpu_is_unhealthy_even_though_nothing_else_reads() {
    let mut t = GpuTelemetry::unknown("NVML: the GPU has fallen off the bus");
    t.gpu_lost = true;
    let s = Signals {
        aer: no_aer(),
        link: no_link(),
        telemetry: Some(t),
    };
    assert_eq!(
        verdict(&s),
        (
            HealthState::Unhealthy,
            vec!["GPU lost (fell off the bus)".to_owned()]
        )
    );
}

#[test]
fn reasons_list_every_finding_worst_first() {
    let mut s = with_telemetry(|t| {
        t.temperature_c = Reading::Value(91);
        t.ecc_uncorrected_volatile = Reading::Value(2);
    });
    s.link = link(8, 16, 16.0, 16.0);
    s.aer = aer(0, 1, 1);
    assert_eq!(
        verdict(&s),
        (
            HealthState::Unhealthy,
            vec![
                "AER fatal 1 (DLP 1)".to_owned(),
                "uncorrectable ECC 2 (volatile)".to_owned(),
                "AER non-fatal 1 (CmpltTO 1)".to_owned(),
                "link x8 of x16".to_owned(),
                "temperature 91C at or above slowdown 90C".to_owned(),
            ]
        )
    );
}

fn ids(device: u16, sub: Option<u16>) -> BoardIds {
    BoardIds {
        vendor: PciId(0x10de),
        device: PciId(device),
        subsystem_vendor: sub.map(|_| PciId(0x10de)),
        subsystem_device: sub.map(PciId),
    }
}

#[test]
fn the_expected_width_comes_from_baseline_then_board_then_peers_then_maximum() {
    let p = Policy::default().link;
    let a2 = ids(0x25b6, Some(0x157e));
    let t4 = ids(0x1eb8, None);
    let e = |ids, base, peers, max| expected_width(&p, ids, base, peers, max);
    assert_eq!(
        e(a2, Some(4), Some(16), Some(16)).unwrap(),
        ExpectedWidth {
            lanes: 4,
            basis: WidthBasis::Baseline
        }
    );
    assert_eq!(
        e(a2, None, Some(16), Some(16)).unwrap(),
        ExpectedWidth {
            lanes: 8,
            basis: WidthBasis::Board { model: "A2".into() }
        }
    );
    assert_eq!(
        e(t4, None, Some(8), Some(16)).unwrap().basis,
        WidthBasis::Peers
    );
    assert_eq!(
        e(t4, None, None, Some(16)).unwrap(),
        ExpectedWidth {
            lanes: 16,
            basis: WidthBasis::MaxWidth
        }
    );
    assert_eq!(e(t4, None, None, None), None);
    // Never more than the chip can do.
    assert_eq!(e(t4, Some(32), None, Some(16)).unwrap().lanes, 16);
    // An A16 (same device ID, other subsystem) is not an A2.
    assert_eq!(
        e(ids(0x25b6, Some(0x14a9)), None, None, Some(16))
            .unwrap()
            .basis,
        WidthBasis::MaxWidth
    );
}

#[test]
fn the_width_rule_can_be_narrowed_or_switched_off() {
    let mut p = Policy::default().link;
    p.fallback = LinkFallback::None;
    assert_eq!(
        expected_width(&p, ids(0x1eb8, None), None, None, Some(16)),
        None
    );
    p.compare_peers = false;
    assert_eq!(
        expected_width(&p, ids(0x1eb8, None), None, Some(16), Some(16)),
        None
    );
    p.judge_width = false;
    assert_eq!(
        expected_width(&p, ids(0x1eb8, None), Some(16), None, Some(16)),
        None
    );
}
