//! Links the `gpuslice` binary with packed relative relocations (`DT_RELR`) where the linker and
//! the C library support them.
//!
//! The binary is position-independent (ASLR), so the loader writes the load address into some
//! 29,000 pointers of read-only-after-start data at every start. As `RELA` entries those are
//! 700 KB for the loader to read and apply one by one; as `RELR` they are a few KB of bitmaps.
//! Measured on the A2 topology process: 0.1–0.3 ms less CPU per command start, the same
//! addresses and the same ASLR. glibc applies `DT_RELR` from 2.36 on, and GNU ld (2.38+) only
//! emits it when the C library it links against has it (`GLIBC_ABI_DT_RELR`); a binary built
//! with it then needs glibc 2.36 or later where it runs (set `GPUSLICE_NO_RELR=1` to build one
//! for an older system). Anything else (another C library, a linker that does not know the
//! option, cross-compiling) links as before: the flag is added only when a probe program links
//! with it, without a warning, and runs.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=GPUSLICE_NO_RELR");
    let target = std::env::var("TARGET").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    if !target.contains("-linux-gnu")
        || target != host
        || std::env::var_os("GPUSLICE_NO_RELR").is_some()
    {
        return;
    }
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };
    let linker = std::env::var("RUSTC_LINKER").unwrap_or_else(|_| "cc".to_owned());
    let src = out.join("relr-probe.c");
    let bin = out.join("relr-probe");
    if std::fs::write(&src, "int main(void) { return 0; }\n").is_err() {
        return;
    }
    let probe = Command::new(&linker)
        .arg("-pie")
        .arg("-fPIE")
        .arg("-Wl,-z,pack-relative-relocs")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output();
    let linked = probe.is_ok_and(|o| o.status.success() && o.stderr.is_empty());
    // The probe must also run: the loader here applies what the linker wrote.
    if linked && Command::new(&bin).status().is_ok_and(|s| s.success()) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
