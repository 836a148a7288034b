//! What `gpuslice sandbox init` says about the sandbox it made.

use super::{InitReport, PREFIX};

impl InitReport {
    /// The `--root` that names this sandbox (`sandbox:DIR`).
    #[must_use]
    pub fn root(&self) -> String {
        format!("{PREFIX}{}", self.dir.display())
    }

    /// What was made, and how to use it.
    #[must_use]
    pub fn summary(&self) -> String {
        let root = self.root();
        format!(
            "Sandbox host made in {} from {} ({} pool(s) the fake kernel counts).\n\
             Try any command on it; nothing touches this machine:\n  \
             gpuslice --root {root} gpu list\n  export GPUSLICE_ROOT={root}\n",
            self.dir.display(),
            self.state.from,
            self.state.pools.len()
        )
    }

    /// The document `-o json|yaml` prints: the directory, its `--root`, and its state.
    #[must_use]
    pub fn document(&self) -> serde_json::Value {
        serde_json::json!({
            "sandbox": self.dir.display().to_string(),
            "root": self.root(),
            "state": self.state,
        })
    }
}
