//! A small direct-mapped memo of [`super::MigGeometry::fits_every_given`], one per thread. A placement
//! asks it of every MIG GPU it considers, and across a fleet the GPUs are in few states, so
//! the same questions come again and again; the exhaustive search behind each costs far more
//! than a look-up. A pure function's answers only: a slot holds one key and its answer, and a
//! new key takes the slot of an old one.

use super::MigOccupancy;
use std::cell::RefCell;

const SLOTS: usize = 1024;

type Answer = Result<(), MigOccupancy>;

thread_local! {
    static TABLE: RefCell<Vec<(u128, Answer)>> = const { RefCell::new(Vec::new()) };
}

fn slot(key: u128) -> usize {
    let folded = (key as u64) ^ ((key >> 64) as u64);
    (folded.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize % SLOTS
}

pub(super) fn get(key: u128) -> Option<Answer> {
    TABLE.with(|t| {
        t.borrow()
            .get(slot(key))
            .and_then(|(k, a)| (*k == key).then_some(*a))
    })
}

pub(super) fn put(key: u128, answer: Answer) {
    TABLE.with(|t| {
        let mut t = t.borrow_mut();
        if t.is_empty() {
            t.resize(SLOTS, (0, Ok(())));
        }
        if let Some(s) = t.get_mut(slot(key)) {
            *s = (key, answer);
        }
    });
}
