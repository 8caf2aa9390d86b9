//! The datacenter's side of the downstream in tests: command records (key = address, value =
//! payload, `mqtt.*` headers) produced with kcat, as an operator would (`docs/downstream.md`).

use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// One command as the test produces it: its address (record key), MQTT topic, value and extra
/// headers.
#[derive(Debug, Clone)]
pub struct Cmd {
    pub key: String,
    pub topic: String,
    pub value: String,
    pub headers: Vec<(&'static str, String)>,
}

impl Cmd {
    /// A QoS 1 command.
    pub fn new(key: &str, topic: &str, value: String) -> Self {
        Self {
            key: key.to_owned(),
            topic: topic.to_owned(),
            value,
            headers: vec![("mqtt.qos", "1".to_owned())],
        }
    }
}

/// Produces `commands` to `topic` with kcat (idempotent, Kafka's murmur2 partitioner), one
/// kcat per run of equal key and headers, in order.
pub fn produce(bootstrap: &str, topic: &str, commands: &[Cmd]) -> anyhow::Result<()> {
    let mut start = 0;
    while start < commands.len() {
        let first = &commands[start];
        let same =
            |c: &Cmd| c.key == first.key && c.topic == first.topic && c.headers == first.headers;
        let run = commands[start..].iter().take_while(|c| same(c)).count();
        let mut command = Command::new("kcat");
        command
            .args(["-b", bootstrap, "-P", "-t", topic, "-K", "|"])
            .args(["-X", "partitioner=murmur2_random"])
            .args(["-X", "enable.idempotence=true"])
            .args(["-H", &format!("mqtt.topic={}", first.topic)]);
        for (name, value) in &first.headers {
            command.args(["-H", &format!("{name}={value}")]);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("kcat (scripts/ensure-deps.sh installs it)")?;
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().context("kcat has no stdin")?;
            for c in &commands[start..start + run] {
                writeln!(stdin, "{}|{}", c.key, c.value)?;
            }
        }
        let output = child.wait_with_output()?;
        if !output.status.success() {
            bail!("kcat failed: {}", String::from_utf8_lossy(&output.stderr));
        }
        start += run;
    }
    Ok(())
}
