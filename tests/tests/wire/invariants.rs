//! The architecture's import rule for the MQTT library, checked on the source tree: rumqttd is
//! used only by the gateway's MQTT server (`gateway/mqtt/`) and, as the reference codec the
//! firmware's client is compared with, by this wire suite. No other code may reach for it.

use std::path::{Path, PathBuf};

use tern_tests::workspace_root;

/// Every `.rs` file under `dir`, skipping build output.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.file_name().is_some_and(|name| name == "target") {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

#[test]
fn rumqttd_is_imported_only_by_the_mqtt_server_and_the_wire_suite() -> anyhow::Result<()> {
    let root = workspace_root();
    let allowed = [root.join("gateway/mqtt"), root.join("tests/tests/wire")];
    let mut files = Vec::new();
    for dir in ["gateway", "shared", "tests", "firmware"] {
        rust_files(&root.join(dir), &mut files)?;
    }
    assert!(files.len() > 50, "found only {} source files", files.len());
    let offenders: Vec<String> = files
        .iter()
        .filter(|file| !allowed.iter().any(|dir| file.starts_with(dir)))
        .filter(|file| std::fs::read_to_string(file).is_ok_and(|text| text.contains("rumqttd::")))
        .filter_map(|file| file.strip_prefix(&root).ok())
        .map(|file| file.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "rumqttd used in {offenders:?}");
    Ok(())
}
