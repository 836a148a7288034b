//! The `gpuslice` command.
fn main() {}
