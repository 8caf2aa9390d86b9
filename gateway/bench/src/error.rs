//! [`BenchError`], the one error type of every bench and stress writer in this crate: why a run
//! could not start or finish. Each variant names what failed with the values a reader needs
//! (the flag, the path, the broker, the topic); the message is what `tern-bench` prints before
//! it exits non-zero.
//!
//! It only describes failures; it never decides how to recover from one, and it never stands
//! for a missed performance target (the reports print those, they are not errors).

use std::path::PathBuf;
use std::time::Duration;

/// Why a bench could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// A command-line value out of range, named by its flag.
    #[error("{option} {reason}")]
    Invalid {
        option: &'static str,
        reason: &'static str,
    },
    /// A file-system call on `path` failed.
    #[error("{op} {path}: {source}")]
    File {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// Any other I/O (sockets, the async runtime), named by what the bench was doing.
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    /// A `/proc` or `/sys` file did not hold the figure the bench reads from it.
    #[error("cannot parse {path}")]
    Parse { path: PathBuf },
    /// An external program (`mount`, `losetup`, `mkfs.ext4`) failed.
    #[error("{program}: {message}")]
    Tool { program: String, message: String },
    #[error("sqlite {op}: {message}")]
    Sqlite { op: &'static str, message: String },
    /// The tern log refused an operation of a workload.
    #[error("log {op}: {source}")]
    Log {
        op: &'static str,
        source: tern_log::LogError,
    },
    /// The stress writer's data directory is locked by another process or cannot be created.
    #[error("data directory: {source}")]
    DataDir {
        source: tern_log::datadir::DataDirError,
    },
    /// A read of the bench's own log returned something else than what it wrote.
    #[error("read at offset {offset} of {end} {problem}")]
    ReadBack {
        offset: u64,
        end: u64,
        problem: &'static str,
    },
    /// A task or thread of a workload panicked or was cancelled.
    #[error("{what} failed: {reason}")]
    Task { what: &'static str, reason: String },
    /// The bench's child writer ended before it wrote what the workload needs.
    #[error("log writer stopped after {written} of {expected} bytes")]
    WriterStopped { written: u64, expected: u64 },
    /// A child process was started without the pipe the bench reads.
    #[error("{child} has no stdout")]
    NoStdout { child: &'static str },
    #[error("cannot align a {block}-byte write buffer")]
    Align { block: usize },
    /// Every repetition of a workload was skipped.
    #[error("no {workload} run completed")]
    NoRun { workload: &'static str },
    #[error("cannot render JSON: {source}")]
    Json { source: serde_json::Error },
    #[error(
        "no tern binary at {path} (build it with `cargo build --release -p tern`, or set TERN_BIN)"
    )]
    NoTernBinary { path: PathBuf },
    #[error(
        "no flush-delay library at {path} (build it with `cargo build --release -p tern-flush-delay`)"
    )]
    NoFlushDelayLibrary { path: PathBuf },
    /// The instruction-count plugin miscounted the known loop: no broker figure is trusted.
    #[error(
        "the QEMU plugin counted {counted} instructions of the known loop on {arch}, not {expected}"
    )]
    Inexact {
        arch: &'static str,
        expected: u64,
        counted: u64,
    },
    #[error("interrupted by a signal")]
    Interrupted,
    #[error("--broker {broker} is not a reachable HOST:PORT")]
    Resolve { broker: String },
    #[error("cannot start {broker} (is it installed?): {source}")]
    Spawn {
        broker: &'static str,
        source: std::io::Error,
    },
    #[error("{broker} did not start listening; its output:\n{output}")]
    Start {
        broker: &'static str,
        output: String,
    },
    #[error("cannot read memory figures from {path}")]
    Proc { path: String },
    #[error("the broker refused a bench client with CONNACK code {code}")]
    Refused { code: u8 },
    #[error("expected {wanted} from the broker, got {got}")]
    Unexpected { got: String, wanted: &'static str },
    #[error("the broker sent nothing for {after:?}")]
    Silent { after: Duration },
    #[error("the broker closed a bench connection")]
    Closed,
    #[error("the broker sent bytes that are not MQTT: {0}")]
    Mqtt(#[from] tern_shared::mqtt::DecodeError),
    #[error("cannot encode a bench MQTT packet: {0}")]
    Encode(#[from] tern_shared::mqtt::EncodeError),
    #[error(transparent)]
    Upstream(#[from] tern_upstream::UpstreamError),
    /// Forwarding did not reach the expected end offset in time.
    #[error("{topic} reached offset {got} of {expected} in {after:?}")]
    Stalled {
        topic: String,
        expected: u64,
        got: u64,
        after: Duration,
    },
    /// A bench waited in vain for its children to reach a state.
    #[error("{what}: not reached within {after:?}")]
    Waited { what: &'static str, after: Duration },
    #[error("{topic} holds {got} records, {expected} expected: forwarding duplicated records")]
    Count {
        topic: String,
        expected: u64,
        got: u64,
    },
}

impl BenchError {
    /// A failed file-system call on `path`.
    pub fn file(op: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        Self::File {
            op,
            path: path.to_owned(),
            source,
        }
    }

    /// A failed operation of the tern log.
    pub fn log(op: &'static str, source: tern_log::LogError) -> Self {
        Self::Log { op, source }
    }

    /// A task of a workload that panicked or was cancelled.
    pub fn task(what: &'static str, reason: impl std::fmt::Display) -> Self {
        Self::Task {
            what,
            reason: reason.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_what_failed() {
        let err = BenchError::Invalid {
            option: "--publishers",
            reason: "must be at least 1",
        };
        assert_eq!(err.to_string(), "--publishers must be at least 1");
        let err = BenchError::Io {
            what: "connecting a bench client",
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert!(
            err.to_string().starts_with("connecting a bench client: "),
            "{err}"
        );
        let err = BenchError::NoTernBinary {
            path: PathBuf::from("/x/tern"),
        };
        assert!(err.to_string().starts_with("no tern binary at /x/tern"));
        let err = BenchError::file(
            "mkdir",
            std::path::Path::new("/d"),
            std::io::Error::other("no"),
        );
        assert_eq!(err.to_string(), "mkdir /d: no");
    }
}
