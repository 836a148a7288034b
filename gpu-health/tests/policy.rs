//! The policy: defaults in code, overrides from TOML, YAML or JSON, unknown keys rejected.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpu_core::PciId;
use gpu_health::policy::{BoardWidth, LinkFallback, PolicyFormat};
use gpu_health::{HealthError, Limit, Policy};

fn toml(text: &str) -> Result<Policy, HealthError> {
    Policy::from_str_as(text, PolicyFormat::Toml, "test.toml")
}

fn yaml(text: &str) -> Result<Policy, HealthError> {
    Policy::from_str_as(text, PolicyFormat::Yaml, "test.yaml")
}

fn message(e: HealthError) -> String {
    e.to_string()
}

#[test]
fn the_defaults_are_the_documented_ones() {
    let p = Policy::default();
    assert_eq!(p.aer.fatal_max, Limit::Max(0));
    assert_eq!(p.aer.nonfatal_growth_max, Limit::Max(0));
    assert_eq!(p.aer.correctable_growth_max, Limit::Off);
    assert_eq!(p.ecc.uncorrectable_volatile_max, Limit::Max(0));
    assert_eq!(p.ecc.uncorrectable_aggregate_max, Limit::Max(0));
    assert_eq!(p.ecc.correctable_volatile_max, Limit::Max(1000));
    assert_eq!(p.retirement.retired_pages_max, Limit::Max(60));
    assert_eq!(p.link.fallback, LinkFallback::MaxWidth);
    assert_eq!(p.link.boards.len(), 1);
    assert_eq!(p.link.boards[0].model, "A2");
    assert_eq!(p.pcie.replay_growth_max, Limit::Off);
    // The documentation shows the defaults as TOML; they must read back unchanged.
    let doc = include_str!("../../docs/health-policy.md");
    let block = doc
        .split("```toml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("docs/health-policy.md has a toml block with the defaults");
    assert_eq!(toml(block).unwrap(), p);
}

#[test]
fn an_empty_file_keeps_every_default() {
    assert_eq!(toml("").unwrap(), Policy::default());
    assert_eq!(yaml("\n").unwrap(), Policy::default());
}

#[test]
fn a_toml_file_overrides_only_the_keys_it_names() {
    let p = toml(
        "[ecc]\ncorrectableVolatileMax = 50\nuncorrectableAggregateMax = \"off\"\n\n[link]\nfallback = \"none\"\n",
    )
    .unwrap();
    assert_eq!(p.ecc.correctable_volatile_max, Limit::Max(50));
    assert_eq!(p.ecc.uncorrectable_aggregate_max, Limit::Off);
    assert_eq!(p.ecc.uncorrectable_volatile_max, Limit::Max(0));
    assert_eq!(p.link.fallback, LinkFallback::None);
    assert!(p.link.judge_width);
}

#[test]
fn a_yaml_or_json_file_reads_the_same_keys() {
    let y =
        yaml("temperature:\n  slowdownMarginC: 3\naer:\n  correctableGrowthMax: 100\n").unwrap();
    assert_eq!(y.temperature.slowdown_margin_c, 3);
    assert_eq!(y.aer.correctable_growth_max, Limit::Max(100));
    let j = yaml(r#"{"rowRemap": {"pendingDegrades": false}}"#).unwrap();
    assert!(!j.row_remap.pending_degrades);
}

#[test]
fn an_unknown_key_is_rejected_naming_it() {
    let e = message(toml("[ecc]\ncorrectableMax = 5\n").unwrap_err());
    assert!(e.contains("test.toml"), "{e}");
    assert!(e.contains("correctableMax"), "{e}");
    let e = message(yaml("tempreature:\n  slowdownMarginC: 3\n").unwrap_err());
    assert!(e.contains("tempreature"), "{e}");
    let e = message(toml("[link]\nboards = [{ model = \"X\", vendor = \"10de\", device = \"1234\", width = 8, lanes = 8 }]\n").unwrap_err());
    assert!(e.contains("lanes"), "{e}");
}

#[test]
fn a_bad_value_is_rejected_naming_it() {
    let e = message(toml("[aer]\nfatalMax = -1\n").unwrap_err());
    assert!(e.contains("negative"), "{e}");
    let e = message(toml("[aer]\nfatalMax = \"never\"\n").unwrap_err());
    assert!(e.contains("\"never\" is not a count"), "{e}");
    let e = message(toml("[link]\nfallback = \"widest\"\n").unwrap_err());
    assert!(e.contains("widest"), "{e}");
    let e = message(
        toml("[[link.boards]]\nmodel = \"Odd\"\nvendor = \"10de\"\ndevice = \"1234\"\nwidth = 6\n")
            .unwrap_err(),
    );
    assert!(e.contains("Odd width 6 is not a PCIe lane count"), "{e}");
    let e = message(toml("[temperature]\nshutdownMarginC = 80\n").unwrap_err());
    assert!(e.contains("temperature.shutdownMarginC 80"), "{e}");
    let e = message(toml("[ecc\n").unwrap_err());
    assert!(e.starts_with("policy test.toml: "), "{e}");
}

#[test]
fn values_serde_accepts_and_the_policy_refuses_are_typed_with_the_same_words() {
    let mut p = Policy::default();
    p.temperature.slowdown_margin_c = 51;
    let e = p.validate().unwrap_err();
    assert!(
        matches!(
            e,
            HealthError::PolicyMargin {
                key: "temperature.slowdownMarginC",
                value: 51
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "temperature.slowdownMarginC 51 is more than 50 °C"
    );
    assert_eq!(e.kind(), gpu_core::ErrorKind::InvalidConfig);
    let e = message(
        toml("[[link.boards]]\nmodel = \"Odd\"\nvendor = \"10de\"\ndevice = \"1234\"\nwidth = 6\n")
            .unwrap_err(),
    );
    assert_eq!(
        e,
        "policy test.toml: link.boards: Odd width 6 is not a PCIe lane count (1, 2, 4, 8, 12, 16 or 32)"
    );
    let e = message(toml("[xid]\nunhealthy = [79]\ndegraded = [79]\n").unwrap_err());
    assert_eq!(
        e,
        "policy test.toml: xid: XID 79 is in both xid.unhealthy and xid.degraded; give it one verdict"
    );
}

#[test]
fn boards_in_a_file_add_to_the_built_in_table_and_replace_same_ids() {
    let p = toml(
        "[[link.boards]]\nmodel = \"A2 (relabelled)\"\nvendor = \"10de\"\ndevice = \"25b6\"\nsubsystemVendor = \"10de\"\nsubsystemDevice = \"157e\"\nwidth = 4\n\n[[link.boards]]\nmodel = \"Custom\"\nvendor = \"1002\"\ndevice = \"7448\"\nwidth = 8\n",
    )
    .unwrap();
    assert_eq!(p.link.boards.len(), 2);
    let a2 = p
        .link
        .board(
            PciId(0x10de),
            PciId(0x25b6),
            Some(PciId(0x10de)),
            Some(PciId(0x157e)),
        )
        .unwrap();
    assert_eq!((a2.model.as_str(), a2.width), ("A2 (relabelled)", 4));
    let custom: &BoardWidth = p
        .link
        .board(PciId(0x1002), PciId(0x7448), None, None)
        .unwrap();
    assert_eq!(custom.width, 8);
}

#[test]
fn files_are_read_by_extension_and_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("p.toml");
    std::fs::write(&t, "[retirement]\nretiredPagesMax = 10\n").unwrap();
    assert_eq!(
        Policy::from_file(&t).unwrap().retirement.retired_pages_max,
        Limit::Max(10)
    );
    let y = dir.path().join("p.yml");
    std::fs::write(&y, "retirement:\n  retiredPagesMax: off\n").unwrap();
    assert_eq!(
        Policy::from_file(&y).unwrap().retirement.retired_pages_max,
        Limit::Off
    );
    let other = dir.path().join("p.ini");
    std::fs::write(&other, "").unwrap();
    assert!(message(Policy::from_file(&other).unwrap_err()).contains("unknown file type"));
    let missing = dir.path().join("missing.toml");
    let e = Policy::from_file(&missing).unwrap_err();
    assert!(matches!(e, HealthError::PolicyRead { .. }));
    assert!(message(e).contains("missing.toml"));
}

#[test]
fn a_policy_round_trips_through_its_own_serialization() {
    let p = Policy::default();
    let text = toml::to_string(&p).unwrap();
    assert_eq!(toml(&text).unwrap(), p);
    let y = serde_yaml_ng::to_string(&p).unwrap();
    assert_eq!(yaml(&y).unwrap(), p);
}

#[test]
fn a_policy_of_nested_brackets_is_refused_fast() {
    let text = format!("aer: {}", "[".repeat(200_000));
    let start = std::time::Instant::now();
    let e = Policy::from_str_as(&text, PolicyFormat::Yaml, "deep.yaml").unwrap_err();
    assert!(start.elapsed() < std::time::Duration::from_secs(2));
    assert!(e.to_string().contains("nested more than 64"), "{e}");
}

#[test]
fn xid_rules_read_from_a_file_and_an_xid_given_two_verdicts_is_refused() {
    let p = toml("[xid]\nunhealthy = [79]\ndegraded = [13]\nunnamed = \"ignore\"\n").unwrap();
    assert_eq!(p.xid.unhealthy, vec![79]);
    assert_eq!(p.xid.degraded, vec![13]);
    assert_eq!(p.xid.unnamed, gpu_health::events::XidVerdict::Ignore);
    let e = message(toml("[xid]\nunhealthy = [79]\ndegraded = [79]\n").unwrap_err());
    assert!(e.contains("XID 79 is in both"), "{e}");
    let e = message(toml("[xid]\nunnamed = \"panic\"\n").unwrap_err());
    assert!(e.contains("panic"), "{e}");
}
