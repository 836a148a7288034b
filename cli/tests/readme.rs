//! The `console` blocks of the README, of `docs/*.md` and of `examples/*/README.md` run as shown.
//!
//! Every line of a ```` ```console ```` block that starts with `$ ` is a command a reader types
//! from the repository's root: `gpuslice ...` (run with the built binary) or `export
//! GPUSLICE_ROOT=...` (kept for the lines after it, as a shell would). Lines without `$ ` are
//! what the command prints: each one shown (other than `...`) must appear in its output, in
//! order. A command ends with exit 0, or with the status its `; echo "exit $?"` line shows.
//! `cd DIR` moves the session (from the repository's root); a command ending in `>/dev/null`
//! shows only its standard error. Each file is one session, and `/tmp/gs` stands for a fresh
//! directory of the test's own, so a sandbox made there is new on every run. Commands of other
//! programs belong in ```` ```sh ```` blocks, which run too, through bash (see [`shell_blocks`]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod shell_blocks;

use std::path::{Path, PathBuf};
use std::process::Command;

/// One command of a console block and the transcript shown under it.
#[derive(Debug)]
struct Step {
    /// The README line the command is on (1-based), for messages.
    line: usize,
    /// The command as written, after the `$ `.
    command: String,
    /// The exit status the transcript shows (`exit N`), else 0.
    exit: i32,
    /// The output lines shown, `...` left out.
    shown: Vec<String>,
}

const EXIT_ECHO: &str = "; echo \"exit $?\"";
const SANDBOX_PLACEHOLDER: &str = "/tmp/gs";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The steps of every `console` block of a Markdown text, in order.
fn console_steps(markdown: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut in_console = false;
    let mut in_other_fence = false;
    for (i, raw) in markdown.lines().enumerate() {
        let line = raw.trim_end();
        if line.starts_with("```") {
            if in_console || in_other_fence {
                in_console = false;
                in_other_fence = false;
            } else if line == "```console" {
                in_console = true;
            } else {
                in_other_fence = true;
            }
            continue;
        }
        if !in_console {
            continue;
        }
        if let Some(command) = line.strip_prefix("$ ") {
            let (command, exit_shown) = match command.strip_suffix(EXIT_ECHO) {
                Some(c) => (c.to_string(), true),
                None => (command.to_string(), false),
            };
            steps.push(Step {
                line: i + 1,
                command,
                exit: if exit_shown { -1 } else { 0 },
                shown: Vec::new(),
            });
        } else if let Some(step) = steps.last_mut() {
            if step.exit == -1 {
                if let Some(code) = line.strip_prefix("exit ") {
                    step.exit = code.parse().unwrap_or_else(|_| {
                        panic!("README line {}: `{line}` is not an exit status", i + 1)
                    });
                    continue;
                }
            }
            if line.trim() != "..." && !line.trim().is_empty() {
                step.shown.push(line.to_string());
            }
        } else {
            panic!(
                "README line {}: output shown before any `$ ` command",
                i + 1
            );
        }
    }
    steps
}

/// Splits a command line as a shell would for the simple words the README uses: blanks
/// separate words, single and double quotes group them.
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut started = false;
    for c in command.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => word.push(c),
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                started = true;
            }
            None if c.is_whitespace() => {
                if started {
                    out.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            None => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        out.push(word);
    }
    out
}

/// The lines one stream printed, read in order.
struct Lines<'a> {
    lines: Vec<&'a str>,
    next: usize,
}

impl<'a> Lines<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            lines: text.lines().map(str::trim_end).collect(),
            next: 0,
        }
    }

    /// Moves past the first line from here on that the shown line matches; false when none.
    fn advance_past(&mut self, shown: &str) -> bool {
        match self.lines[self.next..]
            .iter()
            .position(|l| matches_shown(l, shown))
        {
            Some(at) => {
                self.next += at + 1;
                true
            }
            None => false,
        }
    }
}

