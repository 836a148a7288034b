//! `gpuslice doctor`: is this node ready to give GPUs to VMs?

use std::process::ExitCode;

use clap::Args;
use gpu_integrations::doctor::{GuestOptions, KubevirtVersion};

use crate::common::{Global, Output};

// `gpuslice doctor` arguments.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// The KubeVirt release that runs this node's VMs (the `KubeVirt` CR's
    /// `status.observedKubeVirtVersion`): checked against what the node's vGPUs need.
    #[arg(long, value_name = "VERSION")]
    pub kubevirt_version: Option<KubevirtVersion>,
    /// A rendered cloud-config (user data) for a guest: checks that its gridd.conf comes with
    /// a license token when it asks for a license.
    #[arg(long, value_name = "FILE")]
    pub cloud_init: Option<std::path::PathBuf>,
}

/// Runs `gpuslice doctor`: exit 0 when no check fails (warnings included), 1 when one fails.
pub fn run(g: &Global, a: DoctorArgs) -> anyhow::Result<ExitCode> {
    let opened = crate::common::open_host(g)?;
    let opts = GuestOptions {
        kubevirt: a
            .kubevirt_version
            .map(|v| (v, "--kubevirt-version".to_owned())),
        cloud_config: match &a.cloud_init {
            Some(p) => Some((
                crate::common::read_input(p, "cloud-config")?,
                p.display().to_string(),
            )),
            None => None,
        },
    };
    let d = gpu_node::recover::diagnose(opened.host(), &g.node_name(), &opts)?;
    match g.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&d)?),
        Output::Yaml => print!("{}", gpu_integrations::yaml::to_string(&d)?),
        Output::Table => print!("{}", d.table()),
    }
    Ok(ExitCode::from(u8::from(d.failed())))
}
