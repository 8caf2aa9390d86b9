//! The fleet, seen from the datacenter: this gateway's status record, sent over each
//! `[[upstream]]` link to the fleet's compacted status topic (`[upstream.status]`) at start,
//! every `interval` and whenever readiness changes ([`report`]); and `tern fleet status`
//! ([`run_status`]), which reads every gateway's last record back. The record is versioned JSON
//! ([`FORMAT`], [`VERSION`]; fields in docs/fleet.md), composed from the status page's snapshot,
//! so the page, `/status.json` and the datacenter see the same figures.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};
use tern_core::shutdown::Shutdown;
use tern_core::time::now_ms;
use tern_upstream::{GatewayStatus, StatusPublisher, UpstreamConfig};
use tokio::sync::watch;

use crate::health::Readiness;
use crate::status::StatusPage;

/// The record's `format`: what a reader checks before it trusts the rest.
pub const FORMAT: &str = "tern-status";
/// The record's `version`: raised when a field changes meaning or goes; new fields may appear
/// within a version, so readers ignore fields they do not know.
pub const VERSION: u32 = 1;

/// The status record of `gateway` from the page's `snapshot`, with the data file system's
/// space (`disk`: `None` when it cannot be read).
pub fn status_record(
    gateway: &str,
    started_ms: i64,
    snapshot: &Value,
    disk: Option<tern_core::sys::FsSpace>,
) -> Value {
    let sent_ms = now_ms();
    let upstream = &snapshot["upstream"];
    let partitions: Vec<Value> = upstream["partitions"]
        .as_array()
        .map(|partitions| {
            partitions
                .iter()
                .map(|p| {
                    json!({
                        "topic": p["topic"], "partition": p["partition"], "class": p["class"],
                        "connected": p["connected"], "backlog": p["backlog"],
                        "draining": p["draining"], "last_error": p["last_error"],
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "format": FORMAT,
        "version": VERSION,
        "gateway": gateway,
        "tern_version": snapshot["version"],
        "sent_ms": sent_ms,
        "started_ms": started_ms,
        "uptime_seconds": (sent_ms - started_ms).max(0) / 1000,
        "ready": snapshot["readiness"]["ready"],
        "reasons": snapshot["readiness"]["reasons"],
        "disk": disk.map(|d| json!({
            "free_bytes": d.available, "total_bytes": d.total, "read_only": d.read_only,
        })),
        "card": { "years": snapshot["card"]["years"] },
        "upstream": {
            "backlog_records": upstream["backlog"],
            "classes": upstream["classes"],
            "partitions": partitions,
        },
        "downstream": snapshot["downstream"]["partitions"],
    })
}

/// Sends this gateway's status over `settings`' link until shutdown: at start, every
/// `status.interval` and when readiness changes. A failed send is logged once per failing
/// streak and tried again at the next turn; it never stops the gateway.
pub async fn report(
    settings: UpstreamConfig,
    gateway: String,
    (page, data_dir): (Arc<StatusPage>, PathBuf),
    mut readiness: watch::Receiver<Readiness>,
    mut shutdown: Shutdown,
) {
    let mut publisher = match StatusPublisher::new(&settings, &gateway) {
        Ok(publisher) => publisher,
        Err(err) => {
            tracing::warn!(%err, "cannot send status records upstream");
            return;
        }
    };
    let started_ms = now_ms();
    let mut failing = false;
    loop {
        let current = readiness.borrow().clone();
        let snapshot = page.snapshot(Some(&current));
        let disk = tern_core::sys::statvfs(&data_dir).ok();
        let record = status_record(&gateway, started_ms, &snapshot, disk);
        let sent = tokio::select! {
            () = shutdown.wait() => return,
            sent = publisher.publish(record.to_string().into_bytes()) => sent,
        };
        match sent {
            Ok(()) if failing => {
                tracing::info!(topic = %settings.status.topic, "status records reach the datacenter again");
                failing = false;
            }
            Ok(()) => {}
            Err(err) if !failing => {
                tracing::warn!(%err, topic = %settings.status.topic, "cannot send the status record; trying again at the next turn");
                failing = true;
            }
            Err(err) => tracing::debug!(%err, "status record not sent"),
        }
        let deadline = tokio::time::Instant::now() + settings.status.interval.0;
        let was_ready = current.is_ready();
        loop {
            tokio::select! {
                () = shutdown.wait() => return,
                () = tokio::time::sleep_until(deadline) => break,
                changed = readiness.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if readiness.borrow().is_ready() != was_ready {
                        break;
                    }
                }
            }
        }
    }
}

/// What `tern fleet status` was asked.
#[derive(Debug, Clone)]
pub struct StatusQuery {
    pub kafka: Vec<String>,
    pub config: Option<PathBuf>,
    pub topic: Option<String>,
    pub silent_after: Duration,
    pub json: bool,
}

/// The upstream settings `tern fleet status` connects with: the first `[[upstream]]` of
/// `--config` (its TLS and SASL too), else defaults; `--kafka` and `--topic` override.
fn query_settings(query: &StatusQuery) -> anyhow::Result<UpstreamConfig> {
    let mut settings = match &query.config {
        Some(path) => first_upstream(path)?,
        None => UpstreamConfig::default(),
    };
    if !query.kafka.is_empty() {
        settings.bootstrap = query.kafka.clone();
    }
    if let Some(topic) = &query.topic {
        settings.status.topic = topic.clone();
    }
    if settings.bootstrap.is_empty() {
        anyhow::bail!("give --kafka HOST:PORT or a --config with an [[upstream]]");
    }
    Ok(settings)
}

fn first_upstream(path: &Path) -> anyhow::Result<UpstreamConfig> {
    let (mut config, _) = crate::config::load(Some(path), &crate::config::Overrides::default())?;
    config.resolve_secrets()?;
    config
        .upstream
        .into_iter()
        .next()
        .with_context(|| format!("{} has no [[upstream]]", path.display()))
}

/// One gateway's row: its record and how long ago it arrived.
fn row(status: &GatewayStatus, now: i64, silent_after: Duration) -> Value {
    let record: Value = serde_json::from_slice(&status.value).unwrap_or(Value::Null);
    let age_ms = (now - status.received_ms).max(0);
    let silent = u128::try_from(age_ms).unwrap_or(0) > silent_after.as_millis();
    let known = record["format"] == FORMAT && record["version"].as_u64().is_some();
    json!({
        "gateway": status.gateway,
        "received_ms": status.received_ms,
        "age_seconds": age_ms / 1000,
        "silent": silent,
        // The gateway's clock against the broker's: sent_ms against the arrival time.
        "clock_skew_ms": record["sent_ms"].as_i64().map(|sent| sent - status.received_ms),
        "readable": known,
        "status": record,
    })
}

/// `tern fleet status`: every gateway's last status record, as a table or JSON.
pub fn run_status(query: &StatusQuery) -> anyhow::Result<()> {
    let settings = query_settings(query)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let statuses = runtime.block_on(tern_upstream::read_statuses(&settings))?;
    let now = now_ms();
    let rows: Vec<Value> = statuses
        .iter()
        .map(|s| row(s, now, query.silent_after))
        .collect();
    let mut out = std::io::stdout().lock();
    if query.json {
        writeln!(out, "{}", Value::Array(rows))?;
        return Ok(());
    }
    print_table(&rows, query.silent_after, &mut out)
}

fn print_table(rows: &[Value], silent_after: Duration, out: &mut impl Write) -> anyhow::Result<()> {
    writeln!(
        out,
        "{:<24} {:<8} {:<26} {:>10} {:>10} {:>10} {:>10} {:>9}  version",
        "gateway", "ready", "reason", "backlog", "oldest", "uptime", "last seen", "skew ms"
    )?;
    let text = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    let (mut ready, mut silent) = (0, 0);
    for row in rows {
        let status = &row["status"];
        let is_ready = status["ready"] == true;
        ready += usize::from(is_ready);
        silent += usize::from(row["silent"] == true);
        let reason = status["reasons"]
            .as_array()
            .and_then(|r| r.first())
            .map_or("-".to_owned(), |r| text(&r["reason"]));
        let oldest = status["upstream"]["classes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["backlog"]["age_seconds"].as_u64())
            .max()
            .unwrap_or(0);
        let state = match (row["silent"] == true, is_ready) {
            (true, _) => "SILENT",
            (false, true) => "yes",
            (false, false) => "no",
        };
        writeln!(
            out,
            "{:<24} {:<8} {:<26} {:>10} {:>10} {:>10} {:>10} {:>9}  {}",
            text(&row["gateway"]),
            state,
            reason,
            status["upstream"]["backlog_records"].as_u64().unwrap_or(0),
            age(oldest),
            age(status["uptime_seconds"].as_u64().unwrap_or(0)),
            age(row["age_seconds"].as_u64().unwrap_or(0)),
            row["clock_skew_ms"]
                .as_i64()
                .map_or("-".to_owned(), |s| s.to_string()),
            text(&status["tern_version"]),
        )?;
    }
    writeln!(
        out,
        "{} gateways: {ready} ready, {silent} silent for more than {}",
        rows.len(),
        age(silent_after.as_secs())
    )?;
    Ok(())
}

/// Seconds as `42s`, `7m`, `3h` or `2d`.
fn age(seconds: u64) -> String {
    match seconds {
        s if s >= 2 * 86_400 => format!("{}d", s / 86_400),
        s if s >= 2 * 3600 => format!("{}h", s / 3600),
        s if s >= 120 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_carries_its_format_readiness_backlog_and_disk() {
        let snapshot = json!({
            "version": "0.1.0",
            "readiness": { "ready": false, "reasons": [{ "reason": "upstream_failed", "message": "down" }] },
            "upstream": {
                "backlog": 1200,
                "classes": [{ "class": "low", "backlog": { "records": 1200, "age_seconds": 7200 } }],
                "partitions": [{ "topic": "telemetry", "partition": 0, "class": "low",
                    "connected": false, "backlog": { "records": 1200 }, "history": [1, 2] }],
            },
            "downstream": { "partitions": [] },
            "card": { "years": 12.5 },
        });
        let disk = tern_core::sys::FsSpace {
            total: 1000,
            available: 400,
            read_only: false,
        };
        let record = status_record("pi-7", now_ms() - 90_000, &snapshot, Some(disk));
        assert_eq!(record["format"], FORMAT);
        assert_eq!(record["version"], VERSION);
        assert_eq!(record["gateway"], "pi-7");
        assert_eq!(record["ready"], false);
        assert_eq!(record["reasons"][0]["reason"], "upstream_failed");
        assert_eq!(record["upstream"]["backlog_records"], 1200);
        assert!(record["upstream"]["partitions"][0].get("history").is_none());
        assert_eq!(record["disk"]["free_bytes"], 400);
        assert_eq!(record["card"]["years"], 12.5);
        assert!((89..=91).contains(&record["uptime_seconds"].as_i64().unwrap_or(0)));
        // The table: one row, not ready, its oldest backlog, a summary line.
        let status = GatewayStatus {
            gateway: "pi-7".into(),
            value: record.to_string().into_bytes(),
            received_ms: now_ms() - 400_000,
        };
        let row = row(&status, now_ms(), Duration::from_secs(300));
        assert_eq!(row["silent"], true);
        assert_eq!(row["readable"], true);
        let mut out = Vec::new();
        print_table(&[row], Duration::from_secs(300), &mut out).expect("table");
        let table = String::from_utf8(out).expect("utf-8");
        assert!(
            table.contains("pi-7") && table.contains("SILENT"),
            "{table}"
        );
        assert!(
            table.contains("upstream_failed") && table.contains("2h"),
            "{table}"
        );
        assert!(
            table.contains("1 gateways: 0 ready, 1 silent for more than 5m"),
            "{table}"
        );
    }
}