/// A printed line matches a shown one when they are equal, or when the shown line has `...`
/// where the printed one has any text: the pieces around each `...` appear in order, the first
/// at the start and the last at the end.
fn matches_shown(printed: &str, shown: &str) -> bool {
    let pieces: Vec<&str> = shown.split("...").collect();
    if pieces.len() == 1 {
        return printed == shown;
    }
    let (first, last) = (pieces[0], pieces[pieces.len() - 1]);
    if !printed.starts_with(first) || printed.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &printed[first.len()..];
    for piece in &pieces[1..pieces.len() - 1] {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// Runs the steps of one Markdown file as one shell session from the repository's root: a fresh
/// directory for `/tmp/gs`, no `GPUSLICE_ROOT` until the file exports one.
fn run_session(file: &str, steps: &[Step]) {
    let tmp = tempfile::tempdir().unwrap();
    let sandbox = tmp.path().join("gs");
    let sandbox_str = sandbox.to_str().unwrap().to_string();
    let mut root_env: Option<String> = None;
    let mut cwd = workspace_root();
    for step in steps {
        let concrete = step.command.replace(SANDBOX_PLACEHOLDER, &sandbox_str);
        if let Some(value) = concrete.strip_prefix("export GPUSLICE_ROOT=") {
            root_env = Some(value.to_string());
            continue;
        }
        if let Some(dir) = concrete.strip_prefix("cd ") {
            cwd = cwd.join(dir.trim());
            assert!(
                cwd.is_dir(),
                "{file} line {}: no directory {dir}",
                step.line
            );
            continue;
        }
        // `>/dev/null` at the end: the reader sees only standard error.
        let (concrete, quiet) = match concrete.strip_suffix(" >/dev/null") {
            Some(c) => (c.to_string(), true),
            None => (concrete, false),
        };
        let argv = words(&concrete);
        assert!(
            argv.first().map(String::as_str) == Some("gpuslice")
                && !concrete.contains(['|', '&', '>', '<', '`', '#']),
            "{file} line {}: `{}` is not a plain gpuslice command; put it in a ```sh block",
            step.line,
            step.command
        );
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuslice"));
        cmd.args(&argv[1..])
            .current_dir(&cwd)
            .env_remove("GPUSLICE_ROOT");
        if let Some(root) = &root_env {
            cmd.env("GPUSLICE_ROOT", root);
        }
        let out = cmd.output().unwrap();
        let stdout = if quiet {
            String::new()
        } else {
            String::from_utf8_lossy(&out.stdout).replace(&sandbox_str, SANDBOX_PLACEHOLDER)
        };
        let stderr =
            String::from_utf8_lossy(&out.stderr).replace(&sandbox_str, SANDBOX_PLACEHOLDER);
        let printed = format!("{stdout}{stderr}");
        assert_eq!(
            out.status.code(),
            Some(step.exit),
            "{file} line {}: `{}` ended with {:?}, the page shows exit {}\n{printed}",
            step.line,
            step.command,
            out.status.code(),
            step.exit
        );
        // The two streams interleave on a terminal as they please: each keeps its own order.
        let mut streams = [Lines::new(&stdout), Lines::new(&stderr)];
        for shown in &step.shown {
            assert!(
                streams.iter_mut().any(|s| s.advance_past(shown)),
                "{file} line {}: `{}` did not print, in this order, the line\n{shown}\nIt printed:\n{printed}",
                step.line,
                step.command
            );
        }
    }
}

fn steps_of(file: &str) -> Vec<Step> {
    let text = std::fs::read_to_string(workspace_root().join(file)).unwrap();
    console_steps(&text)
}

#[test]
fn the_readme_console_blocks_run_as_shown_on_a_fresh_sandbox() {
    let steps = steps_of("README.md");
    let commands = steps
        .iter()
        .filter(|s| s.command.starts_with("gpuslice "))
        .count();
    assert!(
        commands >= 10,
        "the README's walkthroughs lost their runnable commands: {steps:#?}"
    );
    run_session("README.md", &steps);
}

#[test]
fn the_console_blocks_of_docs_and_examples_run_as_shown() {
    let files: Vec<String> = shell_blocks::guide_pages()
        .into_iter()
        .filter(|f| f != "README.md")
        .collect();
    let mut ran = 0;
    for file in &files {
        let steps = steps_of(file);
        ran += steps.len();
        run_session(file, &steps);
    }
    assert!(ran > 0, "no console block found in {files:?}");
}

#[test]
fn a_console_transcript_is_read_as_commands_exits_and_shown_lines() {
    let md = "text\n```console\n$ gpuslice a 'b c'\nout 1\n   ...\nout 2\n$ gpuslice x; echo \"exit $?\"\nerr\nexit 3\n```\n```sh\n$ not run\n```\n";
    let steps = console_steps(md);
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0].command, "gpuslice a 'b c'");
    assert_eq!(steps[0].exit, 0);
    assert_eq!(steps[0].shown, vec!["out 1", "out 2"]);
    assert_eq!(steps[1].command, "gpuslice x");
    assert_eq!(steps[1].exit, 3);
    assert_eq!(steps[1].shown, vec!["err"]);
    assert_eq!(
        words("gpuslice a 'b c' \"d\"e"),
        vec!["gpuslice", "a", "b c", "de"]
    );
}

