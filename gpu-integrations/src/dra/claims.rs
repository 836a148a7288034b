//! Example ResourceClaims for the devices gpuslice publishes.

use std::collections::BTreeMap;

use serde_json::json;

use super::model::*;
use super::version::NUMA_NODE;

fn claim(name: &str, devices: DeviceClaim) -> ResourceClaim {
    ResourceClaim {
        api_version: API_VERSION.into(),
        kind: "ResourceClaim".into(),
        metadata: ObjectMeta {
            name: name.into(),
            labels: BTreeMap::new(),
        },
        spec: ResourceClaimSpec { devices },
    }
}

/// The CEL selector of devices offering `profile` (`A2-4Q`).
pub fn profile_selector(driver: &str, profile: &str) -> DeviceSelector {
    let attr = super::names::profile_attribute(profile).unwrap_or_default();
    DeviceSelector::cel(format!("has(device.attributes[{driver:?}].{attr})"))
}

/// The opaque configuration that tells `gpuslice dra prepare` which profile to create.
pub fn profile_config(driver: &str, requests: &[&str], profile: &str) -> DeviceClaimConfiguration {
    DeviceClaimConfiguration {
        requests: requests.iter().map(|r| (*r).to_owned()).collect(),
        opaque: OpaqueDeviceConfiguration {
            driver: driver.into(),
            parameters: json!({
                "apiVersion": format!("{driver}/v1"),
                "kind": "VgpuConfig",
                "profile": profile,
            }),
        },
    }
}

/// Three examples: one A2-4Q vGPU; two whole GPUs on one NUMA node; an A2-8Q vGPU or else a
/// whole GPU.
pub fn examples(driver: &str) -> Vec<ResourceClaim> {
    vec![
        claim(
            "one-a2-4q",
            DeviceClaim {
                requests: vec![DeviceRequest {
                    name: "vgpu".into(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: "vgpu".into(),
                        selectors: vec![profile_selector(driver, "A2-4Q")],
                        allocation_mode: None,
                        count: None,
                    }),
                    first_available: vec![],
                }],
                constraints: vec![],
                config: vec![profile_config(driver, &["vgpu"], "A2-4Q")],
            },
        ),
        claim(
            "two-gpus-one-numa-node",
            DeviceClaim {
                requests: vec![DeviceRequest {
                    name: "gpus".into(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: "gpu".into(),
                        selectors: vec![],
                        allocation_mode: Some("ExactCount".into()),
                        count: Some(2),
                    }),
                    first_available: vec![],
                }],
                constraints: vec![DeviceConstraint {
                    requests: vec!["gpus".into()],
                    match_attribute: NUMA_NODE.into(),
                }],
                config: vec![],
            },
        ),
        claim(
            "a2-8q-else-whole-gpu",
            DeviceClaim {
                requests: vec![DeviceRequest {
                    name: "gpu".into(),
                    exactly: None,
                    first_available: vec![
                        DeviceSubRequest {
                            name: "a2-8q".into(),
                            device_class_name: "vgpu".into(),
                            selectors: vec![profile_selector(driver, "A2-8Q")],
                            count: None,
                        },
                        DeviceSubRequest {
                            name: "whole".into(),
                            device_class_name: "gpu".into(),
                            selectors: vec![],
                            count: None,
                        },
                    ],
                }],
                constraints: vec![],
                config: vec![profile_config(driver, &["gpu/a2-8q"], "A2-8Q")],
            },
        ),
    ]
}
