//! Records the build time for the readiness check's clock floor (`health.rs`): a gateway whose
//! wall clock is before the time its binary was built has not synchronised it yet.
//! `SOURCE_DATE_EPOCH` wins, for reproducible builds.
//!
//! A release build for a gateway's ARM targets is linked by `ld.lld` with the symbol ordering
//! file `link-order/<arch>.txt`: the functions a running gateway executes (start, connections,
//! publishes, as `tern-bench icount --link-order` recorded them) come first in `.text`, side
//! by side, instead of spread over the whole binary. The kernel maps a file's pages 64 KiB at a
//! time around each fault (fault-around), so spread code makes most of the binary resident;
//! packed, the resident text is a fraction of it (idle memory, issue #29; docs/mqtt.md). A
//! name the file lists and the build lacks is skipped; without `ld.lld` the build links as
//! before and says so.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let seconds = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        });
    println!("cargo:rustc-env=TERN_BUILD_UNIX_SECONDS={seconds}");
    if profile_dir().as_deref() == Some("release") {
        // The release profile leaves stripping to the link (`Cargo.toml`): the shipped binary
        // has no symbol table; `release-symbols`, the same build, keeps it.
        println!("cargo:rustc-link-arg-bins=-Wl,--strip-all");
    }
    link_order();
}

/// The name of the profile's output directory (`release`, `release-symbols`, `debug`, ...):
/// `OUT_DIR` is `<profile dir>/build/<package>-<hash>/out`. Cargo tells build scripts only
/// whether a profile inherits from release (`PROFILE`), not which one it is.
fn profile_dir() -> Option<String> {
    let out = PathBuf::from(std::env::var_os("OUT_DIR")?);
    let dir = out.ancestors().nth(3)?.file_name()?;
    Some(dir.to_string_lossy().into_owned())
}

/// The linker arguments of the ordered link, for a release build of an ARM gateway target.
fn link_order() {
    let var = |name| std::env::var(name).unwrap_or_default();
    let arch = match var("TARGET").as_str() {
        "aarch64-unknown-linux-gnu" => "aarch64",
        "armv7-unknown-linux-gnueabihf" => "armv7",
        _ => return,
    };
    if var("PROFILE") != "release" {
        return;
    }
    let order = Path::new(&var("CARGO_MANIFEST_DIR"))
        .join("link-order")
        .join(format!("{arch}.txt"));
    println!("cargo:rerun-if-changed={}", order.display());
    println!("cargo:rerun-if-env-changed=PATH");
    if !order.is_file() {
        return;
    }
    let Some(lld) = find_in_path("ld.lld") else {
        println!(
            "cargo:warning=ld.lld not found: tern links without its symbol ordering (more of the binary stays resident)"
        );
        return;
    };
    // A cross gcc looks for `ld.lld` only among its own programs: a directory holding just a
    // link to it is added to them (`-B`), so nothing else of the host's is picked up there.
    let programs = Path::new(&var("OUT_DIR")).join("lld");
    let link = programs.join("ld.lld");
    let _ = std::fs::remove_file(&link);
    let linked =
        std::fs::create_dir_all(&programs).and_then(|()| std::os::unix::fs::symlink(&lld, &link));
    if let Err(err) = linked {
        println!(
            "cargo:warning=cannot link ld.lld into {}: {err}",
            programs.display()
        );
        return;
    }
    println!("cargo:rustc-link-arg-bins=-B{}/", programs.display());
    println!("cargo:rustc-link-arg-bins=-fuse-ld=lld");
    println!(
        "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
        order.display()
    );
    // Functions renamed or gone since the file was written are not an error.
    println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}
