//! Cursors as an operator sees them: who owns each one (by the name its owner gives it), the
//! JSON report `tern cursors list` and the admin endpoint share, the table printed for people,
//! orphaned `upstream:*` cursors at start, and the offline commands on a data directory that no
//! running tern holds.
//!
//! It moves cursors only through tern-log's public repair calls; it never touches log files.

use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use tern_log::datadir::{DataDirError, DataDirLock};
use tern_log::{CursorReport, Log, LogConfig, ResetTo};
use tern_upstream::{Mode, UpstreamConfig};

/// `[cursors]`: what tern does with cursors at start.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CursorsConfig {
    /// Delete `upstream:*` cursors that no configured `[[upstream]]` owns (after a removed
    /// upstream or a changed `gateway_id`/`topic_prefix`). Off: they are only reported.
    pub drop_orphans: bool,
}

/// Who owns a cursor, by the prefix its owner names it with (tern-mqtt's sessions and shared
/// groups, tern-upstream's forwarders and downstream, tern-kafka's consumer groups).
pub fn owner_kind(name: &str) -> &'static str {
    if name.starts_with("mqtt:") || name.starts_with("mqtt-sent:") {
        "mqtt session"
    } else if name == "mqtt-state" {
        "mqtt state"
    } else if name.starts_with("mqtt.share:") {
        "shared group"
    } else if name.starts_with("upstream:") {
        "upstream"
    } else if name.starts_with("downstream:") {
        "downstream"
    } else if name.starts_with("kafka.group:") {
        "kafka group"
    } else {
        "other"
    }
}

use tern_core::time::now_ms;

/// The JSON form of the cursor report (admin `GET /cursors`, `tern cursors list --json`).
pub fn report_json(reports: &[CursorReport]) -> Value {
    let now = now_ms();
    let cursors: Vec<Value> = reports
        .iter()
        .map(|c| {
            let positions: Vec<Value> = c
                .positions
                .iter()
                .map(|p| {
                    json!({
                        "topic": p.topic,
                        "partition": p.partition,
                        "offset": p.offset,
                        "end_offset": p.end_offset,
                        "lag_records": p.lag_records,
                        "lag_bytes": p.lag_bytes,
                        "held_bytes": p.held_bytes,
                        "oldest_held_ms": p.oldest_held_ms,
                        "oldest_held_age_seconds": p.oldest_held_ms.map(|ts| (now - ts).max(0) / 1000),
                    })
                })
                .collect();
            json!({ "name": c.name, "owner": owner_kind(&c.name), "positions": positions })
        })
        .collect();
    json!({ "cursors": cursors })
}

/// The report as a table for people.
pub fn print_table(report: &Value, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<32} {:<13} {:<24} {:>10} {:>10} {:>10} {:>12} {:>12} {:>10}",
        "CURSOR",
        "OWNER",
        "TOPIC/PARTITION",
        "OFFSET",
        "END",
        "LAG",
        "LAG_BYTES",
        "HELD_BYTES",
        "OLDEST_S"
    )?;
    let empty = Vec::new();
    let cursors = report["cursors"].as_array().unwrap_or(&empty);
    for cursor in cursors {
        for p in cursor["positions"].as_array().unwrap_or(&empty) {
            let age = p["oldest_held_age_seconds"]
                .as_i64()
                .map_or_else(|| "-".to_owned(), |a| a.to_string());
            writeln!(
                out,
                "{:<32} {:<13} {:<24} {:>10} {:>10} {:>10} {:>12} {:>12} {:>10}",
                cursor["name"].as_str().unwrap_or_default(),
                cursor["owner"].as_str().unwrap_or_default(),
                format!(
                    "{}/{}",
                    p["topic"].as_str().unwrap_or_default(),
                    p["partition"]
                ),
                p["offset"],
                p["end_offset"],
                p["lag_records"],
                p["lag_bytes"],
                p["held_bytes"],
                age
            )?;
        }
    }
    Ok(())
}

