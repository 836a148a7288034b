//! `POST /v1/vgpus` with mixed-size vGPUs: `mixedSizes` turns an idle L40S to mixed-size mode
//! (through the agent's NVML, here the fake), a second size joins the first, each vGPU's
//! placement is read back and shown (`placementId` in the answer and in `GET /v1/vgpus`), a mix
//! that does not fit is refused naming the placements left; asked of an agent without NVML, or
//! under a scheduler NVIDIA does not allow, refused before any write.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use gpu_core::PciAddress;
use gpu_nvml::fake::{FakeGpu, FakeNvml, FakeVgpuType};
use gpu_nvml::{NvmlDevices, VgpuMode, VgpuScheduler};
use gpu_sysfs::testing::FakeKernel;
use support::{get, request, start_with};

fn pf() -> PciAddress {
    "0000:26:00.0".parse().unwrap()
}

fn nvml(scheduler: VgpuScheduler) -> Arc<FakeNvml> {
    let types = vec![
        FakeVgpuType::new(1155, "NVIDIA L40S-24Q", 24576, 24, &[0, 24]),
        FakeVgpuType::new(1153, "NVIDIA L40S-12Q", 12288, 12, &[0, 12, 24, 36]),
    ];
    Arc::new(
        FakeNvml::new().with_gpu(
            pf(),
            FakeGpu::new(46068)
                .with_vgpu_types(types)
                .mixed_size(VgpuMode::Homogeneous)
                .with_scheduler(scheduler),
        ),
    )
}

fn create(socket: &std::path::Path, profile: &str, mixed: bool) -> support::Reply {
    let body = format!(r#"{{"parent":"0000:26:00.0","profile":"{profile}","mixedSizes":{mixed}}}"#);
    request(socket, "POST", "/v1/vgpus", Some(&body))
}

/// A create refused, its answer naming every one of `says`.
fn refused(r: &support::Reply, says: &[&str]) {
    assert!(r.status >= 400, "{}", r.body);
    assert!(says.iter().all(|s| r.body.contains(s)), "{}", r.body);
}

#[test]
fn mixed_sizes_asked_of_the_agent_mix_two_sizes_and_show_each_placement() {
    let k = Arc::new(FakeKernel::l40s_vendor_vfio_host(4).unwrap());
    // The kernel's side of the mode NVML turns on (the two fakes do not talk).
    k.set_mixed_size(pf()).unwrap();
    let n = nvml(VgpuScheduler::BestEffort);
    let shared: Arc<dyn NvmlDevices> = n.clone();
    let a = start_with(Arc::clone(&k), |c| c.mig = Some(gpu_agent::MigNvml(shared)));

    let r = create(&a.socket, "L40S-24Q", true);
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.json()["placementId"], 0, "{}", r.body);
    assert_eq!(
        n.vgpu_heterogeneous_mode(&pf()).unwrap(),
        VgpuMode::Heterogeneous
    );
    // The mode is on: a second size joins without being asked.
    let r = create(&a.socket, "L40S-12Q", false);
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.json()["placementId"], 24, "{}", r.body);

    let list = get(&a.socket, "/v1/vgpus");
    let text = list.body.clone();
    assert!(
        text.contains("\"placementId\":0") && text.contains("\"placementId\":24"),
        "{text}"
    );

    let before = k.writes().len();
    let r = create(&a.socket, "L40S-24Q", false);
    refused(&r, &["none free", "NVIDIA L40S-12Q (1153) at [36]"]);
    assert_eq!(k.writes().len(), before, "nothing written");
}

#[test]
fn mixed_sizes_are_refused_without_nvml_and_under_fixed_share_before_any_write() {
    let k = Arc::new(FakeKernel::l40s_vendor_vfio_host(4).unwrap());
    let a = start_with(Arc::clone(&k), |_| {});
    let before = k.writes().len();
    let r = create(&a.socket, "L40S-24Q", true);
    refused(&r, &["mixed-size vGPUs need NVML"]);
    assert_eq!(k.writes().len(), before);
    drop(a);

    let n = nvml(VgpuScheduler::FixedShare);
    let shared: Arc<dyn NvmlDevices> = n.clone();
    let a = start_with(Arc::clone(&k), |c| c.mig = Some(gpu_agent::MigNvml(shared)));
    let r = create(&a.socket, "L40S-24Q", true);
    refused(&r, &["fixed share", "best effort or equal share"]);
    assert_eq!(k.writes().len(), before);
    assert!(n.writes().is_empty());
}
