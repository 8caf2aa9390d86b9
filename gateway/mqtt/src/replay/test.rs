//! The `tern-start` parser (examples, refusals, and property tests: total on any input, and
//! the canonical form reads back to the same start) and resolution over the in-memory log.

use proptest::prelude::*;

use super::*;
use tern_log::{MemoryLog, Record};

const NOW: i64 = 1_764_608_400_000; // 2025-12-01T17:00:00Z

fn offsets(items: &[(Option<&str>, u32, u64)]) -> Start {
    Start::Offsets(
        items
            .iter()
            .map(|(topic, partition, offset)| OffsetAt {
                topic: topic.map(str::to_owned),
                partition: *partition,
                offset: *offset,
            })
            .collect(),
    )
}

#[test]
fn every_documented_form_parses() {
    let cases = [
        ("earliest", Start::Earliest),
        ("latest", Start::Latest),
        ("offset:0=120", offsets(&[(None, 0, 120)])),
        (
            "offset:0=5,1=7,hist.v2/3=0",
            offsets(&[(None, 0, 5), (None, 1, 7), (Some("hist.v2"), 3, 0)]),
        ),
        ("time:1764608400000", Start::Time(NOW)),
        ("time:2025-12-01T17:00:00Z", Start::Time(NOW)),
        ("time:2025-12-01T17:00:00.250Z", Start::Time(NOW + 250)),
        ("time:2025-12-01 17:00:00", Start::Time(NOW)),
        ("time:-15m", Start::Time(NOW - 15 * 60_000)),
        ("time:-1h 30m", Start::Time(NOW - 90 * 60_000)),
    ];
    for (text, want) in cases {
        assert_eq!(parse(text, NOW), Ok(want), "{text}");
    }
}

#[test]
fn bad_values_are_refused_with_a_reason() {
    let cases = [
        ("", "expected earliest"),
        ("EARLIEST", "expected earliest"),
        ("offset:", "offset item \"\""),
        ("offset:0=", "offset item \"0=\""),
        ("offset:a=1", "offset item"),
        ("offset:0=-1", "offset item"),
        ("offset:0=+1", "offset item"),
        ("offset:bad topic/0=1", "offset item"),
        ("offset:0=99999999999999999999", "offset item"),
        ("offset:0=1,0=2", "twice"),
        ("time:", "time \"\""),
        ("time:yesterday", "RFC 3339"),
        ("time:2025-13-01T00:00:00Z", "RFC 3339"),
        ("time:-forever", "RFC 3339"),
        ("time:1969-12-31T23:59:59Z", "RFC 3339"),
    ];
    for (text, says) in cases {
        let err = parse(text, NOW).expect_err(text);
        assert!(err.to_string().contains(says), "{text}: {err}");
        assert!(err.to_string().starts_with(PROPERTY), "{text}: {err}");
    }
    let many: Vec<String> = (0..=MAX_OFFSETS).map(|i| format!("{i}=0")).collect();
    let many = format!("offset:{}", many.join(","));
    assert_eq!(parse(&many, NOW), Err(StartError::TooMany));
    let long = "x".repeat(10_000);
    assert!(parse(&long, NOW).expect_err("long").to_string().len() < 400);
}

#[test]
fn only_the_tern_start_property_counts_and_only_once() {
    let props = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    assert_eq!(from_properties(&props(&[("app", "x")]), NOW), Ok(None));
    let one = props(&[("app", "x"), (PROPERTY, "earliest")]);
    assert_eq!(from_properties(&one, NOW), Ok(Some(Start::Earliest)));
    let two = props(&[(PROPERTY, "earliest"), (PROPERTY, "latest")]);
    assert_eq!(from_properties(&two, NOW), Err(StartError::Repeated));
}

async fn log_with(records: &[i64]) -> MemoryLog {
    let log = MemoryLog::new(2);
    log.ensure_topic("t").expect("topic");
    for ts in records {
        let record = Record {
            key: None,
            value: b"v".to_vec().into(),
            headers: tern_log::Headers::new(),
            timestamp_ms: *ts,
        };
        log.append("t", 0, vec![record]).await.expect("append");
    }
    log
}

#[tokio::test]
async fn starts_resolve_per_partition() {
    let log = log_with(&[100, 200, 300, 400]).await;
    let parts = [("t".to_owned(), 0), ("t".to_owned(), 1)];
    let at = |start: &Start| resolve(start, &log, &parts).map(|m| m.into_values().collect());
    assert_eq!(at(&Start::Earliest), Ok(vec![0, 0]));
    assert_eq!(at(&Start::Latest), Ok(vec![4, 0]));
    assert_eq!(at(&Start::Time(250)), Ok(vec![2, 0]));
    assert_eq!(at(&Start::Time(200)), Ok(vec![1, 0]));
    assert_eq!(
        at(&Start::Time(401)),
        Ok(vec![4, 0]),
        "nothing that new yet"
    );
    assert_eq!(at(&offsets(&[(None, 0, 3)])), Ok(vec![3, 0]));
    assert_eq!(at(&offsets(&[(Some("t"), 1, 0)])), Ok(vec![4, 0]));
    assert_eq!(
        at(&offsets(&[(None, 0, 4)])),
        Ok(vec![4, 0]),
        "the end is fine"
    );
    let past = at(&offsets(&[(None, 0, 5)])).expect_err("past the end");
    assert!(past.to_string().contains("past the end 4 of t/0"), "{past}");
    let other = at(&offsets(&[(Some("u"), 0, 1)])).expect_err("not read");
    assert!(other.to_string().contains("partition u/0"), "{other}");
    let missing = at(&offsets(&[(None, 2, 1)])).expect_err("no such partition");
    assert!(missing.to_string().contains("partition 2"), "{missing}");
}

fn start_strategy() -> impl Strategy<Value = Start> {
    let topic = proptest::option::of("[A-Za-z0-9._-]{1,12}");
    let item =
        (topic, any::<u32>(), any::<u64>()).prop_map(|(topic, partition, offset)| OffsetAt {
            topic,
            partition,
            offset,
        });
    prop_oneof![
        Just(Start::Earliest),
        Just(Start::Latest),
        any::<i64>().prop_map(|ms| Start::Time(ms.max(0))),
        proptest::collection::vec(item, 1..8).prop_map(|mut items| {
            let mut seen = BTreeSet::new();
            items.retain(|at| seen.insert((at.topic.clone(), at.partition)));
            Start::Offsets(items)
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_text_is_a_start_or_a_reason(text in any::<String>()) {
        match parse(&text, NOW) {
            Ok(start) => prop_assert_eq!(parse(&start.to_string(), NOW), Ok(start)),
            Err(err) => prop_assert!(err.to_string().len() < 600),
        }
    }

    #[test]
    fn near_misses_never_panic(
        prefix in prop_oneof![Just("offset:"), Just("time:"), Just("time:-"), Just("")],
        body in "[0-9a-z=,/:._ +-]{0,40}",
    ) {
        let text = format!("{prefix}{body}");
        if let Ok(start) = parse(&text, NOW) {
            prop_assert_eq!(parse(&start.to_string(), NOW), Ok(start));
        }
    }

    #[test]
    fn the_canonical_form_reads_back(start in start_strategy()) {
        prop_assert_eq!(parse(&start.to_string(), NOW), Ok(start));
    }
}
