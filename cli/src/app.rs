//! The command line of both binaries: its parser, and the dispatch of every subcommand.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::cmd;
use crate::common::{self, Global};

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
    /// MIG GPU instances: list, apply or assert an NVIDIA mig-parted config, clear.
    #[command(subcommand)]
    Mig(cmd::mig::MigCommand),
    /// Place a Machine's device requests on a fleet.
    Place(cmd::place::PlaceArgs),
    /// Release a placed Machine's allocation from a fleet file: the inverse of `place --save`.
    Unplace(cmd::place::UnplaceArgs),
    /// Make a placed Machine's devices on this node in one call (its allocation from a fleet
    /// file), checked before the first write and undone on failure; print the hand-off.
    Realize(cmd::realize::RealizeArgs),
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
    /// NVSwitch fabric partitions (HGX): `fabric list`, `fabric activate ID`, `fabric deactivate ID`,
    /// `fabric vgpus GPU... --profile P` (FM vGPU mode).
    #[command(subcommand)]
    Fabric(cmd::fabric::FabricCommand),
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
enum GpuCommand {
    /// List GPUs (this host, or a fleet with --inventory).
    List(cmd::gpu::GpuListArgs),
    /// Bind whole GPUs and their companion functions to vfio-pci (on an NVSwitch host, one
    /// fabric partition's GPUs, with the partition activated).
    Bind(cmd::gpu::BindArgs),
    /// Return GPUs from vfio-pci to their host driver (a partition's set deactivates it).
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
    /// Remove the vGPU instances of some GPUs (--gpu), of the whole host (--all), or of the
    /// GPUs a layout file selects (-f).
    Clear(cmd::vgpu::ClearArgs),
    /// Each parent's or VF's vGPU types with their free instances, as `mdevctl types` prints
    /// them.
    Types(cmd::vgpu::TypesArgs),
}

/// Ends the command quietly when stdout is closed under it (`gpuslice topology | head -1`): the
/// standard library's `print!` panics on `EPIPE`, which would print a panic and a backtrace.
fn exit_quietly_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info.to_string();
        if text.contains("failed printing to stdout") && text.contains("Broken pipe") {
            common::reader_went_away();
        }
        default(info);
    }));
}

/// What only `gpuslice-agent` runs: the long-running servers, with the agent's HTTP, gRPC,
/// TLS and Kubernetes stacks (`gpuslice agent`, `gpuslice metrics --listen`, `gpuslice dra
/// publish`). The `gpuslice` binary leaves those stacks out (a one-shot command starts in about
/// two thirds of the time) and hands these commands to `gpuslice-agent`.
#[derive(Debug)]
pub struct Served {
    global: Global,
    what: ServedCommand,
}

#[derive(Debug)]
enum ServedCommand {
    Agent(Box<cmd::agent::AgentArgs>),
    Metrics(cmd::metrics::MetricsArgs),
    DraPublish(cmd::dra::PublishArgs),
}

impl Served {
    /// The command as a user writes it, for messages.
    fn name(&self) -> &'static str {
        match self.what {
            ServedCommand::Agent(_) => "gpuslice agent",
            ServedCommand::Metrics(_) => "gpuslice metrics --listen",
            ServedCommand::DraPublish(_) => "gpuslice dra publish",
        }
    }
}

/// The name of the binary that runs [`Served`] commands, installed next to `gpuslice`.
pub const AGENT_BINARY: &str = "gpuslice-agent";

/// Runs a [`Served`] command in this process (the `gpuslice-agent` binary).
pub fn serve_here(s: Served) -> anyhow::Result<ExitCode> {
    common::classify_also(gpu_agent::error::as_classified);
    let g = &s.global;
    start(g, matches!(s.what, ServedCommand::Agent(_)));
    match s.what {
        ServedCommand::Agent(a) => cmd::agent::run(g, *a),
        ServedCommand::Metrics(a) => cmd::metrics::serve(g, a),
        ServedCommand::DraPublish(a) => cmd::dra::publish(g, &a),
    }
}

/// Hands a [`Served`] command to the `gpuslice-agent` binary next to this one: the process
/// becomes it (`exec`, the same process id, arguments, environment and standard streams), so a
/// service manager or a `kill` sees no difference. Returns only when it cannot.
pub fn serve_in_agent_binary(s: Served) -> anyhow::Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    let me = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("{}: cannot find this binary's path: {e}", s.name()))?;
    let agent = me.with_file_name(AGENT_BINARY);
    let err = std::process::Command::new(&agent)
        .arg0("gpuslice")
        .args(std::env::args_os().skip(1))
        .exec();
    anyhow::bail!(
        "{} runs in the {AGENT_BINARY} binary, which is installed next to gpuslice \
         ({}): {err}; install both (`cargo install --path cli` installs gpuslice and \
         {AGENT_BINARY})",
        s.name(),
        agent.display()
    )
}

