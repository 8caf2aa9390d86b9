//! Records when tern-log was built (`TERN_BUILD_EPOCH`, seconds since the epoch): a wall clock
//! earlier than that has not been synchronised yet. `SOURCE_DATE_EPOCH` wins, for reproducible
//! builds.

use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let epoch = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        });
    println!("cargo:rustc-env=TERN_BUILD_EPOCH={epoch}");
}
