//! The command line as clap builds it: every subcommand keeps its own description.

fn abouts(c: &clap::Command, at: &str, out: &mut Vec<(String, String)>) {
    // Building adds the `help` subcommands; they are clap's own.
    for sub in c.get_subcommands().filter(|s| s.get_name() != "help") {
        let path = format!("{at} {}", sub.get_name());
        let about = sub.get_about().map(ToString::to_string).unwrap_or_default();
        out.push((path.clone(), about));
        abouts(sub, &path, out);
    }
}

/// Subcommands are built only when named (`defer`), so an `Args` struct's doc comment would
/// replace the subcommand's own description once built (in its `--help`): every subcommand
/// keeps the one its variant gives, built or not.
#[test]
fn every_subcommand_keeps_its_variants_description_when_built() {
    gpuslice_cli::command().debug_assert();
    let mut before = Vec::new();
    abouts(&gpuslice_cli::command(), "gpuslice", &mut before);
    let mut built = gpuslice_cli::command();
    built.build();
    let mut after = Vec::new();
    abouts(&built, "gpuslice", &mut after);
    assert!(before.len() > 30, "only {} subcommands", before.len());
    for (path, about) in &before {
        assert!(!about.is_empty(), "{path}: no description");
    }
    assert_eq!(before, after);
}