/// The whole command: parses the command line and runs the subcommand named, handing the
/// [`Served`] ones to `serve` ([`serve_here`] or [`serve_in_agent_binary`]). Exit status 0 on
/// success; on failure the error on stderr (`-o json`: `{"error": {...}}`) and the status the
/// command gives (2 for an error).
pub fn main(serve: fn(Served) -> anyhow::Result<ExitCode>) -> ExitCode {
    exit_quietly_on_closed_stdout();
    let cli = Cli::try_parse().unwrap_or_else(|e| refuse_arguments(&e));
    common::set_document_limit(&cli.global);
    let g = &cli.global;
    if !is_served(&cli.command) {
        start(g, false);
    }
    let result = run(g, cli.command, serve);
    match result {
        Ok(code) => code,
        Err(e) => {
            let mut report = common::error_report(&e);
            report.message = g.name_under_root(&report.message);
            let doc = serde_json::json!({ "error": report });
            match g.output {
                common::Output::Json => eprintln!("{doc}"),
                common::Output::Yaml => {
                    eprint!("{}", serde_yaml_ng::to_string(&doc).unwrap_or_default());
                }
                common::Output::Table => eprintln!("gpuslice: {}", report.message),
            }
            ExitCode::from(2)
        }
    }
}

/// Ends the command on a command line that does not parse: clap's own message and status,
/// except for `--json` (other tools' spelling), which is answered with gpuslice's (exit 2).
fn refuse_arguments(e: &clap::Error) -> ! {
    let json = std::env::args_os().skip(1).any(|a| a == "--json");
    if e.kind() == clap::error::ErrorKind::UnknownArgument && json {
        eprintln!(
            "gpuslice: there is no --json option: pass -o json (or --output json) for JSON \
             output (-o yaml for YAML)"
        );
        std::process::exit(2);
    }
    e.exit()
}

/// What a command sets up before it runs, in either binary: the one watchdog of host reads and
/// the second reading thread (not for the agent, which bounds its own reads and shares the host's
/// cores with its VMs), and the sandbox notice.
fn start(g: &Global, agent: bool) {
    if !agent {
        common::start_read_watchdog();
        // One discovery and out: the idle second core reads beside the first.
        gpu_sysfs::set_parallel_reads(true);
    }
    g.announce_sandbox();
}

/// Whether `command` is one of the [`Served`] ones.
fn is_served(command: &Command) -> bool {
    match command {
        Command::Agent(_) | Command::Dra(cmd::dra::DraCommand::Publish(_)) => true,
        Command::Metrics(a) => a.listen.is_some(),
        _ => false,
    }
}

fn run(
    g: &Global,
    command: Command,
    serve: fn(Served) -> anyhow::Result<ExitCode>,
) -> anyhow::Result<ExitCode> {
    let served = |what| {
        serve(Served {
            global: g.clone(),
            what,
        })
    };
    match command {
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
        Command::Vgpu(VgpuCommand::Clear(a)) => cmd::vgpu::clear(g, a),
        Command::Vgpu(VgpuCommand::Types(a)) => cmd::vgpu::types(g, a),
        Command::Sriov(c) => cmd::sriov::sriov(g, c),
        Command::Mig(c) => cmd::mig::run(g, c),
        Command::Place(a) => cmd::place::place(g, a),
        Command::Unplace(a) => cmd::place::unplace(g, a),
        Command::Plan(c) => cmd::place::plan(g, c),
        Command::Realize(a) => cmd::realize::run(g, &a),
        Command::Metrics(a) if a.listen.is_some() => served(ServedCommand::Metrics(a)),
        Command::Metrics(a) => cmd::metrics::run(g, &a),
        Command::Export(c) => cmd::export::run(g, c),
        Command::Dra(cmd::dra::DraCommand::Prepare(a)) => cmd::dra::prepare(g, &a),
        Command::Dra(cmd::dra::DraCommand::Unprepare(a)) => cmd::dra::unprepare(g, &a),
        Command::Dra(cmd::dra::DraCommand::Check(a)) => cmd::dra::check(&a),
        Command::Dra(cmd::dra::DraCommand::Publish(a)) => served(ServedCommand::DraPublish(a)),
        Command::Agent(a) => served(ServedCommand::Agent(Box::new(a))),
        Command::Doctor(a) => cmd::doctor::run(g, a),
        Command::Sandbox(c) => cmd::sandbox::run(g, c),
        Command::Fabric(c) => cmd::fabric::run(g, c),
    }
}

/// The command line of both binaries, as clap builds it (its tests read it).
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}