#[test]
fn a_shown_line_with_dots_matches_any_text_in_their_place() {
    assert!(matches_shown(
        "cannot create: /x/y: full (ENOSPC)",
        "cannot create: ...(ENOSPC)"
    ));
    assert!(matches_shown("a b c", "a ... c"));
    assert!(matches_shown("a b c", "a b c"));
    assert!(!matches_shown("a b c", "a b"));
    assert!(!matches_shown("x a b c", "a ... c"));
    assert!(!matches_shown("a b c d", "a ... c"));
    assert!(!matches_shown("ab", "ab...b"));
}

#[test]
fn the_shell_blocks_of_the_guides_run_or_say_why_they_cannot() {
    shell_blocks::run_all();
}

#[test]
fn a_shell_block_is_found_with_the_output_its_comments_show() {
    let md = "a\n```sh\necho hi   # a note\n#   hi\n# not output\n#   ...\n```\n```console\n$ gpuslice x\n```\n```text\n$ curl x\n```\n```yaml\nk: v\n```\n";
    let blocks = shell_blocks::shell_blocks("p.md", md);
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    assert_eq!(blocks[0].line, 2);
    assert_eq!(
        blocks[0].text,
        "echo hi   # a note\n#   hi\n# not output\n#   ..."
    );
    assert_eq!(shell_blocks::shown_output(&blocks[0].text), vec!["hi"]);
    assert_eq!(blocks[1].text, "$ curl x");
}

#[test]
fn a_shell_block_that_fails_or_prints_otherwise_is_an_error() {
    let block = |text: &str| shell_blocks::ShellBlock {
        file: "p.md".into(),
        line: 1,
        text: text.into(),
    };
    assert!(shell_blocks::run_block(&block("gpuslice --version\necho hi\n#   hi")).is_ok());
    let err = shell_blocks::run_block(&block("gpuslice no-such-command\necho hi")).unwrap_err();
    assert!(err.contains("ended with"), "{err}");
    let err = shell_blocks::run_block(&block("echo ho\n#   hi")).unwrap_err();
    assert!(err.contains("did not print"), "{err}");
    let err = shell_blocks::run_block(&block("false | cat")).unwrap_err();
    assert!(err.contains("ended with"), "{err}");
    let err = shell_blocks::run_block(&block("$ gpuslice topology")).unwrap_err();
    assert!(err.contains("transcript"), "{err}");
    // /tmp/gs is the block's own directory; a job left running is stopped at the end.
    assert!(
        shell_blocks::run_block(&block(
            "mkdir -p /tmp/gs/x && ls /tmp/gs\n#   x\nsleep 100 &"
        ))
        .is_ok()
    );
}
