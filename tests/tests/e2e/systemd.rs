//! systemd's notification protocol against the real binary: the test binds the unix datagram
//! socket a service manager would and passes it as `NOTIFY_SOCKET`, with `WATCHDOG_USEC` set (no
//! `WATCHDOG_PID`, which sd_watchdog_enabled(3) accepts). READY=1 must come only once MQTT
//! accepts, WATCHDOG=1 keep-alives must keep coming, STOPPING=1 must come on SIGTERM.
//!
//! That keep-alives stop when tern is not alive (checker stale, a listener ended, a writer
//! stopped) is tested in `gateway/tern/src/systemd.rs` on tokio's paused clock: nothing outside
//! the process can wedge its runtime or end a listener task without also ending the process.

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tern_tests::raw_mqtt::RawClient;
use tern_tests::{Gateway, ServeOptions, TempDir, free_port};

/// Reads datagrams until one has the line `want` or `timeout` passes; returns every line read.
fn until_line(socket: &UnixDatagram, want: &str, timeout: Duration) -> anyhow::Result<Vec<String>> {
    let deadline = Instant::now() + timeout;
    let mut lines = Vec::new();
    let mut buf = vec![0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("no {want} within {timeout:?}; got {lines:?}");
        }
        socket.set_read_timeout(Some(left))?;
        let n = match socket.recv(&mut buf) {
            Ok(n) => n,
            Err(err)
                if err.kind() == std::io::ErrorKind::WouldBlock
                    || err.kind() == std::io::ErrorKind::TimedOut =>
            {
                continue;
            }
            Err(err) => return Err(err).context("recv on the notify socket"),
        };
        let text = String::from_utf8_lossy(buf.get(..n).unwrap_or_default()).into_owned();
        let found = text.lines().any(|line| line == want);
        lines.extend(text.lines().map(str::to_owned));
        if found {
            return Ok(lines);
        }
    }
}

#[test]
fn tern_notifies_ready_watchdog_and_stopping() -> anyhow::Result<()> {
    let dir = TempDir::new("systemd")?;
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).context("binding the notify socket")?;
    let data = dir.path().join("data");
    let mqtt = free_port()?;
    let options = ServeOptions {
        mqtt_listen: Some(mqtt),
        ..ServeOptions::default()
    };
    let notify = socket_path.display().to_string();
    // 400 ms: a keep-alive every 200 ms, so a few arrive quickly.
    let env = [
        ("NOTIFY_SOCKET", notify.as_str()),
        ("WATCHDOG_USEC", "400000"),
    ];
    let mut gateway = Gateway::spawn_with_env(&data, &options, &env)?;

    let startup = until_line(&socket, "READY=1", Duration::from_secs(30))?;
    assert!(!startup.iter().any(|l| l == "STOPPING=1"), "{startup:?}");
    // READY=1 means MQTT accepts now: connect at once, without waiting for any log line.
    RawClient::connect(mqtt, "after-ready", 30, true, false).context("CONNACK after READY=1")?;

    for n in 0..5 {
        until_line(&socket, "WATCHDOG=1", Duration::from_secs(10))
            .with_context(|| format!("keep-alive {n}"))?;
    }

    gateway.signal(libc::SIGTERM)?;
    let stopping = until_line(&socket, "STOPPING=1", Duration::from_secs(15))?;
    assert!(!stopping.iter().any(|l| l == "READY=1"), "{stopping:?}");
    let status = gateway.wait_exit(Duration::from_secs(15))?;
    assert_eq!(status.code(), Some(0), "{:#?}", gateway.stderr_lines());
    Ok(())
}
