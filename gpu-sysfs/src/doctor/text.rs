//! A diagnosis as people read it (what `gpuslice doctor` prints).

use gpu_core::text::render_table;

use super::{Diagnosis, Verdict};

impl Diagnosis {
    /// Each check in a row, then the fixes of those not ok, then the count of each verdict.
    #[must_use]
    pub fn table(&self) -> String {
        let rows: Vec<Vec<String>> = self
            .checks
            .iter()
            .map(|c| {
                vec![
                    c.verdict.as_str().to_uppercase(),
                    c.check.clone(),
                    c.subject.clone().unwrap_or_else(|| "-".to_owned()),
                    c.message.clone(),
                ]
            })
            .collect();
        let mut s = render_table(&["VERDICT", "CHECK", "SUBJECT", "FOUND"], &rows);
        let fixes: Vec<String> = self
            .checks
            .iter()
            .filter(|c| c.verdict != Verdict::Ok)
            .filter_map(|c| {
                c.fix.as_ref().map(|f| {
                    let about = c
                        .subject
                        .as_ref()
                        .map_or_else(|| c.check.clone(), |s| format!("{} {s}", c.check));
                    format!("  {about}: {f}\n")
                })
            })
            .collect();
        if !fixes.is_empty() {
            s.push_str(&format!("\nFixes\n{}", fixes.concat()));
        }
        let count = |v: Verdict| self.checks.iter().filter(|c| c.verdict == v).count();
        s.push_str(&format!(
            "\nNode {}: {} ok, {} warn, {} fail\n",
            self.node,
            count(Verdict::Ok),
            count(Verdict::Warn),
            count(Verdict::Fail)
        ));
        s
    }
}
