//! MIG start slots and Kubernetes versions as the export reads them.

use super::*;

#[test]
fn mig_placements_follow_the_h100_geometry() {
    assert_eq!(mig_placements(1, 7), vec![0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(mig_placements(2, 7), vec![0, 2, 4]);
    assert_eq!(mig_placements(3, 7), vec![0, 4]);
    assert_eq!(mig_placements(4, 7), vec![0]);
    assert_eq!(mig_placements(7, 7), vec![0]);
    assert_eq!(mig_placements(2, 4), vec![0, 2]);
    assert!(mig_placements(8, 7).is_empty());
}

#[test]
fn mig_spans_come_from_the_geometry_table_where_the_product_is_in_it() {
    // H200 SXM: 8 memory slices; a 3g instance holds 4 of them, a 7g all 8.
    assert_eq!(mig_memory_slices(0x2335, 7), 8);
    assert_eq!(mig_spans(0x2335, 3, 71 * 1024, 7), vec![(0, 4), (4, 4)]);
    assert_eq!(mig_spans(0x2335, 7, 141 * 1024, 7), vec![(0, 8)]);
    assert_eq!(mig_spans(0x2335, 1, 18 * 1024, 7).len(), 7);
    assert!(
        mig_spans(0x2335, 5, 90 * 1024, 7).is_empty(),
        "no 5g profile"
    );
    // A product the table does not describe keeps the power-of-two rule.
    assert_eq!(mig_memory_slices(0xffff, 7), 7);
    assert_eq!(mig_spans(0xffff, 3, 20 * 1024, 7), vec![(0, 3), (4, 3)]);
}

#[test]
fn versions_parse_with_or_without_patch() {
    assert_eq!("1.34".parse::<K8sVersion>().unwrap(), K8sVersion::V1_34);
    assert_eq!(
        "v1.36.2".parse::<K8sVersion>().unwrap(),
        K8sVersion::V1_36_2
    );
    assert_eq!(
        "1.36".parse::<K8sVersion>().unwrap(),
        "1.36.0".parse().unwrap()
    );
    assert_eq!(
        "1.36.2".parse::<K8sVersion>().unwrap().to_string(),
        "1.36.2"
    );
    assert_eq!(K8sVersion::V1_36.to_string(), "1.36");
    for bad in ["1.33", "1.36.", "1.36.x", "1.36.2.1", "2.36", "1.38.0"] {
        assert!(bad.parse::<K8sVersion>().is_err(), "{bad}");
    }
    assert!(K8sVersion::V1_35.splits_counters() && !K8sVersion::V1_34.splits_counters());
}
