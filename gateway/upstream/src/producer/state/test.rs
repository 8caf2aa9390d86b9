//! The producer state's codec, its files per cluster, and the power-cut sweep: identities
//! stored again and again on the power-cut simulator (`FaultyFs`), the power cut at a seeded
//! operation with each crash mode, then the state read back must be the last acknowledged
//! identity or the newer one being stored, never an older, damaged or missing one. The same
//! check run on a deliberately broken store (written in place) must catch it losing the
//! acknowledged identity: the negative control.

use std::sync::Arc;

use proptest::prelude::*;
use tern_core::fs::{CrashMode, FaultyFs, Fs, RealFs};

use super::*;

fn identity() -> Identity {
    Identity {
        cluster_id: "MkU3OEVBNTcwNTJENDM2Qk".into(),
        producer_id: 4711,
        epoch: 3,
    }
}

#[test]
fn an_identity_round_trips_and_every_damage_is_refused() {
    let encoded = identity().encode();
    assert_eq!(Identity::decode(&encoded), Ok(identity()));
    for cut in 0..encoded.len() {
        assert!(Identity::decode(&encoded[..cut]).is_err(), "cut at {cut}");
    }
    for i in 0..encoded.len() {
        let mut flipped = encoded.clone();
        flipped[i] ^= 0x10;
        assert!(Identity::decode(&flipped).is_err(), "flip at {i}");
    }
}

#[test]
fn stored_identities_are_found_again_per_cluster() -> std::io::Result<()> {
    let dir = std::env::temp_dir().join(format!("tern-producer-state-{}", std::process::id()));
    let state = StateDir::new(Arc::new(RealFs), dir.clone());
    state.store(&identity())?;
    assert_eq!(state.load(&identity().cluster_id), Some(identity()));
    assert_eq!(state.load("another-cluster"), None);
    state.forget(&identity().cluster_id);
    assert_eq!(state.load(&identity().cluster_id), None);
    std::fs::remove_dir_all(&dir)
}

#[test]
fn a_damaged_state_file_is_an_error_to_read_and_ignored_by_load() {
    let fs = FaultyFs::new(1);
    let state = StateDir::new(Arc::new(fs.clone()), "/data/upstream".into());
    state.store(&identity()).expect("stored");
    fs.corrupt(&state.path(&identity().cluster_id), 9)
        .expect("corrupt");
    let read = state.read(&identity().cluster_id);
    assert!(
        matches!(read, Err(StateFileError::Decode { .. })),
        "{read:?}"
    );
    assert_eq!(state.load(&identity().cluster_id), None);
}

proptest! {
    #[test]
    fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = Identity::decode(&bytes);
    }

    #[test]
    fn any_identity_round_trips(id in "[A-Za-z0-9_-]{0,30}", pid in any::<i64>(), epoch in any::<i16>()) {
        let identity = Identity { cluster_id: id, producer_id: pid, epoch };
        prop_assert_eq!(Identity::decode(&identity.encode()), Ok(identity));
    }
}

/// Seeds of the sweep (a third per crash mode).
const SWEEP_RUNS: u64 = 1_500;
/// Identities each run stores, one after the other.
const STORES: u64 = 6;
const DIR: &str = "/data/upstream";

/// The `n`th identity a run stores: a new epoch each time, and a cluster id whose length
/// changes, so a mix of two files shows in the length as well as the checksum.
fn nth(n: u64) -> Identity {
    Identity {
        cluster_id: "MkU3OEVBNTcwNTJENDM2Qk".into(),
        producer_id: 1_000 + i64::try_from(n).unwrap_or(i64::MAX),
        epoch: i16::try_from(n).unwrap_or(i16::MAX),
    }
}

/// A store: the real one, or the negative control's.
type Store = fn(&FaultyFs, &StateDir, &Identity) -> std::io::Result<()>;

fn real_store(_: &FaultyFs, state: &StateDir, identity: &Identity) -> std::io::Result<()> {
    state.store(identity)
}

/// The negative control: the state file rewritten in place and fdatasync'd (the name made
/// durable when it is new), without a temporary file and rename. A power cut between the write
/// and its sync can leave a torn or flipped mix of the old and the new identity.
fn in_place_store(fs: &FaultyFs, state: &StateDir, identity: &Identity) -> std::io::Result<()> {
    let path = state.path(&identity.cluster_id);
    fs.create_dir_all(Path::new(DIR))?;
    let file = if fs.exists(&path) {
        fs.open_write(&path)?
    } else {
        let file = fs.create(&path)?;
        fs.sync_dir(Path::new(DIR))?;
        file
    };
    let bytes = identity.encode();
    file.write_at(0, &bytes)?;
    file.set_len(bytes.len() as u64)?;
    file.sync_data()
}

/// What one run stored before the power went.
#[derive(Debug, Default)]
struct Outcome {
    /// The last store that returned Ok.
    acked: Option<u64>,
    /// The last store begun (it may have failed).
    attempted: Option<u64>,
}

