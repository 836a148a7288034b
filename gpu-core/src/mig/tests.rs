//! The geometry table, the placement search and the slots, checked against NVIDIA's MIG guide.
#![allow(clippy::unwrap_used)]

use super::search::Ask;
use super::*;

fn h200() -> &'static MigGeometry {
    MigGeometry::for_device(0x2335).unwrap()
}

#[test]
fn the_occupancy_is_known_only_when_every_instance_has_a_known_start() {
    let mut s = MigSlots::new(h200());
    s.placed.push(MigPlaced {
        profile: "1g.18gb".into(),
        start: 0,
    });
    s.placed.push(MigPlaced {
        profile: "2g.35gb".into(),
        start: 2,
    });
    let (held, slices) = s.known_occupancy().unwrap();
    assert_eq!(slices, 3);
    assert!(held.is_held(0) && held.is_held(2) && held.is_held(3));
    assert!(!held.is_held(1) && !held.is_held(4));
    let mut unknown = s.clone();
    unknown.unplaced.push("1g.18gb".into());
    assert_eq!(unknown.known_occupancy(), None);
    let mut pending = s.clone();
    pending.pending.push("1g.18gb".into());
    assert_eq!(pending.known_occupancy(), None);
    let mut overlapping = s;
    overlapping.placed.push(MigPlaced {
        profile: "1g.18gb".into(),
        start: 3,
    });
    assert_eq!(overlapping.known_occupancy(), None);
}

#[test]
fn releasing_one_of_several_placed_instances_of_a_profile_forgets_where_the_others_are() {
    let g = h200();
    let one = g.profile_named("1g.18gb").unwrap();
    let four = g.profile_named("4g.71gb").unwrap();
    let at = |profile: &str, start| MigPlaced {
        profile: profile.into(),
        start,
    };
    let mut s = MigSlots::new(g);
    s.placed = vec![at("1g.18gb", 0), at("1g.18gb", 4), at("2g.35gb", 2)];
    // One of the two 1g goes; the one left is at 0 or 4, so a 4g (slots 0-3) may not fit.
    assert!(s.release(one));
    assert_eq!(s.placed, [at("2g.35gb", 2)]);
    assert_eq!(s.unplaced, ["1g.18gb"]);
    assert!(s.check(four).is_err());
    // The last one of a profile frees its own start: with the 2g gone, slots 2-3 are free.
    let mut s = MigSlots::new(g);
    s.placed = vec![at("1g.18gb", 6), at("2g.35gb", 2)];
    let two = g.profile_named("2g.35gb").unwrap();
    assert!(s.check(four).is_err());
    assert!(s.release(two));
    assert_eq!(s.placed, [at("1g.18gb", 6)]);
    assert!(s.unplaced.is_empty());
    assert!(s.check(four).is_ok());
}

