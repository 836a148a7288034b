//! A line on a terminal while a step takes long (`gpuslice --progress`), so a slow discovery (a
//! host with thousands of sysfs files, a driver slow to answer) is not a silent wait.
//!
//! Nothing is printed unless `--progress` is given and standard error is a terminal, so pipes and
//! documents stay as they are. The first line comes after [`FIRST_AFTER`] (env
//! `GPUSLICE_PROGRESS_AFTER_MS` shortens it), then one every [`EVERY`]; when the step ends after
//! a line was printed, its time is printed too.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a step runs before the first line.
pub const FIRST_AFTER: Duration = Duration::from_secs(2);

/// How often a line follows.
pub const EVERY: Duration = Duration::from_secs(2);

/// A step being timed; dropping it ends the step.
pub struct Progress {
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts timing `what` (`discovering /`) when `enabled` and standard error is a terminal.
    pub fn start(enabled: bool, what: String) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        if !enabled || !std::io::stderr().is_terminal() {
            return Progress { done, thread: None };
        }
        let first = std::env::var("GPUSLICE_PROGRESS_AFTER_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(FIRST_AFTER, Duration::from_millis);
        let flag = Arc::clone(&done);
        let thread = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || report(&flag, &what, first))
            .ok();
        Progress { done, thread }
    }
}

/// Prints a line after `first` and then every [`EVERY`] until `done`; then the time taken, when
/// a line was printed. Sleeps in short slices so the end of the step is not waited for.
fn report(done: &AtomicBool, what: &str, first: Duration) {
    let start = Instant::now();
    let mut next = first;
    let mut printed = false;
    while !done.load(Ordering::Acquire) {
        if start.elapsed() >= next {
            eprintln!("gpuslice: {what}... ({} s)", start.elapsed().as_secs());
            printed = true;
            next += EVERY;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if printed {
        eprintln!(
            "gpuslice: {what}: done in {:.1} s",
            start.elapsed().as_secs_f64()
        );
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
