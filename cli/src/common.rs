//! Options and helpers every subcommand shares.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Output {
    /// A table for people.
    #[default]
    Table,
    /// JSON for programs.
    Json,
    /// YAML for programs and people.
    Yaml,
}

// Options of every subcommand.
#[derive(Args, Debug, Clone)]
pub struct Global {
    /// The host: a directory standing for its `/`, a `*.umockdev` recording to replay (writes are
    /// thrown away), or `sandbox:DIR`, a sandbox host made by `gpuslice sandbox init DIR` (a fake
    /// kernel reacts to writes; its state stays in DIR; this machine is never touched).
    #[arg(
        long,
        global = true,
        env = "GPUSLICE_ROOT",
        default_value = "/",
        value_name = "DIR"
    )]
    pub root: PathBuf,
    /// Node name (default: this host's hostname).
    #[arg(long, global = true, value_name = "NAME")]
    pub node: Option<String>,
    /// Output format. With json or yaml a refusal is a document too, `{"error": {"kind",
    /// "message", "errno"?, "errnoName"?}}`, written to stderr (stdout stays empty) with exit 2.
    #[arg(short = 'o', long = "output", global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// The largest document (fleet, Machine, claim, layout, policy, standard input) read, in MiB
    /// (default 64): a larger one is refused before it is read.
    #[arg(
        long,
        global = true,
        env = "GPUSLICE_MAX_DOCUMENT_MIB",
        value_name = "MIB",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub max_document_mib: Option<u64>,
    /// On a terminal, print a line every 2 s while discovering the host takes long (nothing in a
    /// pipe).
    #[arg(long, global = true)]
    pub progress: bool,
}

/// The document cap of this command, set once from `--max-document-mib` by `main`.
static DOCUMENT_LIMIT: std::sync::OnceLock<gpu_sysfs::DocumentLimit> = std::sync::OnceLock::new();

/// Sets the document cap every [`read_input`] of this command uses (the first call wins).
pub fn set_document_limit(g: &Global) {
    let _ = DOCUMENT_LIMIT.set(document_limit_of(g));
}

fn document_limit_of(g: &Global) -> gpu_sysfs::DocumentLimit {
    g.max_document_mib.map_or_else(
        gpu_sysfs::DocumentLimit::default,
        gpu_sysfs::DocumentLimit::from_mib,
    )
}

/// Guards this command's host reads with the one watchdog of the process: a read of the host
/// that does not answer within [`gpu_sysfs::confine::READ_DEADLINE`] ends the command (exit 2)
/// naming the file, instead of hanging it. Reads run inline; the agent keeps its own watchdog.
pub fn start_read_watchdog() {
    let deadline = gpu_sysfs::confine::READ_DEADLINE;
    let _ = gpu_sysfs::confine::start_read_watchdog(deadline, move |path, waited| {
        eprintln!(
            "gpuslice: {path}: no answer within {} s ({} ms waited); the command stops here",
            deadline.as_secs(),
            waited.as_millis()
        );
        std::process::exit(2);
    });
}

/// The document cap of this command.
pub fn document_limit() -> gpu_sysfs::DocumentLimit {
    DOCUMENT_LIMIT.get().copied().unwrap_or_default()
}

impl Global {
    /// `message` with the sysfs paths it names written where they are under `--root`
    /// ([`gpu_sysfs::sandbox::name_under_root`]).
    pub fn name_under_root(&self, message: &str) -> String {
        gpu_sysfs::sandbox::name_under_root(&self.root, message)
    }

    /// Says on stderr, once, that the root is a sandbox, so that no output made on one is taken
    /// for this machine's (stdout stays a clean document under `-o json|yaml`).
    pub fn announce_sandbox(&self) {
        if let Some(dir) = gpu_sysfs::sandbox::sandbox_dir(&self.root) {
            eprintln!(
                "gpuslice: sandbox host {} (simulated; nothing here touches this machine)",
                dir.display()
            );
        }
    }

    /// The node name: `--node`, else the hostname, else `localhost`.
    pub fn node_name(&self) -> String {
        self.node
            .clone()
            .unwrap_or_else(gpu_sysfs::default_node_name)
    }
}

/// Ends the command when the reader of its standard output has gone away (`| head`): quietly,
/// with exit 0. The one answer for `print!` (through the panic hook `app::main` installs) and
/// for documents streamed by [`print_data`].
pub(crate) fn reader_went_away() -> ! {
    std::process::exit(0)
}

impl Output {
    /// Prints `value` as JSON or YAML, or for [`Output::Table`] the text `table` makes; the
    /// command's success.
    pub fn show<T: serde::Serialize + ?Sized>(
        self,
        value: &T,
        table: impl FnOnce() -> String,
    ) -> anyhow::Result<std::process::ExitCode> {
        match self {
            Output::Table => print!("{}", table()),
            out => print_data(out, value)?,
        }
        Ok(std::process::ExitCode::SUCCESS)
    }
}

