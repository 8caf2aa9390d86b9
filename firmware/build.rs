//! Puts the chosen board's `memory.x` on the linker's search path and links with cortex-m-rt's
//! `link.x` and defmt's `defmt.x`, and writes the build-time device settings (`TERN_DEVICE_ID`,
//! `TERN_PERIOD_MS`, `TERN_DEVICE_PASSWORD`) into `config.rs`. It must never pick a board
//! silently: exactly one board feature, and a setting that does not parse fails the build.

use std::path::PathBuf;

fn main() {
    let boards: Vec<&str> = [
        ("CARGO_FEATURE_LM3S6965EVB", "lm3s6965evb"),
        ("CARGO_FEATURE_MPS2_AN385", "mps2-an385"),
    ]
    .into_iter()
    .filter(|(var, _)| std::env::var_os(var).is_some())
    .map(|(_, board)| board)
    .collect();
    let [board] = boards.as_slice() else {
        panic!("enable exactly one board feature (lm3s6965evb or mps2-an385), got {boards:?}");
    };
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    // Boards live beside the gateway's boards at the repository root: boards/<board>/memory.x.
    let memory = manifest
        .join("..")
        .join("boards")
        .join(board)
        .join("memory.x");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default());
    if let Err(err) = std::fs::copy(&memory, out.join("memory.x")) {
        panic!("cannot copy {}: {err}", memory.display());
    }
    write_config(&out, board);
    println!("cargo:rustc-link-search={}", out.display());
    println!("cargo:rerun-if-changed={}", memory.display());
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-link-arg=--nmagic");
    println!("cargo:rustc-link-arg=-Tlink.x");
    if std::env::var_os("CARGO_FEATURE_DEFMT").is_some() {
        println!("cargo:rustc-link-arg=-Tdefmt.x");
    }
}

/// Longest `TERN_DEVICE_PASSWORD`: with the longest client id and username, CONNECT stays
/// inside the node's 128-byte transmit buffer (2 + 10 + 17 + 12 + 2 + 64 = 107 bytes).
const MAX_PASSWORD_LEN: usize = 64;

/// Writes `config.rs`: the device id (default 1 on lm3s6965evb, 2 on mps2-an385, so two boards
/// on one gateway differ), the sampling period in milliseconds (default 200) and the MQTT
/// password (`TERN_DEVICE_PASSWORD`; unset = anonymous CONNECT). The username is always the
/// device id in decimal, the segment the device publishes under (`sensors/{id}/reading`), so a
/// gateway's `sensors/%u/#` ACL holds each device to its own topics.
fn write_config(out: &std::path::Path, board: &str) {
    let default_id = if board == "lm3s6965evb" { 1 } else { 2 };
    let device_id = setting("TERN_DEVICE_ID", default_id);
    let period_ms = setting("TERN_PERIOD_MS", 200);
    if period_ms == 0 {
        panic!("TERN_PERIOD_MS must be at least 1");
    }
    let password = match password() {
        Some(password) => format!("Some({password:?})"),
        None => "None".to_owned(),
    };
    let config = format!(
        "/// Device id (TERN_DEVICE_ID at build time); also the MQTT username.\n\
         pub const DEVICE_ID: u32 = {device_id};\n\
         /// Sampling period in milliseconds (TERN_PERIOD_MS at build time).\n\
         pub const PERIOD_MS: u32 = {period_ms};\n\
         /// MQTT password (TERN_DEVICE_PASSWORD at build time); None connects anonymously.\n\
         pub const PASSWORD: Option<&str> = {password};\n"
    );
    if let Err(err) = std::fs::write(out.join("config.rs"), config) {
        panic!("cannot write config.rs: {err}");
    }
}

/// `TERN_DEVICE_PASSWORD`: 1 to 64 bytes of printable ASCII (what `tern passwd` reads from a
/// line and a shell passes unmangled), or unset.
fn password() -> Option<String> {
    const NAME: &str = "TERN_DEVICE_PASSWORD";
    println!("cargo:rerun-if-env-changed={NAME}");
    let value = std::env::var_os(NAME)?;
    let Some(text) = value.to_str() else {
        panic!("{NAME} is not UTF-8");
    };
    if text.is_empty() || text.len() > MAX_PASSWORD_LEN {
        panic!(
            "{NAME} must be 1 to {MAX_PASSWORD_LEN} bytes, got {}",
            text.len()
        );
    }
    if !text.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        panic!("{NAME} must be printable ASCII");
    }
    Some(text.to_owned())
}

fn setting(name: &str, default: u32) -> u32 {
    println!("cargo:rerun-if-env-changed={name}");
    match std::env::var(name) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|err| panic!("{name}={text:?} is not a u32: {err}")),
        Err(_) => default,
    }
}
