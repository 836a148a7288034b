//! What a one-shot publish (`gpuslice dra publish`) did, as people and programs read it.

use gpu_core::text::render_table;

use super::{NodeReport, PlanStep, ServerInfo};

/// The outcome of publishing every node once: the server, and each node's report.
#[derive(Debug)]
pub struct PublishSummary<'a> {
    /// The API server that was asked.
    pub server: &'a ServerInfo,
    /// Each node's outcome.
    pub reports: &'a [NodeReport],
    /// Whether nothing was written (the plan only).
    pub dry_run: bool,
}

impl PublishSummary<'_> {
    /// How many nodes were not published.
    pub fn failed(&self) -> usize {
        self.reports.iter().filter(|r| r.result.is_err()).count()
    }

    /// What is said beside the table or document: the server and its encoding, then each
    /// node's warnings (`NODE: WARNING`).
    pub fn notes(&self) -> Vec<String> {
        let server = &self.server;
        let mut notes = vec![format!(
            "API server {}; {}",
            server.git_version,
            server.encoding().describe(server.version)
        )];
        for r in self.reports {
            notes.extend(r.warnings.iter().map(|w| format!("{}: {w}", r.node)));
        }
        notes
    }

    /// The table: each node, its pool generation and what was written (or planned).
    pub fn table(&self) -> String {
        let rows: Vec<Vec<String>> = self.reports.iter().map(row).collect();
        let head = if self.dry_run { "PLAN" } else { "WRITTEN" };
        render_table(&["NODE", "GENERATION", head], &rows)
    }

    /// The document: `{"server", "encoding", "dryRun", "nodes": [{"node", "generation",
    /// "steps": [{"op", "name"}]} or {"node", "error"}]}`.
    pub fn document(&self) -> serde_json::Value {
        let nodes: Vec<serde_json::Value> = self.reports.iter().map(node_document).collect();
        serde_json::json!({
            "server": self.server.git_version,
            "encoding": self.server.encoding().as_str(),
            "dryRun": self.dry_run,
            "nodes": nodes,
        })
    }
}

fn row(r: &NodeReport) -> Vec<String> {
    match &r.result {
        Ok((_, steps)) if steps.is_empty() => {
            vec![r.node.clone(), generation(r), "unchanged".to_owned()]
        }
        Ok((_, steps)) => {
            let plan: Vec<String> = steps.iter().map(ToString::to_string).collect();
            vec![r.node.clone(), generation(r), plan.join(", ")]
        }
        Err(e) => vec![r.node.clone(), "-".to_owned(), format!("failed: {e}")],
    }
}

fn generation(r: &NodeReport) -> String {
    r.result
        .as_ref()
        .map_or_else(|_| "-".to_owned(), |(g, _)| g.to_string())
}

fn node_document(r: &NodeReport) -> serde_json::Value {
    let Ok((generation, steps)) = &r.result else {
        let error = r.result.as_ref().err().map(ToString::to_string);
        return serde_json::json!({"node": r.node, "error": error});
    };
    let steps: Vec<serde_json::Value> = steps
        .iter()
        .map(|s| {
            let (op, name) = match s {
                PlanStep::Create { name } => ("create", name),
                PlanStep::Update { name, .. } => ("update", name),
                PlanStep::Delete { name } => ("delete", name),
            };
            serde_json::json!({"op": op, "name": name})
        })
        .collect();
    serde_json::json!({"node": r.node, "generation": generation, "steps": steps})
}
