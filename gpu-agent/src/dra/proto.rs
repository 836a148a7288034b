//! The kubelet's gRPC messages and services, generated at build time from `proto/` (the
//! workspace's own definitions of the published wire protocol).

#![allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::panic
)]

/// `pluginregistration` (kubelet `pluginregistration/v1`): how a plugin announces itself.
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1`: prepare and unprepare.
pub mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1beta1`: the same for kubelets before 1.34.
pub mod dra_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// `v1alpha1` (kubelet `dra-health/v1alpha1`): the device health stream.
pub mod health_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}

/// `v1` (kubelet `dra-health/v1`): the same stream, graduated.
pub mod health_v1 {
    tonic::include_proto!("v1");
}
