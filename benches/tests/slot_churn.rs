#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Acceptance under churn on the one slot model: deterministic for a seed, counts that add up,
//! and the fragmentation-aware rule never behind first-fit or the current rule on the recorded
//! seeds. `GPUSLICE_SLOT_CHURN_TABLE=1 cargo test -p gpuslice-benches --test slot_churn -- --nocapture`
//! prints the table in benches/RESULTS-slots.md.

use gpuslice_benches::slot_churn::{Mix, Outcome, Rule, replay};

const RULES: [Rule; 3] = [Rule::FirstFit, Rule::Current, Rule::Slots];

fn sum(mix: &Mix, gpus: usize, arrivals: u32, load: f64, seeds: u64, rule: Rule) -> Outcome {
    let mut t = Outcome {
        arrivals: 0,
        accepted: 0,
        refused_with_room: 0,
    };
    for seed in 1..=seeds {
        let o = replay(mix, gpus, arrivals, load, seed, rule);
        t.arrivals += o.arrivals;
        t.accepted += o.accepted;
        t.refused_with_room += o.refused_with_room;
    }
    t
}

#[test]
fn a_replay_is_deterministic_and_its_counts_add_up() {
    let mix = Mix::h200_mig();
    for rule in RULES {
        let a = replay(&mix, 20, 3_000, 1.0, 5, rule);
        assert_eq!(a, replay(&mix, 20, 3_000, 1.0, 5, rule));
        assert_eq!(a.arrivals, 3_000);
        assert!(a.accepted <= a.arrivals);
        assert!(a.refused_with_room <= a.arrivals - a.accepted);
    }
}

#[test]
fn the_slot_rule_accepts_at_least_as_many_as_first_fit_and_the_current_rule() {
    for mix in [Mix::h200_mig(), Mix::mixed_48()] {
        for load in [0.9, 1.1] {
            let got: Vec<Outcome> = RULES
                .iter()
                .map(|r| sum(&mix, 40, 4_000, load, 3, *r))
                .collect();
            assert!(
                got[2].accepted >= got[0].accepted && got[2].accepted >= got[1].accepted,
                "{} at load {load}: {got:?}",
                mix.name
            );
        }
    }
}

#[test]
fn print_the_table_when_asked() {
    if std::env::var_os("GPUSLICE_SLOT_CHURN_TABLE").is_none() {
        return;
    }
    println!("| lattice | offered load | rule | acceptance | refused with room |");
    println!("|---|---|---|---|---|");
    for mix in [Mix::h200_mig(), Mix::mixed_48()] {
        for load in [0.8, 0.9, 1.0, 1.1, 1.2, 1.5] {
            for rule in RULES {
                let o = sum(&mix, 200, 20_000, load, 10, rule);
                println!(
                    "| {} | {load:.1} | {rule:?} | {:.2}% ({}/{}) | {} |",
                    mix.name,
                    100.0 * f64::from(o.accepted) / f64::from(o.arrivals),
                    o.accepted,
                    o.arrivals,
                    o.refused_with_room
                );
            }
        }
    }
}

#[test]
fn through_the_solver_keep_most_accepts_more_than_leaving_starts_to_the_driver() {
    use gpu_sched::SlotPolicy;
    use gpuslice_benches::solver_slot_churn::replay as through_solver;
    let keep = through_solver(2, 1_500, 1.0, 3, SlotPolicy::KeepMost);
    assert_eq!(keep, through_solver(2, 1_500, 1.0, 3, SlotPolicy::KeepMost));
    assert_eq!(keep.arrivals, 1_500);
    let driver = through_solver(2, 1_500, 1.0, 3, SlotPolicy::Driver);
    assert!(
        keep.accepted > driver.accepted,
        "keep-most {keep:?}, driver {driver:?}"
    );
}
