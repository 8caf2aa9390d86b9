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
//! The sign, a causal one: a window held open on an idle device (no fdatasync running, so the
//! first append is the only one outstanding) right after an answer, whose appends all came
//! soon after that answer and which then stayed quiet for at least [`QUIET_RATIO`] times as
//! long (and at least [`QUIET_MIN`]). After [`STREAK`] such windows in a row the producer is
//! called closed-loop and its commits get no window (what the wear controller allows:
//! `wear.rs`). Only a window can show the sign again, so after every [`PROBE`] of its
//! commits the next one on an idle device keeps its window and looks anew: a window without
//! the sign ends it, and so does a pause of [`IDLE_GAP`] after an answer (the producer
//! stopped). A producer's own delay before it sends again (a client's linger, a few ms) is
//! allowed for by the ratio. A trickle of rate λ shows the sign in a window of length W only
//! when its first append comes within W/3 of the answer and nothing else for the rest of the
//! window: (1 − e^(−λW/3))·e^(−λW) at most, about 0.1 at its worst (λW ≈ 1), so eight in a
//! row is about one in 10^8 windows, and such a streak ends at the next probe.
//!
//! Pure bookkeeping on tokio's clock (the unit tests pause it); never blocks.

use std::time::Duration;

use tokio::time::Instant;

/// A held window shows the sign only if it stayed quiet after its last append at least this
/// many times as long as that append came after the previous answer.
pub const QUIET_RATIO: u32 = 3;
/// ... and at least this long.
pub const QUIET_MIN: Duration = Duration::from_millis(10);
/// A closed-loop producer that sends nothing for this long after an answer has stopped.
pub const IDLE_GAP: Duration = Duration::from_secs(1);
/// Windows in a row that must show the sign before they are dropped.
pub const STREAK: u32 = 8;
/// After this many of a closed-loop producer's commits, the next on an idle device keeps its
/// window to look again.
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
        let since_answer = self
            .answered
            .map(|answered| now.saturating_duration_since(answered));
        if self.closed_loop() && since_answer.is_none_or(|gap| gap > IDLE_GAP) {
            self.streak = 0;
        }
        let held = if self.closed_loop() {
            self.since_probe = self.since_probe.saturating_add(1);
            let probe = self.since_probe >= PROBE && idle;
            if probe {
                self.since_probe = 0;
            }
            probe
        } else {
            self.since_probe = 0;
            true
        };
        // Only a held window on an idle device after an answer can show the sign.
        self.open = Some((now, held && idle && since_answer.is_some()));
        held
    }

    /// The commit's window closed now; its last append arrived at `last_arrival`.
    pub fn closes(&mut self, last_arrival: Instant) {
        let Some((_, looked)) = self.open.take() else {
            return;
        };
        let Some(answered) = self.answered.filter(|_| looked) else {
            if !looked && !self.closed_loop() {
                self.streak = 0;
            }
            return;
        };
        let spread = last_arrival.saturating_duration_since(answered);
        let quiet = Instant::now().saturating_duration_since(last_arrival);
        let sign = quiet >= QUIET_MIN && quiet >= spread * QUIET_RATIO;
        self.streak = if sign {
            self.streak.saturating_add(1)
        } else {
            0
        };
    }
}

#[cfg(test)]
mod tests;
