//! The shell blocks of the guides run too: every ```` ```sh ````, ```` ```bash ```` or
//! ```` ```shell ```` block of README.md, `docs/*.md` and `examples/*/README.md`, and any other
//! non-console block with a `$ ` line (a transcript), runs through `bash -e -o pipefail` from the
//! repository's root, `gpuslice` being the built binary and `/tmp/gs` a fresh directory of the
//! test's own (each block its own). A comment line indented `#   ` (a hash and three blanks) is
//! what the commands above it print: each must appear in the block's output, in order (`...`
//! stands for any text, as in a console block). Background jobs (`cmd &`) are killed when the
//! block ends. A block that cannot run anywhere but on a real node or cluster is named in
//! [`NOT_RUN`] with the reason; an entry that names no block fails the test, so the list cannot
//! go stale. Blocks that call `curl` or `jq` are skipped, saying so, only where those are absent.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Lines, SANDBOX_PLACEHOLDER, workspace_root};

/// One block of shell commands in a guide.
#[derive(Debug)]
pub struct ShellBlock {
    /// The page, relative to the repository's root.
    pub file: String,
    /// The line of the opening fence (1-based).
    pub line: usize,
    /// The block's text, fences left out.
    pub text: String,
}

/// Blocks that cannot run in the test suite: (page, the block's first line, why).
const NOT_RUN: &[(&str, &str, &str)] = &[
    (
        "docs/bindings.md",
        "python3 -m venv .venv",
        "builds the Python wheel (minutes); scripts/test-python runs the same pip install into a venv",
    ),
    (
        "docs/bindings.md",
        "cd bindings/node",
        "builds the Node addon (minutes); scripts/test-node runs the same npm install and build",
    ),
    (
        "docs/dra.md",
        "gpuslice dra publish --kubeconfig ~/.kube/config            # this host's pool",
        "needs a Kubernetes API server: even --dry-run reads the slices the server holds",
    ),
    (
        "docs/dra.md",
        "gpuslice --node \"$NODE_NAME\" agent --dra \\",
        "a synopsis ([...] marks optional flags) of the DaemonSet's command, which needs a kubelet and an API server",
    ),
];

/// How long one block may run (a hang, not a slow machine: a loaded 2-core CI box replays a
/// recording per command in tens of seconds).
const BLOCK_LIMIT: Duration = Duration::from_secs(600);

fn is_shell_info(info: &str) -> bool {
    matches!(info, "sh" | "bash" | "shell")
}

/// The shell blocks of one page, in order.
pub fn shell_blocks(file: &str, markdown: &str) -> Vec<ShellBlock> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String, Vec<&str>)> = None;
    for (i, raw) in markdown.lines().enumerate() {
        let line = raw.trim_end();
        if let Some(info) = line.strip_prefix("```") {
            match open.take() {
                Some((start, info, body)) => {
                    let transcript = info != "console" && body.iter().any(|l| l.starts_with("$ "));
                    if is_shell_info(&info) || transcript {
                        blocks.push(ShellBlock {
                            file: file.to_string(),
                            line: start,
                            text: body.join("\n"),
                        });
                    }
                }
                None => open = Some((i + 1, info.trim().to_string(), Vec::new())),
            }
            continue;
        }
        if let Some((_, _, body)) = open.as_mut() {
            body.push(line);
        }
    }
    blocks
}

/// What a block shows its commands print: its `#   ` comment lines, in order.
pub fn shown_output(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix("#   "))
        .map(|l| l.trim_end().to_string())
        .filter(|l| !l.is_empty() && l != "...")
        .collect()
}

/// The first line of a block that says something, as [`NOT_RUN`] names it.
fn first_line(text: &str) -> &str {
    text.lines().find(|l| !l.trim().is_empty()).unwrap_or("")
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
}

/// Whether the block uses `program` as a command word.
fn uses(text: &str, program: &str) -> bool {
    text.split(|c: char| c.is_whitespace() || c == '|' || c == '(' || c == '&' || c == ';')
        .any(|w| w == program)
}

