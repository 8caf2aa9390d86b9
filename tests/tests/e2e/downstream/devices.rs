//! Gateway B's devices beyond the plain QoS 1 subscriber: an MQTT 5 device (Mosquitto's own
//! `mosquitto_sub`) that takes a request/response command at QoS 2 and replies with
//! `mosquitto_pub` to the response topic with the correlation data; a `$share` subscriber; a
//! command whose topic no device subscribes to, and a live one with a short expiry. Checked
//! upstream: each one's outcome (`delivered` at QoS 2 from the MQTT 5 device, which received the
//! request exactly once over the whole run, `delivered` from
//! the shared subscriber, `no-subscriber` for the unheard one and never for the live one), and
//! the reply forwarded like any record, its correlation data intact.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tern_tests::kafka_tools::ConsumedRecord;
use tern_tests::raw_mqtt::RawClient;

use super::Cmd;

/// The MQTT 5 device's request: QoS 2, a response topic and correlation data.
pub(super) const REQUEST: &str = "r1-b5-request";
const RESPONSE_TOPIC: &str = "replies/b5";
const CORRELATION: &str = "corr-7f3a";
/// The command the `$share` subscriber takes.
pub(super) const SHARED: &str = "r1-b2-shared";
/// A command to a topic no device subscribes to, expiring after 1 s.
pub(super) const UNHEARD: &str = "r1-nobody";
/// A command to the online device b1 with a 3 s expiry: delivered, never `no-subscriber`.
pub(super) const LIVE_EXPIRING: &str = "r1-b1-live-expiring";

/// B's extra commands of round 1.
pub(super) fn commands() -> Vec<Cmd> {
    let mut request = Cmd::new("gw-b", "devices/b5/cmd", REQUEST.to_owned());
    request.headers = vec![
        ("mqtt.qos", "2".to_owned()),
        ("mqtt.response_topic", RESPONSE_TOPIC.to_owned()),
        ("mqtt.correlation_data", CORRELATION.to_owned()),
    ];
    let shared = Cmd::new("gw-b", "devices/b2/cmd", SHARED.to_owned());
    let mut unheard = Cmd::new("gw-b", "devices/nobody/cmd", UNHEARD.to_owned());
    unheard
        .headers
        .push(("mqtt.message_expiry", "1".to_owned()));
    let mut live = Cmd::new("gw-b", "devices/b1/cmd", LIVE_EXPIRING.to_owned());
    live.headers.push(("mqtt.message_expiry", "3".to_owned()));
    vec![request, shared, unheard, live]
}

/// The MQTT 5 device: `mosquitto_sub` at QoS 2 printing QoS, response topic, correlation data
/// and payload of each message, online for the whole run; its stdout lines arrive on a channel.
pub(super) struct Mqtt5Device {
    child: Child,
    lines: Receiver<String>,
    /// Messages it printed so far.
    received: usize,
}

impl Mqtt5Device {
    /// Connects as `b5`, subscribes at QoS 2 and waits for the SUBACK.
    pub(super) fn subscribe(mqtt: SocketAddr) -> anyhow::Result<Self> {
        let (child, lines) = mosquitto_sub(
            mqtt,
            &["-V", "mqttv5", "-i", "b5", "-q", "2", "-d"],
            &["-t", "devices/b5/cmd", "-F", "CMD|%q|%R|%D|%p"],
        )?;
        let mut device = Self {
            child,
            lines,
            received: 0,
        };
        device.line_containing("SUBACK")?;
        Ok(device)
    }

    fn line_containing(&mut self, what: &str) -> anyhow::Result<String> {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(90))
                .with_context(|| format!("mosquitto_sub printed no line with {what:?}"))?;
            self.received += usize::from(line.starts_with("CMD|"));
            if line.contains(what) {
                return Ok(line);
            }
        }
    }

    /// Waits for the request, checks what MQTT 5 carried and answers it like a device would:
    /// a publish to the response topic with the correlation data.
    pub(super) fn answer(&mut self, mqtt: SocketAddr) -> anyhow::Result<()> {
        let line = self.line_containing("CMD|")?;
        let fields: Vec<&str> = line.splitn(5, '|').collect();
        let [_, qos, response_topic, correlation, payload] = fields.as_slice() else {
            bail!("mosquitto_sub printed {line:?}");
        };
        if (*qos, *response_topic, *correlation, *payload)
            != ("2", RESPONSE_TOPIC, CORRELATION, REQUEST)
        {
            bail!("the request arrived as {line:?}");
        }
        let status = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &mqtt.port().to_string()])
            .args(["-V", "mqttv5", "-i", "b5-reply", "-q", "1"])
            .args(["-t", response_topic, "-m", &format!("done:{payload}")])
            .args(["-D", "publish", "correlation-data", correlation])
            .status()
            .context("mosquitto_pub")?;
        if !status.success() {
            bail!("mosquitto_pub of the reply failed: {status}");
        }
        Ok(())
    }
}

impl Mqtt5Device {
    /// Ends the device (at the end of the run) and checks that the QoS 2 request arrived
    /// exactly once.
    pub(super) fn received_exactly_once(mut self) -> anyhow::Result<()> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The reader thread ends at the pipe's end; everything it read is on the channel.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(10)) {
            self.received += usize::from(line.starts_with("CMD|"));
        }
        if self.received != 1 {
            bail!("the QoS 2 request arrived {} times", self.received);
        }
        Ok(())
    }
}

