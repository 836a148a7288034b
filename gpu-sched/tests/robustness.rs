#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Any fleet that decodes, however inconsistent (allocations on unknown nodes or devices, pools
//! that do not match their parents, counts that disagree), and any Machine: the scheduler answers
//! with a value or an error, never a panic, and the fleet it writes back loads again.

use gpu_core::testing::{fleet, machine, topology};
use gpu_sched::{FleetState, Policy};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(
                "proptest-regressions/robustness.txt",
            ),
        )),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_fleets_and_machines_never_panic(
        f in fleet(), ms in proptest::collection::vec(machine(), 1..4), extra in topology()
    ) {
        let Ok(mut s) = FleetState::new(f) else {
            return Ok(());
        };
        for m in &ms {
            let _ = s.try_place(m, Policy::Spread);
            let _ = s.place(m, Policy::Binpack);
        }
        let _ = s.add_node(extra);
        let _ = s.plan_evacuation();
        let names: Vec<String> = s.nodes().map(|n| n.node.clone()).collect();
        for n in &names {
            let _ = s.plan_drain(n);
        }
        for a in s.allocations() {
            for n in &names {
                let _ = s.plan_migration(&a.machine, n, &[]);
            }
            let _ = s.mark_created(&a.machine);
            prop_assert!(s.release(&a.machine).is_ok());
        }
        if let Some(n) = names.first() {
            prop_assert!(s.remove_node(n).is_ok());
        }
        let again = FleetState::new(s.to_fleet());
        prop_assert!(again.is_ok());
    }
}