/// Runs one block; returns what went wrong, if anything.
pub fn run_block(block: &ShellBlock) -> Result<(), String> {
    let at = format!("{} line {}", block.file, block.line);
    if block.text.lines().any(|l| l.starts_with("$ ")) {
        return Err(format!(
            "{at}: a `$ ` transcript outside a ```console block; write it as a ```console block \
             (gpuslice commands) or a ```sh script with its output as `#   ` comments"
        ));
    }
    let tmp = tempfile::tempdir().map_err(|e| format!("{at}: {e}"))?;
    let dir = tmp.path().join("gs");
    let dir_str = dir.to_str().ok_or("temp dir not UTF-8")?.to_string();
    std::fs::create_dir(&dir).map_err(|e| format!("{at}: {e}"))?;
    let script = format!(
        "set -e -o pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{}\n",
        block.text.replace(SANDBOX_PLACEHOLDER, &dir_str)
    );
    let bin = Path::new(env!("CARGO_BIN_EXE_gpuslice"));
    let mut path = vec![bin.parent().unwrap().to_path_buf()];
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let log_path = tmp.path().join("output");
    let log = std::fs::File::create(&log_path).map_err(|e| format!("{at}: {e}"))?;
    let log2 = log.try_clone().map_err(|e| format!("{at}: {e}"))?;
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new("bash")
            .arg("-c")
            .arg(&script)
            .current_dir(workspace_root())
            .env("PATH", std::env::join_paths(path).unwrap())
            .env_remove("GPUSLICE_ROOT")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("{at}: cannot start bash: {e}"))?
    };
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| format!("{at}: {e}"))? {
            break Some(s);
        }
        if started.elapsed() > BLOCK_LIMIT {
            // The block and whatever it left in the background.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let printed = std::fs::read_to_string(&log_path)
        .unwrap_or_default()
        .replace(&dir_str, SANDBOX_PLACEHOLDER);
    let Some(status) = status else {
        return Err(format!(
            "{at}: still running after {BLOCK_LIMIT:?}\nIt printed:\n{printed}"
        ));
    };
    if !status.success() {
        return Err(format!(
            "{at}: the block ended with {status}\n{}\nIt printed:\n{printed}",
            block.text
        ));
    }
    let mut lines = Lines::new(&printed);
    for shown in shown_output(&block.text) {
        if !lines.advance_past(&shown) {
            return Err(format!(
                "{at}: the block did not print, in this order, the line\n{shown}\nIt printed:\n{printed}"
            ));
        }
    }
    Ok(())
}

/// The guides whose blocks the suite runs: README.md, docs/*.md, examples/*/README.md.
pub fn guide_pages() -> Vec<String> {
    let mut files = vec!["README.md".to_string()];
    for dir in ["docs", "examples"] {
        for entry in std::fs::read_dir(workspace_root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let page = if path.is_dir() {
                path.join("README.md")
            } else {
                path
            };
            if page.extension().is_some_and(|e| e == "md") && page.is_file() {
                let rel = page.strip_prefix(workspace_root()).unwrap().to_owned();
                files.push(rel.to_str().unwrap().to_string());
            }
        }
    }
    files.sort();
    files
}

/// Runs every shell block of the guides but those [`NOT_RUN`] names; the blocks run side by
/// side (each has its own directory). Panics naming every block that failed.
pub fn run_all() {
    let mut blocks = Vec::new();
    for file in guide_pages() {
        let text = std::fs::read_to_string(workspace_root().join(&file)).unwrap();
        blocks.extend(shell_blocks(&file, &text));
    }
    let mut unused: Vec<_> = NOT_RUN.to_vec();
    let mut to_run = Vec::new();
    for block in blocks {
        let first = first_line(&block.text);
        match unused
            .iter()
            .position(|(f, l, _)| *f == block.file && *l == first)
        {
            Some(i) => {
                let (_, _, why) = unused.remove(i);
                eprintln!("not run: {} line {}: {why}", block.file, block.line);
            }
            None => to_run.push(block),
        }
    }
    assert!(
        unused.is_empty(),
        "NOT_RUN names blocks the guides no longer have: {unused:?}"
    );
    let missing: Vec<&str> = ["curl", "jq"].into_iter().filter(|p| !on_path(p)).collect();
    to_run.retain(|b| {
        let lacks: Vec<&&str> = missing.iter().filter(|p| uses(&b.text, p)).collect();
        if !lacks.is_empty() {
            eprintln!(
                "SKIPPED {} line {}: {lacks:?} not on PATH (install them to run this block)",
                b.file, b.line
            );
        }
        lacks.is_empty()
    });
    assert!(
        to_run.len() >= 5,
        "the guides lost their shell blocks: {to_run:#?}"
    );
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = to_run
            .iter()
            .map(|b| s.spawn(move || run_block(b)))
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().unwrap().err())
            .collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
