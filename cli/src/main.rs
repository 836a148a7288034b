//! The `gpuslice` command: GPU and vGPU inventory, placement, health and host setup. The node
//! agent and the other servers run in `gpuslice-agent`, which this hands them to.

use std::process::ExitCode;

fn main() -> ExitCode {
    gpuslice_cli::main(gpuslice_cli::serve_in_agent_binary)
}