/// Prints a serializable value as JSON or YAML per `out` (tables are the caller's job).
pub fn print_data<T: serde::Serialize + ?Sized>(out: Output, value: &T) -> anyhow::Result<()> {
    match out {
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(value)?),
        _ => {
            use std::io::Write as _;
            // Streamed through a buffer of a few pages: a whole host's document (the A2's is
            // 116 KB) in one fresh buffer cost a page fault for every 4 KiB of it.
            let mut out = std::io::BufWriter::with_capacity(32 * 1024, std::io::stdout().lock());
            let written = serde_json::to_writer_pretty(&mut out, value)
                .map_err(std::io::Error::from)
                .and_then(|()| out.write_all(b"\n"))
                .and_then(|()| out.flush());
            match written {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => reader_went_away(),
                other => other?,
            }
        }
    }
    Ok(())
}

/// Opens the host at `--root`: a directory, or a `*.umockdev` recording.
pub fn open_host(g: &Global) -> anyhow::Result<gpu_sysfs::OpenedRoot> {
    Ok(front(g).open_host()?)
}

/// What the options open ([`gpu_node::front::Front`]): `--root`, the node name, `--progress`
/// and the document cap.
pub fn front(g: &Global) -> gpu_node::front::Front<'_> {
    let node = g
        .node
        .as_deref()
        .unwrap_or_else(|| HOSTNAME.get_or_init(gpu_sysfs::default_node_name));
    let (root, progress, limit) = (g.root.as_path(), g.progress, document_limit());
    gpu_node::front::Front {
        root,
        node,
        progress,
        limit,
    }
}

/// This host's name, read once.
static HOSTNAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Opens `--root` and composes it into a node, the one composition every command uses.
pub fn open_node(
    g: &Global,
    req: &gpu_health::NodeRequest,
) -> anyhow::Result<gpu_node::ComposedNode> {
    Ok(front(g).open_node(req)?)
}

/// Opens `--root` for a command that changes the host and discovers inside its operation; a
/// write the node's intent record says did not finish is warned about.
pub fn open_node_host(
    g: &Global,
    req: &gpu_health::NodeRequest,
) -> anyhow::Result<gpu_node::OpenedNode> {
    let (opened, warning) = front(g).open_node_host(req)?;
    // A write of an earlier command that did not finish is said before this one's.
    warn(warning);
    Ok(opened)
}

/// Says each of `warnings` on stderr, as `gpuslice: warning: W`.
pub fn warn<W: std::fmt::Display>(warnings: impl IntoIterator<Item = W>) {
    warnings
        .into_iter()
        .for_each(|w| eprintln!("gpuslice: warning: {w}"));
}

/// Says each of `warnings` on stderr, as `warning: W` (the form listings and reports use).
pub fn warn_bare<W: std::fmt::Display>(warnings: impl IntoIterator<Item = W>) {
    warnings.into_iter().for_each(|w| eprintln!("warning: {w}"));
}

/// Says on stderr that this command waits for another writer's host lock at `lock`.
pub fn say_waiting(lock: &Path) {
    eprintln!(
        "gpuslice: waiting for another gpuslice writer to finish (lock {})",
        lock.display()
    );
}

/// Reads a document named on the command line; `-` reads standard input
/// ([`gpu_sysfs::document::read_input`], with the command's cap).
pub fn read_input(path: &Path, what: &str) -> anyhow::Result<String> {
    let limit = document_limit();
    Ok(gpu_sysfs::document::read_input(path, what, limit)?)
}

/// This host's topology with health graded; NVML only for `--root /` (never with `no_nvml`).
pub fn local_topology(g: &Global, no_nvml: bool) -> anyhow::Result<gpu_core::NodeTopology> {
    let nvml = gpu_health::NvmlSource::from_flags(None, no_nvml);
    Ok(front(g).local_node(None, nvml)?.topology)
}

pub use gpu_sysfs::classify::ErrorReport;

/// A classifier of library errors: the error as a [`gpu_core::ClassifiedError`] when it is one
/// of the library's.
pub type Classifier =
    for<'a> fn(&'a (dyn std::error::Error + 'static)) -> Option<&'a dyn gpu_core::ClassifiedError>;

/// The agent's error types, classified only in the binary that runs the agent
/// ([`crate::serve_here`]): `gpuslice` itself does not link the agent.
static ALSO: std::sync::OnceLock<Classifier> = std::sync::OnceLock::new();

/// Classifies the error types `also` knows as well (a second call changes nothing).
pub fn classify_also(also: Classifier) {
    let _ = ALSO.set(also);
}

/// The library error types an `anyhow` chain may hold: the node writer's (which reaches health,
/// discovery and the model), the scheduler's, the integrations' and, where it runs, the agent's.
fn classified<'a>(
    cause: &'a (dyn std::error::Error + 'static),
) -> Option<&'a dyn gpu_core::ClassifiedError> {
    ALSO.get()
        .and_then(|also| also(cause))
        .or_else(|| gpu_node::as_classified(cause))
        .or_else(|| gpu_sched::as_classified(cause))
        .or_else(|| gpu_node::dra::as_classified(cause))
}

/// Classifies an error chain as every front-end does ([`ErrorReport::of_chain`]), with the
/// library error types this binary knows.
pub fn error_report(e: &anyhow::Error) -> ErrorReport {
    ErrorReport::of_chain(e.as_ref(), classified)
}
