//! Acceptance under churn on the one slot model (`gpu_core::slots`): runs of slots (MIG GPU
//! instances, mixed-size vGPU placements) arriving and leaving on a pool of GPUs, placed by
//! three rules.
//!
//! - **first-fit**: the first GPU (in address order) where a legal start is free, at its lowest
//!   free start.
//! - **current**: the solver's binpack GPU choice (the GPU with the most slots held where the run
//!   fits, lowest index on a tie) at the lowest free start (what the driver takes when no start
//!   is asked for, and what gpuslice's MIG geometry search assumes today).
//! - **slots**: fragmentation-aware: among every GPU and legal free start, the one that loses the
//!   least room for later runs (`SlotMask::room` over every shape of the lattice), then the
//!   fuller GPU, then the lower index and start.
//!
//! Each run stays for a lifetime drawn uniformly from 1 to twice the mean (SplitMix64, seeded:
//! the same counts on every machine). The mean sets the offered load: the runs alive at once
//! ask, on average, for `load` times the slots of the pool.

use gpu_core::slots::{SlotChoice, SlotMask, SlotShape, choose};

use crate::churn::Rng;

/// A lattice and the shapes that arrive on it, each with its weight in the mix.
#[derive(Debug, Clone)]
pub struct Mix {
    /// What it models, for the report.
    pub name: &'static str,
    /// Slots of one GPU.
    pub slots: u8,
    /// The shapes and their weights.
    pub shapes: Vec<(SlotShape, u32)>,
}

impl Mix {
    /// The H200's GPU-instance profiles (gpu-core's MIG table, eight memory slots), weighted
    /// 1g.18gb 8, 1g.35gb 3, 2g.35gb 5, 3g.71gb 3, 4g.71gb 1, 7g.141gb 1.
    pub fn h200_mig() -> Mix {
        let g = gpu_core::mig::MigGeometry::for_vgpu_board("H200X");
        let weights = [8, 3, 5, 3, 1, 1];
        let shapes = g
            .map(|g| {
                g.profiles
                    .iter()
                    .zip(weights)
                    .map(|(p, w)| (SlotShape::of_mig(p), w))
                    .collect()
            })
            .unwrap_or_default();
        Mix {
            name: "H200 MIG instances",
            slots: 8,
            shapes,
        }
    }

    /// A mixed-size lattice of 48 slots with runs of 24, 12 and 6 at aligned starts (the
    /// placements the fake driver lists for an L40S; illustrative, not a driver capture),
    /// weighted 1 : 2 : 4.
    pub fn mixed_48() -> Mix {
        let run = |size: u8| SlotShape {
            size,
            starts: (0..48).step_by(usize::from(size)).collect(),
        };
        Mix {
            name: "mixed-size vGPUs (24/12/6 of 48 slots)",
            slots: 48,
            shapes: vec![(run(24), 1), (run(12), 2), (run(6), 4)],
        }
    }

    fn mean_size(&self) -> f64 {
        let w: u32 = self.shapes.iter().map(|(_, w)| *w).sum();
        let s: f64 = self
            .shapes
            .iter()
            .map(|(sh, w)| f64::from(sh.size) * f64::from(*w))
            .sum();
        s / f64::from(w.max(1))
    }
}

/// How a run is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// First GPU, lowest start.
    FirstFit,
    /// Fullest GPU, lowest start.
    Current,
    /// Least room lost, then fullest GPU.
    Slots,
}

/// What a replay accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// Runs that arrived.
    pub arrivals: u32,
    /// Runs placed.
    pub accepted: u32,
    /// Runs refused while some GPU had as many free slots as the run needs (fragmentation).
    pub refused_with_room: u32,
}

/// Where `shape` goes on `gpus` by `rule`: the GPU's index and the start.
fn pick(
    gpus: &[SlotMask],
    shape: &SlotShape,
    later: &[SlotShape],
    rule: Rule,
) -> Option<(usize, u8)> {
    match rule {
        Rule::FirstFit => gpus
            .iter()
            .enumerate()
            .find_map(|(i, m)| m.free_starts(shape).first().map(|s| (i, *s))),
        Rule::Current => gpus
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.free_starts(shape).first().map(|s| (i, *s, m.held())))
            .max_by_key(|(i, _, held)| (*held, std::cmp::Reverse(*i)))
            .map(|(i, s, _)| (i, s)),
        Rule::Slots => {
            let mut best: Option<((u64, u32), usize, u8)> = None;
            for (i, m) in gpus.iter().enumerate() {
                if m.free_starts(shape).is_empty() {
                    continue;
                }
                let before = m.room(later);
                let Ok(s) = choose(*m, 64, shape, later, SlotChoice::KeepMost) else {
                    continue;
                };
                let mut after = *m;
                after.hold(s, shape.size);
                let lost = before.saturating_sub(after.room(later));
                // Least room lost first, then the fuller GPU (kept as u64::MAX - held).
                let key = (lost, u32::MAX - m.held());
                if best.is_none_or(|(k, _, _)| key < k) {
                    best = Some((key, i, s));
                }
            }
            best.map(|(_, i, s)| (i, s))
        }
    }
}

/// Replays `arrivals` runs of `mix` on `gpus` GPUs at offered load `load` with `rule`.
pub fn replay(mix: &Mix, gpus: usize, arrivals: u32, load: f64, seed: u64, rule: Rule) -> Outcome {
    let mut rng = Rng::new(seed);
    let total: u32 = mix.shapes.iter().map(|(_, w)| *w).sum();
    let later: Vec<SlotShape> = mix.shapes.iter().map(|(s, _)| s.clone()).collect();
    // Alive at once ≈ mean lifetime (one arrival per step): ask for `load` × the pool.
    let pool = gpus as f64 * f64::from(mix.slots);
    let mean_life = (load * pool / mix.mean_size()).max(1.0) as u64;
    let mut masks = vec![SlotMask::empty(); gpus];
    // (leaves at step, gpu, start, size)
    let mut alive: Vec<(u64, usize, u8, u8)> = Vec::new();
    let mut out = Outcome {
        arrivals: 0,
        accepted: 0,
        refused_with_room: 0,
    };
    for step in 0..u64::from(arrivals) {
        alive.retain(|(leave, g, s, size)| {
            if *leave <= step {
                masks[*g].free(*s, *size);
                false
            } else {
                true
            }
        });
        let mut draw = rng.below(u64::from(total));
        let mut shape = &mix.shapes[0].0;
        for (s, w) in &mix.shapes {
            if draw < u64::from(*w) {
                shape = s;
                break;
            }
            draw -= u64::from(*w);
        }
        let life = 1 + rng.below(2 * mean_life);
        out.arrivals += 1;
        match pick(&masks, shape, &later, rule) {
            Some((g, s)) => {
                masks[g].hold(s, shape.size);
                alive.push((step + life, g, s, shape.size));
                out.accepted += 1;
            }
            None => {
                let room = masks
                    .iter()
                    .any(|m| u32::from(mix.slots) - m.held() >= u32::from(shape.size));
                if room {
                    out.refused_with_room += 1;
                }
            }
        }
    }
    out
}
