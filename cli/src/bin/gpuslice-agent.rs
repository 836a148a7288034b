//! `gpuslice-agent`: the `gpuslice` command with its long-running servers (the node agent, the
//! metrics server, DRA slice publishing) run in this process. `gpuslice agent ...` becomes this
//! binary; it takes the same command line.

use std::process::ExitCode;

fn main() -> ExitCode {
    gpuslice_cli::main(gpuslice_cli::serve_here)
}
