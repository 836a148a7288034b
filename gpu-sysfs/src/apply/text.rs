//! Layouts as people read them: the plan, the report of an apply or clear, the assertion, and
//! the progress lines of a running apply. The CLI prints these; any front-end may.

use std::fmt::Write as _;
use std::io::Write;

use gpu_core::layout::{Assertion, Mode, Plan, Step};
use gpu_core::nvidia::strip_prefix;

use super::{ApplyEvent, ApplyReport, ApplyStatus, describe};

/// The plan: each GPU's entry with its types (`=` in place, `~` to change) and why a GPU is left
/// unchanged, then the numbered steps.
pub fn plan(plan: &Plan) -> String {
    let mut out = String::new();
    for gp in &plan.gpus {
        let index = gp.index.map(|i| format!(" index {i}")).unwrap_or_default();
        let _ = writeln!(out, "{}{index} [{}]", gp.label(), gp.entry);
        if gp.enable_sriov {
            let _ = writeln!(out, "  SR-IOV is off: enable it, then plan the types");
        }
        for t in &gp.types {
            let mark = if t.have == t.want { "=" } else { "~" };
            let name = strip_prefix(&t.name);
            let _ = writeln!(
                out,
                "  {mark} {name:<16} have {:>2}  want {:>2}",
                t.have, t.want
            );
        }
        if let Some(why) = &gp.refused {
            let _ = writeln!(out, "  left unchanged: {why}");
        }
    }
    if plan.steps.is_empty() {
        return out;
    }
    let _ = writeln!(out, "steps:");
    for (i, s) in plan.steps.iter().enumerate() {
        let marker = match s {
            Step::Remove { .. } => "-",
            Step::Create { .. } => "+",
            Step::EnableSriov { .. } => "*",
        };
        let _ = writeln!(out, "  {:>3}. {marker} {}", i + 1, describe(s));
    }
    out
}

/// The report of an apply or clear (its plan's warnings are the caller's to show apart).
pub fn report(r: &ApplyReport) -> String {
    let mut out = String::new();
    let verb = match r.plan.mode {
        Mode::Apply => "apply",
        Mode::Clear => "clear",
    };
    let (config, node) = (&r.plan.config, &r.plan.node);
    match r.status {
        ApplyStatus::DryRun => {
            out.push_str(&plan(&r.plan));
            let steps = r.plan.steps.len();
            let _ = writeln!(
                out,
                "dry run: {steps} steps to {verb} config {config:?} on node {node}; nothing written"
            );
        }
        ApplyStatus::Unchanged => {
            let gpus = r.plan.gpus.len();
            let _ = writeln!(
                out,
                "config {config:?} is already in place on {gpus} GPU(s); nothing written"
            );
        }
        ApplyStatus::Applied | ApplyStatus::Incomplete => {
            for c in &r.changes {
                let t = c.type_id.as_ref().map(|t| format!(" {t}"));
                let t = t.unwrap_or_default();
                let _ = writeln!(out, "{:<12} {}{t} ({})", c.op, c.device, c.gpu);
            }
            let removed = r.changes.iter().filter(|c| c.op == "remove").count();
            let created = r.changes.iter().filter(|c| c.op == "create").count();
            let _ = writeln!(
                out,
                "{verb} config {config:?}: {removed} removed, {created} created"
            );
            for gp in r.plan.refused() {
                if let Some(why) = &gp.refused {
                    let _ = writeln!(out, "{} left unchanged: {why}", gp.label());
                }
            }
        }
        ApplyStatus::RolledBack | ApplyStatus::RollbackIncomplete => {
            if let Some(f) = &r.failure {
                let _ = writeln!(out, "failed: {f}");
            }
            if let Some(rb) = &r.rollback {
                for u in &rb.undone {
                    let _ = writeln!(out, "  undone: {u}");
                }
                for l in &rb.leftover {
                    let _ = writeln!(out, "  NOT UNDONE: {l}");
                }
            }
        }
    }
    out
}

/// Whether a layout is applied, with the diff when it is not.
pub fn assertion(a: &Assertion) -> String {
    let (config, node) = (&a.config, &a.node);
    if a.applied {
        let gpus = a.gpus.len();
        return format!("config {config:?} is applied on {gpus} GPU(s) of node {node}\n");
    }
    let mut out = format!("config {config:?} is not applied on node {node}:\n");
    for d in &a.diff {
        let _ = writeln!(out, "  {d}");
    }
    out
}

/// The progress of an apply on a stream: a bar redrawn in place on a terminal, plain lines
/// otherwise (journald, CI logs), or only the waits and the rollback when not verbose.
#[derive(Debug)]
pub struct Progress {
    tty: bool,
    verbose: bool,
    drawn: bool,
}

impl Progress {
    /// Progress for a stream that is a terminal (`tty`) or not; `verbose` prints each step
    /// where there is no terminal.
    pub fn new(tty: bool, verbose: bool) -> Self {
        Progress {
            tty,
            verbose,
            drawn: false,
        }
    }

    /// Writes what `e` says to `err` (write errors are ignored: progress is advice).
    pub fn event(&mut self, e: &ApplyEvent<'_>, err: &mut dyn Write) {
        match e {
            ApplyEvent::WaitingForLock { path } => {
                let _ = writeln!(
                    err,
                    "waiting for another gpuslice apply to finish (lock {})",
                    path.display()
                );
            }
            ApplyEvent::Planned { .. } => {}
            ApplyEvent::Step { index, total, step } => {
                let what = describe(step);
                if self.tty {
                    const WIDTH: usize = 24;
                    let filled = (index + 1) * WIDTH / (*total).max(1);
                    let bar: String = "#".repeat(filled) + &"-".repeat(WIDTH - filled);
                    let mut line = format!("[{bar}] {}/{total} {what}", index + 1);
                    // At most 120 bytes, cut where a character starts.
                    let cut = (0..=120.min(line.len()))
                        .rev()
                        .find(|&i| line.is_char_boundary(i));
                    line.truncate(cut.unwrap_or(0));
                    let _ = write!(err, "\r\x1b[2K{line}");
                    self.drawn = true;
                } else if self.verbose {
                    let _ = writeln!(err, "[{}/{total}] {what}", index + 1);
                }
            }
            ApplyEvent::RollingBack { changes } => {
                if self.drawn {
                    let _ = writeln!(err);
                    self.drawn = false;
                }
                let _ = writeln!(err, "a step failed; undoing {changes} changes");
            }
        }
        let _ = err.flush();
    }

    /// Ends a bar left on its line.
    pub fn finish(&mut self, err: &mut dyn Write) {
        if self.drawn {
            let _ = writeln!(err);
            self.drawn = false;
        }
    }
}
