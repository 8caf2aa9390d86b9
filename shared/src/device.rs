//! What a sensor device keeps between samples: the bounded backlog of readings the gateway has
//! not acknowledged yet, and the simulated sensor that produces readings under QEMU.
//!
//! Both live here rather than in the firmware so they are tested on the host. The backlog owns
//! the drop-oldest policy and the drop counter; it must never grow past its fixed capacity nor
//! lose a reading without counting it. The simulator must stay a pure function of the device id
//! and the sequence number, so a test can recompute every value it sent.

use crate::reading::{Reading, SensorValues};

/// Readings sampled but not yet acknowledged, oldest first, at most `N` of them.
#[derive(Debug, Default)]
pub struct Backlog<const N: usize> {
    queue: heapless::Deque<Reading, N>,
    dropped: u32,
    next_sequence: u32,
}

impl<const N: usize> Backlog<N> {
    pub const fn new() -> Self {
        Backlog {
            queue: heapless::Deque::new(),
            dropped: 0,
            next_sequence: 0,
        }
    }

    /// Takes the next sample into the backlog. When the backlog is full the oldest reading is
    /// dropped (and counted) to make room; the new reading carries the updated drop count.
    pub fn record(&mut self, device_id: u32, uptime_ms: u64, values: SensorValues) -> Reading {
        if self.queue.is_full() && self.queue.pop_front().is_some() {
            self.dropped = self.dropped.saturating_add(1);
        }
        let reading = Reading {
            device_id,
            sequence: self.next_sequence,
            uptime_ms,
            dropped: self.dropped,
            values,
        };
        self.next_sequence = self.next_sequence.wrapping_add(1);
        // Cannot fail: a slot was freed above if the queue was full (and N > 0).
        let _ = self.queue.push_back(reading);
        reading
    }

    /// The oldest unacknowledged reading: the next one to (re)send.
    pub fn oldest(&self) -> Option<&Reading> {
        self.queue.front()
    }

    /// Forgets the oldest reading once the gateway acknowledged it.
    pub fn acknowledge_oldest(&mut self) -> Option<Reading> {
        self.queue.pop_front()
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The sequence number the next recorded reading gets.
    pub fn next_sequence(&self) -> u32 {
        self.next_sequence
    }

    /// How many readings were dropped because the backlog was full.
    pub fn dropped(&self) -> u32 {
        self.dropped
    }
}

/// The simulated sensor: slow triangle waves whose phase, offset and noise are seeded by the
/// device id, so two devices differ and one device always repeats itself.
pub fn simulate(device_id: u32, sequence: u32) -> SensorValues {
    let seed = mix(device_id);
    let noise = mix(seed ^ sequence);
    let temperature = 1800 + (seed % 600) as i32 + triangle(sequence.wrapping_add(seed), 64) * 8
        - 256
        + (noise % 21) as i32
        - 10;
    let humidity =
        3500 + (seed % 1500) as i32 + triangle(sequence.wrapping_add(seed >> 8), 96) * 10;
    let supply = 3300 - ((sequence / 32) % 300) as i32 + (noise % 5) as i32;
    SensorValues {
        temperature_centi_c: clamp_i16(temperature),
        humidity_centi_pct: clamp_u16(humidity),
        supply_mv: clamp_u16(supply),
    }
}

/// A triangle wave over `period` steps, from 0 up to `period / 2` and back.
fn triangle(step: u32, period: u32) -> i32 {
    let phase = step % period;
    let half = period / 2;
    (if phase < half { phase } else { period - phase }) as i32
}

/// A 32-bit integer hash (the "lowbias32" finaliser): cheap, deterministic, well mixed.
fn mix(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

fn clamp_i16(value: i32) -> i16 {
    value.clamp(i32::from(i16::MIN), i32::from(i16::MAX)) as i16
}

fn clamp_u16(value: i32) -> u16 {
    value.clamp(0, i32::from(u16::MAX)) as u16
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;

    fn values() -> SensorValues {
        simulate(7, 0)
    }

    #[test]
    fn full_backlog_drops_the_oldest_and_counts_it() {
        let mut backlog = Backlog::<3>::new();
        for uptime in 0..5 {
            backlog.record(7, uptime, values());
        }
        assert_eq!(backlog.dropped(), 2);
        assert_eq!(backlog.len(), 3);
        let kept: Vec<u32> = std::iter::from_fn(|| backlog.acknowledge_oldest())
            .map(|r| r.sequence)
            .collect();
        assert_eq!(kept, vec![2, 3, 4]);
    }

    #[test]
    fn readings_carry_the_drop_count_at_their_sampling() {
        let mut backlog = Backlog::<1>::new();
        assert_eq!(backlog.record(7, 0, values()).dropped, 0);
        assert_eq!(backlog.record(7, 1, values()).dropped, 1);
        assert_eq!(backlog.oldest().map(|r| r.sequence), Some(1));
    }

    #[test]
    fn simulation_is_deterministic_and_seeded_by_device() {
        assert_eq!(simulate(7, 42), simulate(7, 42));
        let a: Vec<_> = (0..16).map(|s| simulate(7, s)).collect();
        let b: Vec<_> = (0..16).map(|s| simulate(8, s)).collect();
        assert_ne!(a, b);
        for v in a {
            assert!((1000..3500).contains(&v.temperature_centi_c), "{v:?}");
            assert!((3000..=6000).contains(&v.humidity_centi_pct), "{v:?}");
            assert!((2900..=3310).contains(&v.supply_mv), "{v:?}");
        }
    }

    /// One step of the model test: sample, or acknowledge the oldest.
    #[derive(Debug, Clone)]
    enum Op {
        Record,
        Acknowledge,
    }

    proptest! {
        #[test]
        fn backlog_matches_a_drop_oldest_model(ops in proptest::collection::vec(
            prop_oneof![Just(Op::Record), Just(Op::Acknowledge)], 0..200)
        ) {
            let mut backlog = Backlog::<8>::new();
            let mut model: VecDeque<u32> = VecDeque::new();
            let (mut next, mut dropped) = (0u32, 0u32);
            for op in ops {
                match op {
                    Op::Record => {
                        if model.len() == 8 {
                            model.pop_front();
                            dropped += 1;
                        }
                        model.push_back(next);
                        next += 1;
                        let r = backlog.record(1, 0, values());
                        prop_assert_eq!(r.dropped, dropped);
                    }
                    Op::Acknowledge => {
                        let got = backlog.acknowledge_oldest().map(|r| r.sequence);
                        prop_assert_eq!(got, model.pop_front());
                    }
                }
                prop_assert_eq!(backlog.len(), model.len());
                prop_assert_eq!(backlog.oldest().map(|r| r.sequence), model.front().copied());
            }
        }
    }
}
