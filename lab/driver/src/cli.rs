//! Running the `gpuslice` binary under test and reading its answers.

use std::process::Command;

use serde_json::Value;

/// Where the initramfs puts the binary under test.
pub const GPUSLICE: &str = "/bin/gpuslice";

/// The node name every call passes, so output does not depend on the guest's hostname.
pub const NODE: &str = "lab";

/// The outcome of one `gpuslice` call.
#[derive(Debug)]
pub struct Run {
    /// The arguments after `gpuslice`, for messages.
    pub args: String,
    /// Exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    /// `gpuslice ARGS exited N: <first stderr line>` for failure messages.
    pub fn describe(&self) -> String {
        let code = self
            .code
            .map_or_else(|| "a signal".to_owned(), |c| c.to_string());
        // All of stderr: a refusal may span lines (or be JSON); the report flattens it.
        let err = self.stderr.trim();
        format!("`gpuslice {}` exited {code}: {err}", self.args)
    }

    /// Succeeds when the command exited 0.
    pub fn success(self) -> Result<Run, String> {
        if self.code == Some(0) {
            Ok(self)
        } else {
            Err(self.describe())
        }
    }

    /// Parses standard output as JSON.
    pub fn json(&self) -> Result<Value, String> {
        serde_json::from_str(&self.stdout).map_err(|e| {
            let head: String = self.stdout.chars().take(160).collect();
            format!("`gpuslice {}` printed no JSON ({e}): {head:?}", self.args)
        })
    }
}

/// Runs `gpuslice --node lab ARGS` and waits for it.
pub fn run(args: &[&str]) -> Result<Run, String> {
    let out = Command::new(GPUSLICE)
        .arg("--node")
        .arg(NODE)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {GPUSLICE}: {e}"))?;
    Ok(Run {
        args: args.join(" "),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Runs a command that must succeed and print JSON (`-o json` is appended).
pub fn json(args: &[&str]) -> Result<Value, String> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    run(&all)?.success()?.json()
}

/// A string field of a JSON object, or an error naming `what`.
pub fn str_field<'a>(v: &'a Value, key: &str, what: &str) -> Result<&'a str, String> {
    v.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{what} has no string `{key}`"))
}

/// An array field of a JSON object (absent = empty, as the model's `#[serde(default)]` allows).
pub fn array_field<'a>(v: &'a Value, key: &str, what: &str) -> Result<&'a [Value], String> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(format!("{what}: `{key}` is not an array: {other}")),
    }
}
