//! The agent's write routes check every name, board and capacity before the first write (issue
//! 27): a layout naming a MIG type the board does not have, applied with `force` on a partly used
//! H200, is refused and clears nothing; a create of such a type writes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use gpu_sysfs::Host as _;
use gpu_sysfs::actuate::set_vf_type;
use gpu_sysfs::testing::FakeKernel;
use support::{request, start};

const H200_TYPES: &[(u32, &str)] = &[
    (1414, "NVIDIA H200X-1-18C"),
    (1417, "NVIDIA H200X-2-35C"),
    (1420, "NVIDIA H200X-3-71C"),
    (1428, "NVIDIA H200X-141C"),
];
const VF0_TYPE: &str = "sys/bus/pci/devices/0000:26:00.4/nvidia/current_vgpu_type";

/// An H200 (VFs 0000:26:00.4 …) whose first VF holds a 1g MIG-backed vGPU.
fn partly_used_h200() -> Arc<FakeKernel> {
    let k = FakeKernel::vendor_vfio_host(0x2335, 141 * 1024, H200_TYPES, 4).unwrap();
    set_vf_type(&k, &"0000:26:00.4".parse().unwrap(), 1414, false).unwrap();
    Arc::new(k)
}

#[test]
fn a_forced_layout_with_a_type_the_board_lacks_clears_nothing() {
    let k = partly_used_h200();
    let a = start(Arc::clone(&k));
    let writes = k.writes().len();
    let layout = "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices:\n        H200X-3-40C: 1\n";
    let r = request(
        &a.socket,
        "PUT",
        "/v1/layout?config=c&force=true",
        Some(layout),
    );
    assert!(r.status >= 400, "{} {}", r.status, r.body);
    assert!(r.body.contains("H200X-3-40C"), "{}", r.body);
    assert_eq!(
        k.writes().len(),
        writes,
        "nothing written: {:?}",
        k.writes()
    );
    assert_eq!(k.read_string(VF0_TYPE).unwrap().trim(), "1414");
}

#[test]
fn a_create_of_a_type_the_board_lacks_writes_nothing() {
    let k = partly_used_h200();
    let a = start(Arc::clone(&k));
    let writes = k.writes().len();
    for profile in ["H200X-3-40C", "L40S-24Q"] {
        let body = format!(
            r#"{{"parent":"0000:26:00.5","profile":"{profile}","machine":"vm1","request":"gpu","index":0}}"#
        );
        let r = request(&a.socket, "POST", "/v1/vgpus", Some(&body));
        assert!(r.status >= 400, "{profile}: {} {}", r.status, r.body);
        assert!(r.body.contains(profile), "{profile}: {}", r.body);
    }
    assert_eq!(
        k.writes().len(),
        writes,
        "nothing written: {:?}",
        k.writes()
    );
    assert_eq!(k.read_string(VF0_TYPE).unwrap().trim(), "1414");
}
