//! The `gpuslice` command: GPU and vGPU inventory, placement, health and host setup.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;
mod common;
mod progress;

use common::Global;

/// GPU sharing for VM orchestrators: whole-GPU passthrough, vGPUs (mdev and NVIDIA vendor-specific
/// VFIO), MIG-backed profiles, health, and fleet placement.
#[derive(Parser, Debug)]
#[command(name = "gpuslice", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
enum Command {
    /// Whole GPUs: list, bind to vfio-pci, release to the host driver.
    #[command(subcommand)]
    Gpu(GpuCommand),
    /// This host's NodeTopology: GPUs, vGPU parents, profiles, instances and pools.
    Topology(cmd::topology::TopologyArgs),
    /// GPU health graded from PCIe AER, link state and NVML.
    Health(cmd::health::HealthArgs),
    /// vGPU instances and declarative layouts.
    #[command(subcommand)]
    Vgpu(VgpuCommand),
    /// SR-IOV virtual functions.
    #[command(subcommand)]
    Sriov(cmd::sriov::SriovCommand),
    /// Place a Machine's device requests on a fleet.
    Place(cmd::place::PlaceArgs),
    /// Plan migrations, node drains and health-driven evacuations.
    #[command(subcommand)]
    Plan(cmd::place::PlanCommand),
    /// Prometheus metrics for this host or a fleet.
    Metrics(cmd::metrics::MetricsArgs),
    /// Hand devices to QEMU, libvirt, KubeVirt, cloud-init or Kubernetes DRA.
    #[command(subcommand)]
    Export(cmd::export::ExportCommand),
    /// Node side of Kubernetes DRA: create or remove what an allocation result names.
    #[command(subcommand)]
    Dra(cmd::dra::DraCommand),
    /// The node agent: serve this host's GPUs over a versioned HTTP API (unix socket or TCP) and
    /// keep the vGPUs it creates across restarts.
    Agent(cmd::agent::AgentArgs),
    /// Check that the node is ready for GPU VMs: IOMMU, vfio-pci, the vGPU manager, SR-IOV, MIG,
    /// IOMMU groups, KubeVirt (ok / warn / fail, each with a fix; exit 1 when a check fails).
    Doctor(cmd::doctor::DoctorArgs),
    /// A sandbox host to try every command on without touching this machine: `sandbox init DIR`,
    /// then `--root sandbox:DIR`.
    #[command(subcommand)]
    Sandbox(cmd::sandbox::SandboxCommand),
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
enum GpuCommand {
    /// List GPUs (this host, or a fleet with --inventory).
    List(cmd::gpu::GpuListArgs),
    /// Bind a whole GPU and its companion functions to vfio-pci.
    Bind(cmd::gpu::BindArgs),
    /// Return a GPU from vfio-pci to its host driver.
    Release(cmd::gpu::ReleaseArgs),
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
enum VgpuCommand {
    /// Create a vGPU instance.
    Create(cmd::vgpu::CreateArgs),
    /// Remove a vGPU instance (mdev UUID or vendor-VFIO VF address).
    Remove(cmd::vgpu::RemoveArgs),
    /// List vGPU instances on this host.
    List(cmd::vgpu::ListArgs),
    /// Make the host match a vGPU layout file.
    Apply(cmd::layout::ApplyArgs),
    /// Check that the host matches a vGPU layout file (exit 1 with a diff when not).
    Assert(cmd::layout::AssertArgs),
    /// Remove the vGPU instances of the GPUs a layout file selects.
    Clear(cmd::layout::ClearArgs),
}

/// Ends the command quietly when stdout is closed under it (`gpuslice topology | head -1`): the
/// standard library's `print!` panics on `EPIPE`, which would print a panic and a backtrace.
fn exit_quietly_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info.to_string();
        if text.contains("failed printing to stdout") && text.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    exit_quietly_on_closed_stdout();
    let cli = Cli::parse();
    common::set_document_limit(&cli.global);
    if !matches!(cli.command, Command::Agent(_)) {
        common::start_read_watchdog();
        // One discovery and out: the idle second core reads beside the first.
        gpu_sysfs::set_parallel_reads(true);
    }
    let g = &cli.global;
    g.announce_sandbox();
    let result = match cli.command {
        Command::Gpu(GpuCommand::List(a)) => cmd::gpu::gpu_list(g, a),
        Command::Gpu(GpuCommand::Bind(a)) => cmd::gpu::bind(g, a),
        Command::Gpu(GpuCommand::Release(a)) => cmd::gpu::release(g, a),
        Command::Topology(a) => cmd::topology::topology(g, a),
        Command::Health(a) => cmd::health::run(g, a),
        Command::Vgpu(VgpuCommand::Create(a)) => cmd::vgpu::create(g, a),
        Command::Vgpu(VgpuCommand::Remove(a)) => cmd::vgpu::remove(g, a),
        Command::Vgpu(VgpuCommand::List(a)) => cmd::vgpu::list(g, a),
        Command::Vgpu(VgpuCommand::Apply(a)) => cmd::layout::apply(g, a),
        Command::Vgpu(VgpuCommand::Assert(a)) => cmd::layout::assert(g, a),
        Command::Vgpu(VgpuCommand::Clear(a)) => cmd::layout::clear(g, a),
        Command::Sriov(c) => cmd::sriov::sriov(g, c),
        Command::Place(a) => cmd::place::place(g, a),
        Command::Plan(c) => cmd::place::plan(g, c),
        Command::Metrics(a) => cmd::metrics::run(g, a),
        Command::Export(c) => cmd::export::run(g, c),
        Command::Dra(c) => cmd::dra::run(g, c),
        Command::Agent(a) => cmd::agent::run(g, a),
        Command::Doctor(a) => cmd::doctor::run(g, a),
        Command::Sandbox(c) => cmd::sandbox::run(g, c),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let mut report = common::ErrorReport::from_error(&e);
            report.message = g.name_under_root(&report.message);
            match g.output {
                common::Output::Json => {
                    let doc = serde_json::json!({ "error": report });
                    eprintln!("{doc}");
                }
                common::Output::Yaml => {
                    let doc = serde_json::json!({ "error": report });
                    eprint!("{}", serde_yaml_ng::to_string(&doc).unwrap_or_default());
                }
                common::Output::Table => eprintln!("gpuslice: {}", report.message),
            }
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn abouts(c: &clap::Command, at: &str, out: &mut Vec<(String, String)>) {
        // Building adds the `help` subcommands; they are clap's own.
        for sub in c.get_subcommands().filter(|s| s.get_name() != "help") {
            let path = format!("{at} {}", sub.get_name());
            let about = sub.get_about().map(ToString::to_string).unwrap_or_default();
            out.push((path.clone(), about));
            abouts(sub, &path, out);
        }
    }

    /// Subcommands are built only when named (`defer`), so an `Args` struct's doc comment would
    /// replace the subcommand's own description once built (in its `--help`): every subcommand
    /// keeps the one its variant gives, built or not.
    #[test]
    fn every_subcommand_keeps_its_variants_description_when_built() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let mut before = Vec::new();
        abouts(&Cli::command(), "gpuslice", &mut before);
        let mut built = Cli::command();
        built.build();
        let mut after = Vec::new();
        abouts(&built, "gpuslice", &mut after);
        assert!(before.len() > 30, "only {} subcommands", before.len());
        for (path, about) in &before {
            assert!(!about.is_empty(), "{path}: no description");
        }
        assert_eq!(before, after);
    }
}
