//! The DRA claim store goes through a `Host` like every other state file: a claim is written
//! atomically and read back, and a store directory that is a link (or lies behind one) is
//! refused with nothing written through it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use gpu_integrations::dra::ClaimStore;
use gpu_integrations::dra::prepare::{ClaimPhase, PrepareAction, PreparedClaim};

const UUID: &str = "6a4b7c1e-2f3d-4e5a-9b8c-7d6e5f4a3b2c";

fn claim(uid: &str) -> PreparedClaim {
    PreparedClaim {
        claim_uid: uid.to_owned(),
        node: "n1".to_owned(),
        actions: vec![PrepareAction::CreateMdev {
            request: "gpu".to_owned(),
            device: "mbochs".to_owned(),
            parent: "mbochs".parse().unwrap(),
            type_id: "mbochs-small".parse().unwrap(),
            profile: "mbochs-small".to_owned(),
            uuid: UUID.parse().unwrap(),
        }],
        found: vec![],
        phase: ClaimPhase::Completed,
        boot_id: None,
    }
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                stack.push(p.clone());
            }
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
        }
    }
    out.sort();
    out
}

#[test]
fn a_claim_is_recorded_under_the_root_read_back_and_forgotten() {
    let root = tempfile::tempdir().unwrap();
    let store = ClaimStore::open(root.path(), None).unwrap();
    assert_eq!(
        store.read("uid-1").unwrap(),
        None,
        "an empty store has no claims"
    );
    assert!(store.read_prepared().unwrap().is_empty());

    store.write(&claim("uid-1")).unwrap();
    assert!(
        root.path()
            .join("var/lib/gpuslice/dra/claims/uid-1.json")
            .is_file()
    );
    assert_eq!(store.read("uid-1").unwrap(), Some(claim("uid-1")));
    let prepared = store.read_prepared().unwrap();
    assert!(prepared["n1"].instances.contains(UUID));

    store.remove("uid-1").unwrap();
    assert_eq!(store.read("uid-1").unwrap(), None);
    store.remove("uid-1").unwrap();
}

#[test]
fn an_explicit_state_dir_is_created_only_where_it_is_named() {
    let outside = tempfile::tempdir().unwrap();
    let dir = outside.path().join("state");
    let store = ClaimStore::open(Path::new("/nonexistent-root"), Some(&dir)).unwrap();
    assert!(!dir.exists(), "opening the store creates nothing");
    store.write(&claim("uid-2")).unwrap();
    assert_eq!(
        files_under(outside.path()),
        ["state", "state/claims", "state/claims/uid-2.json"]
    );
    assert_eq!(store.read("uid-2").unwrap(), Some(claim("uid-2")));
}

#[test]
fn a_state_dir_that_is_a_link_is_refused_and_nothing_is_written_through_it() {
    let outside = tempfile::tempdir().unwrap();
    let elsewhere = outside.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let link = outside.path().join("state");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let store = ClaimStore::open(Path::new("/nonexistent-root"), Some(&link)).unwrap();
    assert!(
        store.create().is_err(),
        "refused before a prepare changes the host"
    );
    let err = store.write(&claim("uid-3")).unwrap_err();
    // The one state directory names the link it refuses.
    assert!(
        err.to_string()
            .contains(&format!("the link {}", link.display())),
        "{err}"
    );
    assert_eq!(err.kind(), gpu_core::ErrorKind::HostError);
    assert!(
        files_under(&elsewhere).is_empty(),
        "nothing went through the link"
    );
}

#[test]
fn a_default_store_behind_a_link_out_of_the_root_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("var")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path().join("var/lib")).unwrap();
    let store = ClaimStore::open(root.path(), None).unwrap();
    assert!(store.write(&claim("uid-4")).is_err());
    assert!(
        files_under(outside.path()).is_empty(),
        "nothing left the root"
    );
}

#[test]
fn a_uid_that_could_name_a_path_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let store = ClaimStore::open(root.path(), None).unwrap();
    for uid in ["../x", ".hidden", "a/b", ""] {
        assert!(store.read(uid).is_err(), "{uid:?}");
        assert!(store.write(&claim(uid)).is_err(), "{uid:?}");
    }
    assert!(files_under(root.path()).is_empty());
}