fn store_until_power_cut(fs: &FaultyFs, state: &StateDir, store: Store) -> Outcome {
    let mut outcome = Outcome::default();
    for n in 0..STORES {
        outcome.attempted = Some(n);
        if store(fs, state, &nth(n)).is_err() {
            break;
        }
        outcome.acked = Some(n);
    }
    outcome
}

/// Checks what the state file holds after the crash: the last acknowledged identity or the
/// newer one being stored (or nothing before the first acknowledgement), never an error or an
/// older identity. Returns which one it found.
fn check(state: &StateDir, outcome: &Outcome) -> Result<Found, String> {
    let found = state
        .read(&nth(0).cluster_id)
        .map_err(|err| format!("acked {:?}: {err}", outcome.acked))?;
    let attempted = outcome.attempted.map(nth);
    match (found, outcome.acked) {
        (None, None) => Ok(Found::Nothing),
        (Some(found), acked)
            if Some(&found) == attempted.as_ref() && acked != outcome.attempted =>
        {
            Ok(Found::Attempted)
        }
        (Some(found), Some(acked)) if found == nth(acked) => Ok(Found::Acked),
        (found, acked) => Err(format!(
            "acked {acked:?}, attempted {:?}, found {found:?}",
            outcome.attempted
        )),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    Nothing,
    Acked,
    Attempted,
}

fn seeds(runs: u64) -> std::ops::Range<u64> {
    match std::env::var("TERN_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => seed..seed + 1,
        None => 0..runs,
    }
}

fn mode_of(seed: u64) -> CrashMode {
    match seed % 3 {
        0 => CrashMode::DropUnsynced,
        1 => CrashMode::TearLastWrite,
        _ => CrashMode::FlipBit,
    }
}

/// One seeded run's result, with its disk after the reboot.
struct Run {
    fs: FaultyFs,
    state: StateDir,
    outcome: Outcome,
    checked: Result<Found, String>,
    cut: bool,
}

/// One seeded run: store until the power is cut at a random operation, crash, check.
fn run(seed: u64, store: Store) -> Run {
    let full_ops = {
        let fs = FaultyFs::new(seed);
        let state = StateDir::new(Arc::new(fs.clone()), DIR.into());
        store_until_power_cut(&fs, &state, store);
        fs.ops()
    };
    let fs = FaultyFs::new(seed);
    let state = StateDir::new(Arc::new(fs.clone()), DIR.into());
    fs.fail_after(fs.random(full_ops + 1));
    let outcome = store_until_power_cut(&fs, &state, store);
    let cut = fs.power_failed();
    fs.crash(mode_of(seed));
    let checked = check(&state, &outcome);
    Run {
        fs,
        state,
        outcome,
        checked,
        cut,
    }
}

#[test]
fn power_cuts_never_lose_or_damage_an_acknowledged_producer_state() {
    let runs = seeds(SWEEP_RUNS);
    eprintln!(
        "producer state sweep: seeds {}..{} (TERN_TEST_SEED=N replays one)",
        runs.start, runs.end
    );
    let (mut cut, mut acked, mut attempted, mut nothing) = (0, 0, 0, 0);
    for seed in runs.clone() {
        let run = run(seed, real_store);
        let found = run.checked.unwrap_or_else(|err| {
            panic!(
                "seed {seed} ({:?}): {err} (TERN_TEST_SEED={seed} replays)",
                mode_of(seed)
            )
        });
        cut += u64::from(run.cut);
        match found {
            Found::Acked => acked += 1,
            Found::Attempted => attempted += 1,
            Found::Nothing => nothing += 1,
        }
        // After the reboot the state is stored again (a leftover temporary file is no
        // obstacle) and read back.
        assert!(
            run.outcome.attempted.is_some(),
            "seed {seed}: a store was begun"
        );
        run.state.store(&nth(99)).expect("stored after the crash");
        let again = run.state.read(&nth(99).cluster_id).ok().flatten();
        assert_eq!(again, Some(nth(99)), "seed {seed}");
        assert!(!run.fs.power_failed(), "seed {seed}: the power is back");
    }
    eprintln!(
        "producer state sweep: {} runs, {cut} cut before the end; after the crash {acked} held the last acknowledged identity, {attempted} the newer one being stored, {nothing} none (cut before the first acknowledgement)",
        runs.end - runs.start
    );
    assert!(
        cut > 0 || runs.end - runs.start == 1,
        "the sweep cut the power"
    );
}

#[test]
fn the_sweep_catches_a_state_written_in_place() {
    let runs = seeds(SWEEP_RUNS);
    let mut caught = 0;
    for seed in runs.clone() {
        let run = run(seed, in_place_store);
        // Only a lost or damaged acknowledged identity counts.
        if let (Err(err), Some(_)) = (run.checked, run.outcome.acked) {
            if caught == 0 {
                eprintln!("negative control, seed {seed} ({:?}): {err}", mode_of(seed));
            }
            caught += 1;
        }
    }
    eprintln!(
        "negative control: the in-place store lost or damaged the acknowledged identity in {caught} of {} runs",
        runs.end - runs.start
    );
    assert!(
        caught > 0 || runs.end - runs.start == 1,
        "the check never caught the in-place store"
    );
}
