//! The reading schema from the gateway's side: payloads decode through `Reading::decode`, print
//! as JSON (what `tern log dump --decode reading` shows), and unknown versions are typed errors.

use tern_shared::{DecodeError, READING_MAX_ENCODED_LEN, Reading, SensorValues};

fn reading() -> Reading {
    Reading {
        device_id: 2,
        sequence: 41,
        uptime_ms: 8_200,
        dropped: 3,
        values: SensorValues {
            temperature_centi_c: 2150,
            humidity_centi_pct: 4520,
            supply_mv: 3290,
        },
    }
}

#[test]
fn decoded_reading_prints_as_json() {
    let mut buf = [0u8; READING_MAX_ENCODED_LEN];
    let payload = reading().encode(&mut buf).expect("fits").to_vec();
    let decoded = Reading::decode(&payload).expect("decodes");
    let json = serde_json::to_value(decoded).expect("serializes");
    assert_eq!(
        json,
        serde_json::json!({
            "device_id": 2,
            "sequence": 41,
            "uptime_ms": 8200,
            "dropped": 3,
            "values": {
                "temperature_centi_c": 2150,
                "humidity_centi_pct": 4520,
                "supply_mv": 3290
            }
        })
    );
}

#[test]
fn unknown_version_is_a_clear_error() {
    let err = Reading::decode(&[9, 2, 41]).expect_err("version 9 is unknown");
    assert_eq!(
        err,
        DecodeError::UnsupportedVersion {
            found: 9,
            supported: 1
        }
    );
    assert_eq!(
        err.to_string(),
        "unsupported reading version 9 (this build reads version 1)"
    );
    let boxed: Box<dyn std::error::Error> = Box::new(err);
    assert!(boxed.source().is_none());
}
