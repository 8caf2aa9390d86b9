//! Debian's `mosquitto_sub` as a subscriber a test can wait on. It runs with `-d` (under
//! `stdbuf -oL`), whose debug output on stdout includes the SUBACK, so [`MosquittoSub::start`]
//! returns only once the subscription is in place (no fixed sleep for "subscribed"), or once it
//! exited with success before the SUBACK (a resumed session's queued messages may all come
//! first); the debug lines are taken out of the output the test reads back. The process is ended
//! by its own PID when the handle drops.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, bail};

/// How long `mosquitto_sub` may take to connect and get its SUBACK.
const SUBACK_TIMEOUT: Duration = Duration::from_secs(10);

/// A running `mosquitto_sub` whose subscription the gateway has acknowledged.
#[derive(Debug)]
pub struct MosquittoSub {
    child: Option<Child>,
    /// How it exited, when it did before its SUBACK was seen.
    exited: Option<ExitStatus>,
    stdout: Option<JoinHandle<Vec<String>>>,
    stderr: Option<JoinHandle<String>>,
}

/// What `mosquitto_sub` printed by the time it exited, without its `-d` debug lines.
#[derive(Debug)]
pub struct SubOutput {
    pub status: ExitStatus,
    /// The received messages as `mosquitto_sub` formats them, one per line.
    pub stdout: String,
    pub stderr: String,
}

impl MosquittoSub {
    /// Starts `mosquitto_sub -h 127.0.0.1 -p PORT -d ARGS…` and waits for its SUBACK.
    pub fn start(addr: SocketAddr, args: &[&str]) -> anyhow::Result<Self> {
        // mosquitto_sub does not flush its debug lines into a pipe; coreutils' stdbuf makes its
        // stdout line-buffered so the SUBACK line arrives when it happens.
        let mut child = Command::new("stdbuf")
            .args(["-oL", "mosquitto_sub"])
            .args(["-h", "127.0.0.1", "-p", &addr.port().to_string(), "-d"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot run mosquitto_sub (scripts/ensure-deps.sh installs it)")?;
        let stdout = child.stdout.take().context("mosquitto_sub has no stdout")?;
        let stderr = child.stderr.take().context("mosquitto_sub has no stderr")?;
        let (subscribed, suback) = mpsc::channel();
        let mut sub = Self {
            child: Some(child),
            exited: None,
            stdout: Some(std::thread::spawn(move || messages(stdout, &subscribed))),
            stderr: Some(std::thread::spawn(move || read_all(stderr))),
        };
        match suback.recv_timeout(SUBACK_TIMEOUT) {
            Ok(Subscribed::Suback) => return Ok(sub),
            // A resumed session (`-c`) may deliver its queued messages before the SUBACK, and
            // `-C N` may have them all before it: an exit with success is a finished subscriber.
            Ok(Subscribed::Closed) => {
                if let Some(mut child) = sub.child.take() {
                    let status = child.wait()?;
                    sub.exited = Some(status);
                    if status.success() {
                        return Ok(sub);
                    }
                }
            }
            Err(_) => {}
        }
        if let Some(child) = sub.child.as_mut() {
            let _ = child.kill();
        }
        let output = sub.finish()?;
        bail!(
            "mosquitto_sub {args:?} got no SUBACK within {SUBACK_TIMEOUT:?} ({}): {}{}",
            output.status,
            output.stdout,
            output.stderr
        )
    }

    /// Waits for `mosquitto_sub` to exit (bound it with `-C`/`-W`) and returns its output.
    pub fn finish(mut self) -> anyhow::Result<SubOutput> {
        let status = match self.child.take() {
            Some(mut child) => child.wait()?,
            None => self.exited.context("mosquitto_sub already reaped")?,
        };
        let lines = join(self.stdout.take())?;
        let stderr = join(self.stderr.take())?;
        let mut stdout = lines.join("\n");
        if !lines.is_empty() {
            stdout.push('\n');
        }
        Ok(SubOutput {
            status,
            stdout,
            stderr,
        })
    }
}

impl Drop for MosquittoSub {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn join<T: Default>(thread: Option<JoinHandle<T>>) -> anyhow::Result<T> {
    thread.map_or(Ok(T::default()), |thread| {
        thread
            .join()
            .map_err(|_| anyhow::anyhow!("mosquitto_sub reader panicked"))
    })
}

/// What the stdout reader tells [`MosquittoSub::start`].
enum Subscribed {
    /// The SUBACK line.
    Suback,
    /// Stdout ended (the process exited) without one.
    Closed,
}

/// Reads stdout to its end: signals `subscribed` at the SUBACK (or at the end without one),
/// returns the other lines.
fn messages(stdout: ChildStdout, subscribed: &mpsc::Sender<Subscribed>) -> Vec<String> {
    let mut kept = Vec::new();
    let mut suback = false;
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        if is_debug(&line) {
            if line.ends_with(" received SUBACK") {
                suback = true;
                let _ = subscribed.send(Subscribed::Suback);
            }
        } else {
            kept.push(line);
        }
    }
    if !suback {
        let _ = subscribed.send(Subscribed::Closed);
    }
    kept
}

/// `-d` output: `Client ID sending|received PACKET…` and `Subscribed (mid: N): QOS…`.
fn is_debug(line: &str) -> bool {
    let words: Vec<&str> = line.split(' ').take(4).collect();
    match words.as_slice() {
        ["Client", _, "sending" | "received", packet] => packet
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_uppercase()),
        _ => line.starts_with("Subscribed (mid: "),
    }
}

fn read_all(mut stderr: ChildStderr) -> String {
    let mut text = String::new();
    let _ = stderr.read_to_string(&mut text);
    text
}
