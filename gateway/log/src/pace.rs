//! Tells a closed-loop producer from a trickle, for one partition's writer.
//!
//! A closed-loop producer sends its next append only once the last one is answered (a Kafka
//! client with one request in flight, an MQTT device resending its backlog one QoS 1 publish
//! at a time, a request/response application). A commit window buys nothing from it: nothing
//! more arrives while it waits, so the window only slows the producer down, and the slower
//! arrival rate then made the wear controller's window longer still (issue 24: franz-go's
//! TestClient_Produce took 345-400 s on tern against 7-10 s on Kafka). A trickle's appends
//! arrive whenever their sources have one, whatever the commits do: the window is for it.
//!
//! The sign, a causal one: a window held open on an idle device right after an answer, in which
//! every append arrived within [`ANSWER_GAP`] of that answer and nothing in the rest of the
//! window. After [`STREAK`] such commits in a row the producer is called closed-loop and its
//! commits get no window (what the wear controller allows: `wear.rs`); every [`PROBE`]th of
//! them keeps the window again and looks anew, and so does any commit that does not open right
//! after an answer on an idle device. A trickle of rate λ shows the sign in a window of length
//! W only when nothing arrives for W − ANSWER_GAP: e^(−λ(W − 5 ms)), about e^(−8) at 100
//! appends a second and a 86 ms window, so never eight times in a row.
//!
//! Pure bookkeeping on tokio's clock (the unit tests pause it); never blocks.

use std::time::Duration;

use tokio::time::Instant;

/// How soon after an answer a closed-loop producer's next append reaches the writer: its
/// round trip through the answering task, the socket and the client (well under a millisecond
/// on loopback, a few on a loaded machine).
pub const ANSWER_GAP: Duration = Duration::from_millis(5);
/// Windows in a row that must show the sign before they are dropped.
pub const STREAK: u32 = 8;
/// Of a closed-loop producer's commits, every this many keeps its window to look again.
pub const PROBE: u32 = 64;

/// One writer's record of how its commits were opened.
#[derive(Debug, Default)]
pub struct Pace {
    /// When the last commit's appends were answered.
    answered: Option<Instant>,
    /// Windows in a row that showed the sign; closed-loop from [`STREAK`] on.
    streak: u32,
    /// Commits since the last probe, while closed-loop.
    since_probe: u32,
    /// The window open now: when, and whether it is held (looked at when it closes).
    open: Option<(Instant, bool)>,
}

impl Pace {
    /// Whether the producer is called closed-loop now.
    pub fn closed_loop(&self) -> bool {
        self.streak >= STREAK
    }

    /// A commit's appends were answered now.
    pub fn answered(&mut self) {
        self.answered = Some(Instant::now());
    }

    /// A commit opens now with its first append; `idle`: no fdatasync runs, so that append is
    /// the only one outstanding. Whether the commit gets a window (false: commit at once).
    pub fn opens(&mut self, idle: bool) -> bool {
        let now = Instant::now();
        let prompt = idle && self.within_gap(now);
        if !prompt {
            self.streak = 0;
        }
        let held = if self.closed_loop() {
            self.since_probe += 1;
            self.since_probe % PROBE == 0
        } else {
            self.since_probe = 0;
            true
        };
        // Only a held window that opened promptly can show the sign.
        self.open = Some((now, held && prompt));
        held
    }

    /// The commit's window closed; its last append arrived at `last_arrival`.
    pub fn closes(&mut self, last_arrival: Instant) {
        let Some((opened, looked)) = self.open.take() else {
            return;
        };
        if !looked {
            return;
        }
        let held_long_enough = Instant::now().saturating_duration_since(opened) >= 2 * ANSWER_GAP;
        if !held_long_enough {
            // The window told nothing (a commit closed by min_bytes, or a short min_delay).
            return;
        }
        if self.within_gap(last_arrival) {
            self.streak = self.streak.saturating_add(1);
        } else {
            self.streak = 0;
        }
    }

    fn within_gap(&self, at: Instant) -> bool {
        self.answered
            .is_some_and(|answered| at.saturating_duration_since(answered) <= ANSWER_GAP)
    }
}

#[cfg(test)]
mod tests;