/// `upstream:*` cursors no configured upstream would write, given the log's topics.
pub fn orphans(log: &Log, upstreams: &[UpstreamConfig]) -> Vec<String> {
    let topics: Vec<String> = log.topics().into_iter().map(|t| t.name).collect();
    let mut expected = std::collections::HashSet::new();
    for upstream in upstreams {
        let gateway = tern_upstream::gateway_id(upstream);
        for topic in topics.iter().filter(|t| upstream.forwards(t)) {
            let target = match upstream.mode {
                Mode::Shared => format!("{}{topic}", upstream.topic_prefix),
                _ => tern_upstream::upstream_topic(&upstream.topic_prefix, &gateway, topic),
            };
            expected.insert(format!("upstream:{target}"));
        }
    }
    let mut names: Vec<String> = log
        .cursors()
        .list()
        .into_iter()
        .map(|(name, ..)| name)
        .filter(|name| name.starts_with("upstream:") && !expected.contains(name))
        .collect();
    names.dedup();
    names
}

/// At start: reports orphaned upstream cursors, and deletes them if configured to.
pub async fn handle_orphans(log: &Log, upstreams: &[UpstreamConfig], drop: bool) {
    for name in orphans(log, upstreams) {
        if drop {
            match log.delete_cursor(&name).await {
                Ok(_) => {
                    tracing::warn!(cursor = %name, "orphaned upstream cursor deleted (cursors.drop_orphans)")
                }
                Err(err) => {
                    tracing::warn!(cursor = %name, %err, "cannot delete orphaned upstream cursor")
                }
            }
        } else {
            tracing::warn!(
                cursor = %name,
                "cursor has no owner in the configuration (no matching [[upstream]] / gateway_id) and holds the log back; delete it with `tern cursors delete` or set cursors.drop_orphans = true"
            );
        }
    }
}

/// A cursor command.
#[derive(Debug, Clone)]
pub enum Action {
    List,
    Delete {
        name: String,
    },
    Reset {
        name: String,
        topic: Option<String>,
        to: ResetTo,
    },
}

