//! `POST /v1/gpus/{gpu}/bind` keeps the rule `gpuslice gpu bind` keeps: a GPU graded Unhealthy
//! is not handed to a VM unless forced, a Degraded one is bound with a warning.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use gpu_sysfs::testing::{FakeKernel, PciSpec, TreeBuilder};
use support::{request, start};

/// Two GPUs of one model, each alone in its IOMMU group on `nvidia`: `0000:01:00.0` with three
/// fatal AER errors (Unhealthy), `0000:02:00.0` trained at x8 where its peer runs x16 (Degraded).
fn kernel() -> Arc<FakeKernel> {
    let mut b = TreeBuilder::new();
    support::unhealthy_gpu(&mut b).pci(
        "0000:02:00.0",
        PciSpec::new(0x10de, 0x2204, 0x030000)
            .driver("nvidia")
            .group(2)
            .link(8, 16, "16.0 GT/s PCIe", "16.0 GT/s PCIe"),
    );
    Arc::new(FakeKernel::new(b.finish().unwrap()).unwrap())
}

#[test]
fn an_unhealthy_gpu_is_refused_with_409_and_nothing_written_unless_forced() {
    let k = kernel();
    let a = start(Arc::clone(&k));
    let before = k.snapshot().unwrap();
    let r = request(&a.socket, "POST", "/v1/gpus/0000:01:00.0/bind", None);
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.kind(), "unhealthy");
    assert_eq!(
        r.json()["error"]["message"],
        "0000:01:00.0 is Unhealthy (AER fatal 3 (MalfTLP 3)); a VM would get a failing GPU; \
         nothing was changed (?force=true binds it anyway)"
    );
    assert_eq!(k.snapshot().unwrap(), before, "nothing written");

    let r = request(
        &a.socket,
        "POST",
        "/v1/gpus/0000:01:00.0/bind?force=true",
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let warnings = r.json()["warnings"].clone();
    assert!(
        warnings.as_array().is_some_and(|w| w.iter().any(|w| w
            .as_str()
            .is_some_and(|w| w.starts_with("0000:01:00.0 is Unhealthy")))),
        "{}",
        r.body
    );
    assert_eq!(
        r.json()["functions"][0]["driverAfter"],
        "vfio-pci",
        "forced, it is bound"
    );
    a.stop();
}

#[test]
fn a_degraded_gpu_is_bound_with_a_warning() {
    let k = kernel();
    let a = start(Arc::clone(&k));
    let r = request(&a.socket, "POST", "/v1/gpus/0000:02:00.0/bind", None);
    assert_eq!(r.status, 200, "{}", r.body);
    let w = r.json()["warnings"].to_string();
    assert!(
        w.contains("0000:02:00.0 is Degraded (link x8 of x16"),
        "{}",
        r.body
    );
    a.stop();
}
