//! `gpuslice metrics`: Prometheus metrics of this host or a fleet, printed or served at /metrics.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use gpu_core::{Allocation, Fleet, NodeTopology};

use crate::common::Global;

use gpu_integrations::metrics;

/// Arguments of `gpuslice metrics`.
#[derive(clap::Args, Debug)]
pub struct MetricsArgs {
    /// A fleet file (JSON or YAML `Fleet`) to report instead of this host; read again on every
    /// scrape.
    #[arg(long, value_name = "FLEET")]
    pub inventory: Option<PathBuf>,
    /// Serve the metrics at http://ADDR/metrics instead of printing them (`0.0.0.0:9835`).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// With --listen: exit after answering this many requests.
    #[arg(long, value_name = "N", requires = "listen")]
    pub max_requests: Option<u64>,
}

/// The nodes and allocations to report: a fleet file, or this host (discovered with health).
///
/// # Errors
/// When the fleet file cannot be read or parsed, or the host cannot be discovered.
pub fn load_nodes(
    g: &Global,
    inventory: Option<&Path>,
) -> anyhow::Result<(Vec<NodeTopology>, Vec<Allocation>)> {
    if let Some(path) = inventory {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read fleet file {}", path.display()))?;
        let fleet = Fleet::from_text(&text)
            .map_err(gpu_core::ConfigDocError)
            .with_context(|| format!("fleet file {}", path.display()))?;
        return Ok((fleet.nodes, fleet.allocations));
    }
    Ok((vec![local_topology(g)?], vec![]))
}

/// This host's topology with health graded, from `--root` (a directory or a `*.umockdev`
/// recording).
///
/// # Errors
/// When the root cannot be opened or discovered.
pub fn local_topology(g: &Global) -> anyhow::Result<NodeTopology> {
    let req = gpu_health::NodeRequest::new(g.node_name());
    Ok(crate::common::open_node(g, &req)?.topology)
}

/// Runs `gpuslice metrics`.
///
/// # Errors
/// When the inventory cannot be read or the address cannot be bound.
pub fn run(g: &Global, a: MetricsArgs) -> anyhow::Result<ExitCode> {
    if a.inventory.is_none() {
        // As `topology` does: a node name that cannot be valid is refused before any output.
        gpu_core::validate_name(&g.node_name()).context("--node")?;
    }
    let (g2, inventory) = (g.clone(), a.inventory.clone());
    let render = move || -> Result<String, String> {
        let (nodes, allocations) =
            load_nodes(&g2, inventory.as_deref()).map_err(|e| crate::common::render_error(&e))?;
        for n in &nodes {
            gpu_core::validate_name(&n.node).map_err(|e| format!("node: {e}"))?;
        }
        metrics::render(&nodes, &allocations).map_err(|e| e.to_string())
    };
    let Some(addr) = &a.listen else {
        let text = render().map_err(anyhow::Error::msg)?;
        print!("{text}");
        return Ok(ExitCode::SUCCESS);
    };
    // The agent's server: one task per connection, deadlines for slow clients (a stalled client
    // no longer holds the scrape of others).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the server's runtime")?;
    let max_requests = a.max_requests;
    rt.block_on(async move {
        let listener = gpu_agent::Listener::bind_tcp_read_routes(addr)
            .with_context(|| format!("cannot listen on {addr}"))?;
        let bound = listener.address();
        eprintln!(
            "gpuslice: serving metrics at http://{}/metrics",
            bound.trim_start_matches("tcp:")
        );
        let router = gpu_agent::http::metrics_router(
            std::sync::Arc::new(render),
            metrics::CONTENT_TYPE.to_owned(),
        );
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        gpu_agent::serve_router(
            router,
            vec![listener],
            async move {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            },
            gpu_agent::ServeOptions {
                keep_alive: false,
                max_requests,
            },
        )
        .await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::sync::OnceLock;

    use gpu_core::NodeTopology;
    use gpu_sysfs::testing::{MdevTypeSpec, PciSpec, TreeBuilder};
    use proptest::prelude::*;

    use gpu_integrations::metrics;

    /// One discovered GPU with one mdev type; each case renames node, GPU and type.
    fn base() -> &'static NodeTopology {
        static BASE: OnceLock<NodeTopology> = OnceLock::new();
        BASE.get_or_init(|| {
            let mut b = TreeBuilder::new();
            b.pci(
                "0000:41:00.0",
                PciSpec::new(0x10de, 0x1eb8, 0x030200).driver("nvidia"),
            )
            .mdev_parent(
                "0000:41:00.0",
                &[MdevTypeSpec::new("nvidia-222", "GRID T4-1B", 16, None)],
            );
            let t = b.finish().unwrap();
            let host = gpu_sysfs::RealHost::new(t.root()).unwrap();
            gpu_sysfs::discover::discover(&host, &gpu_sysfs::discover::DiscoverOptions::new("n"))
                .unwrap()
        })
    }

    fn renamed(node: &str, gpu: &str, profile: &str) -> String {
        let mut t = base().clone();
        t.node = node.to_owned();
        t.gpus[0].name = gpu.to_owned();
        t.mediated_devices.parents[0].profiles[0].name = profile.to_owned();
        metrics::render(&[t], &[]).unwrap()
    }

    /// `name{label="value",...} number`, values escaped as the exposition format wants.
    fn well_formed_sample(line: &str) -> bool {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let (name, mut rest) = line.split_at(name_end);
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return false;
        }
        if let Some(labels) = rest.strip_prefix('{') {
            let mut chars = labels.char_indices();
            loop {
                // label name
                let mut saw = false;
                let mut next = None;
                for (i, c) in chars.by_ref() {
                    if c == '=' {
                        next = Some(i);
                        break;
                    }
                    if !(c.is_ascii_alphanumeric() || c == '_') {
                        return false;
                    }
                    saw = true;
                }
                if !saw || next.is_none() || chars.next().map(|(_, c)| c) != Some('"') {
                    return false;
                }
                loop {
                    match chars.next() {
                        Some((_, '\\')) => {
                            if !matches!(chars.next(), Some((_, '\\' | '"' | 'n'))) {
                                return false;
                            }
                        }
                        Some((_, '"')) => break,
                        Some(_) => {}
                        None => return false,
                    }
                }
                match chars.next() {
                    Some((_, ',')) => continue,
                    Some((i, '}')) => {
                        rest = &labels[i + 1..];
                        break;
                    }
                    _ => return false,
                }
            }
        }
        rest.strip_prefix(' ')
            .is_some_and(|v| v.parse::<f64>().is_ok())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(
            std::env::var("GPUSLICE_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
        ))]

        /// Whatever the names, the exposition has the same lines as with plain names, and every
        /// sample line is well formed: no name can end a label or inject a line.
        #[test]
        fn no_name_injects_a_line_into_the_exposition(
            node in any::<String>(),
            gpu in any::<String>(),
            profile in prop_oneof![any::<String>(), Just("A\"} 1\nevil 1\n#".to_owned())],
        ) {
            let plain = renamed("n", "gpu0", "GRID T4-1B");
            let text = renamed(&node, &gpu, &profile);
            prop_assert_eq!(text.lines().count(), plain.lines().count(), "{}", text);
            for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
                prop_assert!(well_formed_sample(line), "{:?}", line);
            }
        }
    }
}