impl Drop for Mqtt5Device {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `mosquitto_sub` to the gateway at `mqtt` with `options` and `topic_args`, line-buffered (its
/// debug lines, the SUBACK's, are not flushed on their own); its stdout lines on a channel.
fn mosquitto_sub(
    mqtt: SocketAddr,
    options: &[&str],
    topic_args: &[&str],
) -> anyhow::Result<(Child, Receiver<String>)> {
    let mut child = Command::new("stdbuf")
        .args(["-oL", "mosquitto_sub"])
        .args(["-h", "127.0.0.1", "-p", &mqtt.port().to_string()])
        .args(options)
        .args(topic_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("mosquitto_sub (scripts/ensure-deps.sh installs it)")?;
    let stdout = child.stdout.take().context("mosquitto_sub has no stdout")?;
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    Ok((child, lines))
}

/// A device with a persistent session, as `mosquitto_sub -c` (clean session off, QoS 1):
/// `id` subscribes to `filter` and leaves at once (`-E`), its session kept by the gateway.
pub(super) fn subscribe_and_leave(mqtt: SocketAddr, id: &str, filter: &str) -> anyhow::Result<()> {
    let status = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &mqtt.port().to_string()])
        .args(["-c", "-i", id, "-q", "1", "-t", filter, "-E"])
        .stdout(Stdio::null())
        .status()
        .context("mosquitto_sub (scripts/ensure-deps.sh installs it)")?;
    if !status.success() {
        bail!("mosquitto_sub -E for {id} failed: {status}");
    }
    Ok(())
}

/// The persistent device `id` comes back (`mosquitto_sub -c`, same filter) and reads what its
/// session kept until every value in `want` arrived (duplicates allowed at QoS 1); returns
/// everything it printed.
pub(super) fn come_back(
    mqtt: SocketAddr,
    id: &str,
    filter: &str,
    want: &BTreeSet<String>,
) -> anyhow::Result<Vec<String>> {
    let (mut child, lines) = mosquitto_sub(mqtt, &["-c", "-i", id, "-q", "1"], &["-t", filter])?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got = Vec::new();
    let result = loop {
        if want.iter().all(|w| got.contains(w)) {
            break Ok(got);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => got.push(line),
            Err(_) => {
                break Err(anyhow::anyhow!(
                    "{id} received {got:?}, still waiting for some of {want:?}"
                ));
            }
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// The `$share` subscriber `b2`, online.
pub(super) fn shared_subscriber(mqtt: SocketAddr) -> anyhow::Result<RawClient> {
    let mut device = RawClient::connect(mqtt, "b2", 60, true, false)?;
    let granted = device.subscribe("$share/fleet/devices/b2/cmd", 1, 1)?;
    if granted != 1 {
        bail!("$share subscription granted {granted:#x}");
    }
    Ok(device)
}

/// Outcomes upstream by command value: (outcome, client id, QoS) each.
pub(super) fn outcomes(
    records: &[ConsumedRecord],
) -> BTreeMap<String, Vec<(String, String, String)>> {
    let mut value_of = BTreeMap::new();
    let mut out: BTreeMap<String, Vec<(String, String, String)>> = BTreeMap::new();
    for record in records {
        let Some(id) = record.header("tern-command") else {
            continue;
        };
        match record.header("tern-outcome") {
            None => {
                value_of.insert(id.to_owned(), record.value.clone());
            }
            Some(kind) => {
                let field = |name| record.header(name).unwrap_or_default().to_owned();
                let value = value_of.get(id).cloned().unwrap_or_default();
                let outcome = (kind.to_owned(), field("tern-client-id"), field("tern-qos"));
                out.entry(value).or_default().push(outcome);
            }
        }
    }
    out
}

/// Checks B's outcomes upstream (see the module's doc).
pub(super) fn check_outcomes(records: &[ConsumedRecord]) -> Result<(), String> {
    let outcomes = outcomes(records);
    let has = |value: &str, kind: &str, client: &str, qos: &str| {
        outcomes.get(value).is_some_and(|o| {
            o.iter()
                .any(|(k, c, q)| k == kind && c == client && (qos.is_empty() || q == qos))
        })
    };
    let of = |value: &str| format!("{value}: {:?}", outcomes.get(value));
    if !has(REQUEST, "delivered", "b5", "2") {
        return Err(format!("no delivered at QoS 2 from b5: {}", of(REQUEST)));
    }
    if !has(SHARED, "delivered", "b2", "1") {
        return Err(format!(
            "no delivered from the $share subscriber: {}",
            of(SHARED)
        ));
    }
    if !has(UNHEARD, "no-subscriber", "", "") {
        return Err(format!("no no-subscriber outcome: {}", of(UNHEARD)));
    }
    if !has(LIVE_EXPIRING, "delivered", "b1", "1") {
        return Err(format!(
            "the live command not delivered: {}",
            of(LIVE_EXPIRING)
        ));
    }
    for value in [REQUEST, SHARED, LIVE_EXPIRING] {
        if has(value, "no-subscriber", "", "") {
            return Err(format!(
                "a received command reported no-subscriber: {}",
                of(value)
            ));
        }
    }
    let unheard = outcomes.get(UNHEARD).map_or(0, Vec::len);
    if unheard != 1 {
        return Err(format!(
            "the unheard command has {unheard} outcomes: {}",
            of(UNHEARD)
        ));
    }
    Ok(())
}

/// Checks that the device's reply reached the datacenter with its correlation data, among
/// the records of B's forwarded `mqtt` topic.
pub(super) fn check_reply(records: &[ConsumedRecord]) -> Result<(), String> {
    let reply = records
        .iter()
        .find(|r| r.header("mqtt.topic") == Some(RESPONSE_TOPIC))
        .ok_or_else(|| format!("no record of {RESPONSE_TOPIC} upstream"))?;
    if reply.value != format!("done:{REQUEST}")
        || reply.header("mqtt.correlation_data") != Some(CORRELATION)
    {
        return Err(format!("the reply arrived as {reply:?}"));
    }
    Ok(())
}
