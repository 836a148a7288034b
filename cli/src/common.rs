//! Options and helpers every subcommand shares.

use std::path::PathBuf;

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

/// Options of every subcommand.
#[derive(Args, Debug, Clone)]
pub struct Global {
    /// Directory standing for the host's `/` (or a `*.umockdev` recording to replay).
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
    /// Output format.
    #[arg(short = 'o', long = "output", global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

impl Global {
    /// The node name: `--node`, else the hostname, else `localhost`.
    pub fn node_name(&self) -> String {
        if let Some(n) = &self.node {
            return n.clone();
        }
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "localhost".to_owned())
    }
}

/// Renders an error chain on one line: `outer: inner: innermost`.
pub fn render_error(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
    }
    parts.join(": ")
}

/// Prints a serializable value as JSON or YAML per `out` (tables are the caller's job).
pub fn print_data<T: serde::Serialize>(out: Output, value: &T) -> anyhow::Result<()> {
    match out {
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(value)?),
        _ => println!("{}", serde_json::to_string_pretty(value)?),
    }
    Ok(())
}
