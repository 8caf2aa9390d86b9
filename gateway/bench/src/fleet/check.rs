//! Whether every acknowledged reading of every gateway is upstream: each gateway's records are
//! read back with `kcat` (librdkafka, a client that is not tern's) from the cluster directly,
//! mirror mode's from its own topic and shared mode's from the shared topic with
//! `isolation.level=read_committed`, picked out by their `tern-gateway` header. Per gateway it
//! counts the records upstream, the readings among them twice (duplicates), those out of the
//! sensor's order, and the acknowledged readings missing.
//!
//! It only reads; it never produces, creates or deletes a topic.

use std::collections::{BTreeMap, HashSet};
use std::process::{Command, Stdio};

use serde::Serialize;

use crate::BenchError;

/// One upstream record as read back: its `tern-gateway` header and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub gateway: String,
    pub value: String,
}

/// What the read-back found for one gateway.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Checked {
    pub acked: u64,
    pub upstream: u64,
    pub duplicates: u64,
    pub out_of_order: u64,
    pub missing: u64,
}

impl Checked {
    pub fn ok(&self) -> bool {
        self.duplicates == 0 && self.out_of_order == 0 && self.missing == 0
    }

    pub fn add(self, other: Self) -> Self {
        Self {
            acked: self.acked + other.acked,
            upstream: self.upstream + other.upstream,
            duplicates: self.duplicates + other.duplicates,
            out_of_order: self.out_of_order + other.out_of_order,
            missing: self.missing + other.missing,
        }
    }
}

/// Every record of partition 0 of `topic`, from its start to its end.
pub fn read(bootstrap: &str, topic: &str, committed: bool) -> Result<Vec<Upstream>, BenchError> {
    let mut command = Command::new("kcat");
    command
        .args(["-b", bootstrap, "-C", "-t", topic, "-p", "0"])
        .args(["-o", "beginning", "-e", "-q", "-f", "%h\t%s\n"]);
    if committed {
        command.args(["-X", "isolation.level=read_committed"]);
    }
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|err| BenchError::Tool {
            program: "kcat".into(),
            message: format!("{err} (scripts/ensure-deps.sh installs it)"),
        })?;
    if !output.status.success() {
        return Err(BenchError::Tool {
            program: "kcat".into(),
            message: format!("{topic}: {}", String::from_utf8_lossy(&output.stderr)),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(parse_line)
        .collect())
}

/// A `headers<TAB>value` line of kcat's; `None` without a `tern-gateway` header.
fn parse_line(line: &str) -> Option<Upstream> {
    let (headers, value) = line.split_once('\t')?;
    let gateway = headers
        .split(',')
        .find_map(|h| h.strip_prefix("tern-gateway="))?;
    Some(Upstream {
        gateway: gateway.to_owned(),
        value: value.to_owned(),
    })
}

/// The shared topic's records grouped by gateway.
pub fn by_gateway(records: Vec<Upstream>) -> BTreeMap<String, Vec<Upstream>> {
    let mut grouped: BTreeMap<String, Vec<Upstream>> = BTreeMap::new();
    for record in records {
        grouped
            .entry(record.gateway.clone())
            .or_default()
            .push(record);
    }
    grouped
}

/// Gateway `id`'s records upstream against the readings its sensor had acknowledged.
pub fn check(id: &str, upstream: &[Upstream], acked: &[u64]) -> Checked {
    let seqs: Vec<u64> = upstream
        .iter()
        .filter_map(|r| r.value.strip_prefix(id)?.trim().parse().ok())
        .collect();
    let mut seen = HashSet::new();
    let duplicates = seqs.iter().filter(|s| !seen.insert(**s)).count();
    let out_of_order = seqs.windows(2).filter(|w| w[0] >= w[1]).count();
    let missing = acked.iter().filter(|s| !seen.contains(s)).count();
    Checked {
        acked: acked.len() as u64,
        upstream: upstream.len() as u64,
        duplicates: duplicates as u64,
        out_of_order: out_of_order as u64,
        missing: missing as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(id: &str, seqs: &[u64]) -> Vec<Upstream> {
        seqs.iter()
            .map(|s| Upstream {
                gateway: id.into(),
                value: format!("{id} {s:06}"),
            })
            .collect()
    }

    #[test]
    fn duplicates_reorderings_and_missing_readings_are_each_counted() {
        let good = check("fleet-01", &records("fleet-01", &[0, 1, 2, 3]), &[0, 2, 3]);
        assert!(good.ok(), "{good:?}");
        assert_eq!((good.acked, good.upstream), (3, 4));
        let bad = check(
            "fleet-01",
            &records("fleet-01", &[0, 2, 1, 2]),
            &[0, 1, 2, 3],
        );
        assert_eq!((bad.duplicates, bad.out_of_order, bad.missing), (1, 1, 1));
        assert!(!bad.ok());
    }

    #[test]
    fn kcat_lines_are_split_at_the_tab_and_keep_the_gateway_header() {
        let line = "tern-gateway=fleet-03,tern-offset=7\tfleet-03 000007";
        let record = parse_line(line).expect("a record");
        assert_eq!(record.gateway, "fleet-03");
        assert_eq!(record.value, "fleet-03 000007");
        assert_eq!(parse_line("tern-offset=7\tx"), None);
        let grouped = by_gateway(vec![record.clone(), record]);
        assert_eq!(grouped.get("fleet-03").map(Vec::len), Some(2));
    }
}