#[test]
fn h200_profiles_start_where_the_mig_guide_says() {
    let g = h200();
    let starts = |slices, mib| g.profile_for(slices, mib).unwrap().starts.to_vec();
    assert_eq!(starts(1, 18 * 1024), [0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(starts(1, 35 * 1024), [0, 2, 4, 6]);
    assert_eq!(starts(2, 35 * 1024), [0, 2, 4]);
    assert_eq!(starts(3, 71 * 1024), [0, 4]);
    assert_eq!(starts(4, 71 * 1024), [0]);
    assert_eq!(starts(7, 141 * 1024), [0]);
    assert_eq!(MigGeometry::for_vgpu_board("h200x"), Some(g));
}

#[test]
fn one_g_at_slots_0_and_4_leaves_no_room_for_a_3g() {
    let g = h200();
    let one = g.profile_for(1, 18 * 1024).unwrap();
    let three = g.profile_for(3, 71 * 1024).unwrap();
    let mut o = MigOccupancy::empty();
    o.hold(0, one);
    o.hold(4, one);
    assert_eq!(o.held(), 2);
    assert_eq!(g.fits(o, three), None);
    o.free(4, one);
    assert_eq!(g.fits(o, three), Some(4));
}

#[test]
fn two_3g_and_a_1g_need_nine_of_eight_memory_slices() {
    let g = h200();
    let one = g.profile_for(1, 18 * 1024).unwrap();
    let three = g.profile_for(3, 71 * 1024).unwrap();
    let e = g
        .place_all(MigOccupancy::empty(), &[three, three, one])
        .unwrap_err();
    assert_eq!(e.0, one);
    assert_eq!(e.1.held(), 8);
    let ok = g.place_all(MigOccupancy::empty(), &[three, one, one, one]);
    assert!(ok.is_ok());
}

#[test]
fn seven_1g_fill_an_h100_and_an_a30_takes_four() {
    let g = MigGeometry::for_device(0x2330).unwrap();
    let one = g.profile_for(1, 10 * 1024).unwrap();
    let o = g.place_all(MigOccupancy::empty(), &[one; 7]).unwrap();
    assert_eq!(g.fits(o, one), None);
    let a30 = MigGeometry::for_vgpu_board("A30").unwrap();
    let one = a30.profile_for(1, 6 * 1024).unwrap();
    assert!(a30.place_all(MigOccupancy::empty(), &[one; 4]).is_ok());
    assert!(a30.place_all(MigOccupancy::empty(), &[one; 5]).is_err());
}

#[test]
fn place_all_finds_a_placement_that_largest_first_lowest_start_misses() {
    let g = h200();
    let two = g.profile_named("2g.35gb").unwrap();
    let three = g.profile_named("3g.71gb").unwrap();
    // Greedy would put the 3g at 0 and find one 2g start; the 3g at 4 holds both.
    let o = g
        .place_all(MigOccupancy::empty(), &[two, three, two])
        .unwrap();
    assert_eq!(o.held(), 8);
}

#[test]
fn an_instance_of_unknown_start_blocks_what_any_of_its_starts_would() {
    let g = h200();
    let one = g.profile_named("1g.18gb").unwrap();
    let two = g.profile_named("2g.35gb").unwrap();
    let three = g.profile_named("3g.71gb").unwrap();
    let four = g.profile_named("4g.71gb").unwrap();
    let empty = MigOccupancy::empty();
    // One 1g anywhere leaves a 3g a half; two may sit at 0 and 4.
    assert!(g.fits_every(empty, &[one], three).is_ok());
    assert!(g.fits_every(empty, &[one, one], three).is_err());
    // A 3g may sit at 0: a 4g is never safe beside it, a 2g always is.
    assert!(g.fits_every(empty, &[three], four).is_err());
    assert!(g.fits_every(empty, &[three], two).is_ok());
    // A set with no placement at all is full.
    assert!(g.fits_every(empty, &[three, three, three], one).is_err());
}

/// The memo gives back what the search answers, for every small H200 question, asked
/// twice (the second time from the memo, or from a slot another key took since).
#[test]
fn the_memo_answers_what_the_search_does() {
    let g = h200();
    let all: Vec<&MigProfile> = g.profiles.iter().collect();
    let mut lists: Vec<Vec<&MigProfile>> = vec![vec![]];
    for a in &all {
        lists.push(vec![a]);
        for b in &all {
            lists.push(vec![a, b]);
        }
    }
    let one = g.profile_named("1g.18gb").unwrap();
    let mut at6 = MigOccupancy::empty();
    at6.hold(6, one);
    let mut asked = 0;
    for round in 0..2 {
        for placed in [MigOccupancy::empty(), at6] {
            for existing in &lists {
                for pending in lists.iter().take(8) {
                    for still_fit in [&[][..], &[one][..]] {
                        for q in &all {
                            let searched = g.search_every(&Ask {
                                placed,
                                existing,
                                still_fit,
                                pending,
                                profile: q,
                            });
                            let given = g.fits_every_given(placed, existing, still_fit, pending, q);
                            assert_eq!(
                                given, searched,
                                "round {round}: {existing:?} {pending:?} {}",
                                q.name
                            );
                            asked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(asked > 10_000, "{asked}");
    // A profile the table does not hold is answered by the search alone.
    let odd = MigProfile {
        name: "odd",
        ..*one
    };
    assert_eq!(
        g.fits_every_given(at6, &[&odd], &[], &[], one),
        g.search_every(&Ask {
            placed: at6,
            existing: &[&odd],
            still_fit: &[],
            pending: &[],
            profile: one,
        })
    );
}

/// `room` (one look-up, counting on from the first fit) answers what checking and
/// charging one instance at a time does, for every H200 state of at most one instance of
/// unknown start, one at a known start and three pending, and every profile and limit.
#[test]
fn room_counts_what_charging_one_at_a_time_does() {
    let g = h200();
    let names: Vec<&str> = g.profiles.iter().map(|p| p.name).collect();
    let mut states: Vec<MigSlots> = Vec::new();
    let mut pendings: Vec<Vec<String>> = vec![vec![]];
    for _ in 0..3 {
        let longer: Vec<Vec<String>> = pendings
            .iter()
            .filter(|v| v.len() == pendings.last().map_or(0, Vec::len))
            .flat_map(|v| {
                names.iter().map(move |n| {
                    let mut v = v.clone();
                    v.push((*n).to_owned());
                    v
                })
            })
            .collect();
        pendings.extend(longer);
    }
    let unplaced: Vec<Vec<String>> = std::iter::once(vec![])
        .chain(names.iter().map(|n| vec![(*n).to_owned()]))
        .collect();
    let placed = [
        vec![],
        vec![MigPlaced {
            profile: "1g.18gb".into(),
            start: 6,
        }],
    ];
    for pe in &pendings {
        for un in &unplaced {
            for pl in &placed {
                let mut s = MigSlots::new(g);
                s.pending.clone_from(pe);
                s.unplaced.clone_from(un);
                s.placed.clone_from(pl);
                states.push(s);
            }
        }
    }
    assert!(states.len() > 1000, "{}", states.len());
    for s in &states {
        for p in g.profiles {
            let mut one_by_one = s.clone();
            let mut n = 0;
            while n < 16 && one_by_one.check(p).is_ok() {
                one_by_one.charge(p);
                n += 1;
            }
            assert_eq!(s.creatable(p), n, "{s:?} {}", p.name);
            for limit in [1, 2, 7, u32::MAX] {
                match s.room(p, limit) {
                    Ok(k) => assert_eq!(k, n.min(limit.max(1)), "{s:?} {} {limit}", p.name),
                    Err(e) => {
                        assert_eq!(n, 0, "{s:?} {}", p.name);
                        assert_eq!(Err(e), s.check(p));
                    }
                }
            }
        }
    }
}

#[test]
fn slots_name_profiles_and_refuse_what_they_cannot_place() {
    let g = h200();
    let mut slots = MigSlots::new(g);
    let three = slots.profile_for(3, 71 * 1024).unwrap();
    assert_eq!(three.name, "3g.71gb");
    assert_eq!(slots.creatable(three), 2);
    slots.charge(three);
    assert_eq!(slots.creatable(three), 1);
    assert!(slots.release(three));
    assert_eq!(slots.creatable(three), 2);
    slots.unplaced.push("5g.99gb".into());
    let e = slots.check(three).unwrap_err();
    assert!(e.to_string().contains("5g.99gb"), "{e}");
    assert_eq!(slots.creatable(three), 0);
    let json = serde_json::to_string(&MigSlots {
        board: "H200X".into(),
        placed: vec![MigPlaced {
            profile: "1g.18gb".into(),
            start: 4,
        }],
        unplaced: vec![],
        creatable: vec![],
        pending: vec![],
    })
    .unwrap();
    assert_eq!(
        json,
        r#"{"board":"H200X","placed":[{"profile":"1g.18gb","start":4}]}"#
    );
}

#[test]
fn boards_map_mig_backed_types_to_nvidias_gpu_instance_profiles() {
    // (board, slices, GB as in the type name, profile): rows of NVIDIA's vGPU type tables.
    for (board, slices, gb, profile) in [
        ("A100", 1, 5, "1g.5gb"),
        ("A100X", 3, 20, "3g.20gb"),
        ("A100D", 1, 20, "1g.20gb"),
        ("A100DX", 7, 80, "7g.80gb"),
        ("H100", 2, 20, "2g.20gb"),
        ("H100XM", 1, 10, "1g.10gb"),
        ("H100XS", 1, 8, "1g.8gb"),
        ("H100L", 3, 47, "3g.47gb"),
        ("H100XL", 1, 24, "1g.24gb"),
        ("H200", 1, 35, "1g.35gb"),
        ("H200X", 4, 71, "4g.71gb"),
        ("H20", 1, 12, "1g.12gb"),
        ("H20X", 3, 71, "3g.71gb"),
        ("H800L", 7, 94, "7g.94gb"),
    ] {
        let g = MigGeometry::for_vgpu_board(board).unwrap();
        let p = g.profile_for(slices, gb * 1024).unwrap();
        assert_eq!(p.name, profile, "{board}-{slices}-{gb}C");
    }
    assert_eq!(MigGeometry::for_device(0x20b0).unwrap().vgpu_board, "A100X");
}

#[test]
fn what_the_driver_still_lists_narrows_where_existing_instances_sit() {
    let g = h200();
    let one = g.profile_named("1g.18gb").unwrap();
    let three = g.profile_named("3g.71gb").unwrap();
    let four = g.profile_named("4g.71gb").unwrap();
    let empty = MigOccupancy::empty();
    // Two 1g anywhere may block both 3g starts; with a 4g still creatable beside them they
    // sit in slots 4-6, and a 3g fits at 0.
    assert!(g.fits_every(empty, &[one, one], three).is_err());
    assert!(
        g.fits_every_given(empty, &[one, one], &[four], &[], three)
            .is_ok()
    );
    // A pending 3g (the driver picks its start when created) takes that room.
    assert!(
        g.fits_every_given(empty, &[one, one], &[four], &[three], three)
            .is_err()
    );
    // A list no placement explains (a 7g still creatable beside a 1g) leaves nothing safe.
    let seven = g.profile_named("7g.141gb").unwrap();
    assert!(
        g.fits_every_given(empty, &[one], &[seven], &[], one)
            .is_err()
    );
}
