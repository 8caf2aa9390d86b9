//! Records the build time for the readiness check's clock floor (`health.rs`): a gateway whose
//! wall clock is before the time its binary was built has not synchronised it yet.
//! `SOURCE_DATE_EPOCH` wins, for reproducible builds.

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
}
