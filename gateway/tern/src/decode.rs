//! Payload decoders for `tern log dump --decode NAME`: each turns a record's value into a JSON
//! object through a wire schema shared with the devices (`tern_shared`), so an operator reads
//! sensor readings instead of base64. The dump itself is tern-log's, which knows no device
//! schema: it calls these through its `ValueDecoder` trait.
//!
//! A decoder only adds to a dump line. It must never panic, skip a record or lose its bytes: a
//! value that does not decode keeps its raw `value` and gains a `decode_error` field.

use std::str::FromStr;

use serde_json::{Map, Value, json};
use tern_log::tools::ValueDecoder;
use tern_shared::Reading;

/// A schema `tern log dump --decode` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decoder {
    /// `tern_shared::Reading`: a version byte, then postcard. Printed as `"reading": {...}`.
    Reading,
}

/// `--decode` named a schema this build does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown decoder `{name}` (known: {known})")]
pub struct UnknownDecoder {
    pub name: String,
    pub known: &'static str,
}

impl Decoder {
    /// The `--decode` argument, also the JSON field the decoded value is printed as.
    pub fn name(self) -> &'static str {
        match self {
            Decoder::Reading => "reading",
        }
    }

    fn decode(self, value: &[u8]) -> Result<Value, String> {
        match self {
            Decoder::Reading => {
                let reading =
                    Reading::decode(value).map_err(|err| format!("not a reading: {err}"))?;
                serde_json::to_value(reading).map_err(|err| format!("reading as JSON: {err}"))
            }
        }
    }
}

impl ValueDecoder for Decoder {
    /// Rewrites one dump line: the decoded value replaces `value` and `value_encoding`, or, if
    /// `value` does not decode, a `decode_error` field joins the raw value.
    fn apply(&self, value: &[u8], line: &mut Map<String, Value>) {
        match self.decode(value) {
            Ok(decoded) => {
                line.remove("value");
                line.remove("value_encoding");
                line.insert(self.name().to_owned(), decoded);
            }
            Err(reason) => {
                line.insert("decode_error".to_owned(), json!(reason));
            }
        }
    }
}

impl FromStr for Decoder {
    type Err = UnknownDecoder;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "reading" => Ok(Decoder::Reading),
            _ => Err(UnknownDecoder {
                name: name.to_owned(),
                known: "reading",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use tern_shared::{READING_MAX_ENCODED_LEN, SensorValues};

    use super::*;

    fn line(value: &str) -> Map<String, Value> {
        let mut map = Map::new();
        map.insert("offset".to_owned(), json!(7));
        map.insert("value".to_owned(), json!(value));
        map.insert("value_encoding".to_owned(), json!("base64"));
        map
    }

    fn encoded() -> Vec<u8> {
        let reading = Reading {
            device_id: 1,
            sequence: 12,
            uptime_ms: 2_400,
            dropped: 0,
            values: SensorValues {
                temperature_centi_c: -40,
                humidity_centi_pct: 5000,
                supply_mv: 3300,
            },
        };
        let mut buf = [0u8; READING_MAX_ENCODED_LEN];
        reading
            .encode(&mut buf)
            .map(|b| b.to_vec())
            .unwrap_or_default()
    }

    #[test]
    fn a_reading_replaces_the_raw_value() {
        let mut map = line("AQ==");
        Decoder::Reading.apply(&encoded(), &mut map);
        assert_eq!(
            Value::Object(map),
            json!({
                "offset": 7,
                "reading": {
                    "device_id": 1,
                    "sequence": 12,
                    "uptime_ms": 2400,
                    "dropped": 0,
                    "values": {
                        "temperature_centi_c": -40,
                        "humidity_centi_pct": 5000,
                        "supply_mv": 3300
                    }
                }
            })
        );
    }

    #[test]
    fn a_value_that_does_not_decode_keeps_its_bytes_and_says_why() {
        for (value, reason) in [
            (
                &b"halt"[..],
                "not a reading: unsupported reading version 104",
            ),
            (&b""[..], "not a reading: empty payload"),
            (
                &[1, 1][..],
                "not a reading: malformed reading body (1 bytes",
            ),
        ] {
            let mut map = line("raw");
            Decoder::Reading.apply(value, &mut map);
            assert_eq!(map.get("value"), Some(&json!("raw")));
            assert_eq!(map.get("value_encoding"), Some(&json!("base64")));
            assert!(!map.contains_key("reading"));
            let error = map.get("decode_error").and_then(Value::as_str);
            assert!(
                error.is_some_and(|e| e.starts_with(reason)),
                "{value:?}: {error:?}"
            );
        }
    }

    #[test]
    fn trailing_bytes_are_a_decode_error() {
        let mut value = encoded();
        value.push(0);
        let mut map = line("raw");
        Decoder::Reading.apply(&value, &mut map);
        assert_eq!(
            map.get("decode_error"),
            Some(&json!("not a reading: 1 trailing bytes after the reading"))
        );
    }

    #[test]
    fn decoder_names_parse_and_unknown_ones_are_listed() {
        assert_eq!("reading".parse::<Decoder>(), Ok(Decoder::Reading));
        assert_eq!(Decoder::Reading.name(), "reading");
        let err = "json".parse::<Decoder>().map(Decoder::name);
        assert_eq!(
            err.map_err(|e| e.to_string()),
            Err("unknown decoder `json` (known: reading)".to_owned())
        );
    }
}