/// Runs `action` on the log of a data directory no tern is serving. Retention does not run here
/// (it runs at the next `tern serve` with its configured limits).
pub fn run_offline(data_dir: &Path, action: &Action) -> anyhow::Result<Value> {
    let lock = match DataDirLock::acquire(data_dir) {
        Err(DataDirError::Locked { holder, .. }) => anyhow::bail!(
            "data directory {} is in use by a running tern ({holder}); ask it instead: --admin ADDR (its [admin] listen address)",
            data_dir.display()
        ),
        other => other?,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let mut config = LogConfig::default();
    config.retention.bytes = tern_core::ByteSize(0);
    config.retention.age = tern_core::HumanDuration(std::time::Duration::ZERO);
    let log_dir = data_dir.join("log");
    let answer = runtime.block_on(async {
        let log = Log::open(&log_dir, &config)
            .await
            .with_context(|| format!("cannot open the log in {}", log_dir.display()))?;
        let answer = apply(&log, action).await;
        log.close().await.context("closing the log")?;
        answer
    });
    drop(lock);
    answer
}

/// Runs `action` on an open log; the JSON answer is what the admin endpoint returns.
pub async fn apply(log: &Log, action: &Action) -> anyhow::Result<Value> {
    match action {
        Action::List => Ok(report_json(&log.cursor_report())),
        Action::Delete { name } => {
            let deleted = log.delete_cursor(name).await?;
            if deleted {
                tracing::info!(cursor = %name, "cursor deleted by the operator");
            }
            Ok(json!({ "cursor": name, "deleted": deleted }))
        }
        Action::Reset { name, topic, to } => {
            let moved = log.reset_cursor(name, topic.as_deref(), *to).await?;
            if moved > 0 {
                tracing::info!(cursor = %name, to = ?to, moved, "cursor reset by the operator");
            }
            Ok(json!({ "cursor": name, "moved": moved }))
        }
    }
}

/// Asks a running tern's admin endpoint (`tern cursors … --admin ADDR`).
pub fn run_remote(addr: std::net::SocketAddr, action: &Action) -> anyhow::Result<Value> {
    use std::io::{Read, Write};
    let target = match action {
        Action::List => ("GET", "/cursors".to_owned()),
        Action::Delete { name } => (
            "POST",
            format!("/cursors/delete?name={}", encode_query(name)),
        ),
        Action::Reset { name, topic, to } => {
            let to = match to {
                ResetTo::Earliest => "earliest".to_owned(),
                ResetTo::Latest => "latest".to_owned(),
                ResetTo::Offset(o) => o.to_string(),
            };
            let topic = topic
                .as_deref()
                .map(|t| format!("&topic={}", encode_query(t)))
                .unwrap_or_default();
            let path = format!("/cursors/reset?name={}&to={to}{topic}", encode_query(name));
            ("POST", path)
        }
    };
    let timeout = std::time::Duration::from_secs(30);
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("cannot reach the admin endpoint at {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    write!(
        stream,
        "{} {} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        target.0, target.1
    )?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if status != 200 {
        anyhow::bail!(
            "the admin endpoint at {addr} answered {status}: {}",
            body.trim()
        );
    }
    serde_json::from_str(body).context("the admin endpoint's answer is not JSON")
}

/// Percent-encodes a query component (everything but unreserved characters).
pub fn encode_query(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `tern_cursor_lag_records` and `tern_cursor_held_bytes` for `/metrics`.
pub struct CursorMetrics(pub Log);

/// A Prometheus label value: backslash, double quote and newline escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl tern_core::metrics::MetricsSource for CursorMetrics {
    fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let reports = self.0.cursor_report();
        type Get = fn(&tern_log::CursorPosition) -> u64;
        let families: [(&str, &str, Get); 2] = [
            (
                "tern_cursor_lag_records",
                "Records between a cursor and the end of the partition.",
                |p| p.lag_records,
            ),
            (
                "tern_cursor_held_bytes",
                "Bytes retention cannot delete because of a cursor.",
                |p| p.held_bytes,
            ),
        ];
        for (name, help, get) in families {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            for c in &reports {
                for p in &c.positions {
                    let _ = writeln!(
                        out,
                        "{name}{{cursor=\"{}\",owner=\"{}\",topic=\"{}\",partition=\"{}\"}} {}",
                        label(&c.name),
                        owner_kind(&c.name),
                        label(&p.topic),
                        p.partition,
                        get(p)
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_named_by_prefix() {
        assert_eq!(owner_kind("mqtt:sensor-1"), "mqtt session");
        assert_eq!(owner_kind("mqtt-sent:sensor-1"), "mqtt session");
        assert_eq!(owner_kind("mqtt.share:g/a/#"), "shared group");
        assert_eq!(owner_kind("upstream:tern.pi.t"), "upstream");
        assert_eq!(owner_kind("downstream:tern-commands"), "downstream");
        assert_eq!(owner_kind("kafka.group:analytics"), "kafka group");
        assert_eq!(owner_kind("mqtt-state"), "mqtt state");
        assert_eq!(owner_kind("backup"), "other");
    }

    #[test]
    fn names_survive_the_query_string_and_metric_labels() {
        let name = "mqtt:a b/#?&=%\"\n";
        assert_eq!(crate::admin::percent_decode(&encode_query(name)), name);
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[tokio::test]
    async fn upstream_cursors_without_a_configured_owner_are_orphans_until_dropped() {
        let dir = std::env::temp_dir().join(format!("tern-orphans-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let log = Log::open(&dir, &LogConfig::default()).await.expect("open");
        log.ensure_topic("t").expect("topic");
        let cursors = log.cursors();
        for name in ["upstream:tern.pi-1.t", "upstream:tern.old.t", "mqtt:device"] {
            cursors.commit(name, "t", 0, 0).await.expect("commit");
        }
        let upstream = UpstreamConfig {
            bootstrap: vec!["127.0.0.1:9".into()],
            gateway_id: Some("pi-1".into()),
            ..UpstreamConfig::default()
        };
        assert_eq!(
            orphans(&log, std::slice::from_ref(&upstream)),
            ["upstream:tern.old.t"]
        );
        assert_eq!(orphans(&log, &[]).len(), 2, "no upstream: both are orphans");

        handle_orphans(&log, std::slice::from_ref(&upstream), false).await;
        assert_eq!(cursors.list().len(), 3, "reported, not dropped");
        handle_orphans(&log, std::slice::from_ref(&upstream), true).await;
        let names: Vec<String> = cursors.list().into_iter().map(|(n, ..)| n).collect();
        assert_eq!(names, ["mqtt:device", "upstream:tern.pi-1.t"]);
        log.close().await.expect("close");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
