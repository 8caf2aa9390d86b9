//! The sensor reading: what a device publishes to `sensors/{device_id}/reading`, and how it is
//! laid out on the wire (one version byte, then the postcard encoding of [`Reading`]).
//!
//! This module owns the encoding and its version check. It must never accept a payload whose
//! version byte it does not know: an unknown version is a typed [`DecodeError`], never a guess.

use serde::{Deserialize, Serialize};

/// Wire version of [`Reading`]; the first byte of every encoded reading.
pub const READING_VERSION: u8 = 1;

/// Largest encoding of any [`Reading`]: the version byte plus postcard's worst-case varints
/// (5 bytes per `u32`, 10 per `u64`, 3 per 16-bit value).
pub const READING_MAX_ENCODED_LEN: usize = 1 + 5 + 5 + 10 + 5 + 3 + 3 + 3;

/// One sample of a device's sensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Reading {
    /// The device's identity; also the `{device_id}` in its topic.
    pub device_id: u32,
    /// Counts up by one per sample from 0 at boot; a gap means the device dropped readings.
    pub sequence: u32,
    /// Milliseconds since the device booted when the sample was taken.
    pub uptime_ms: u64,
    /// How many readings the device had to drop so far because its unacknowledged ring was full.
    pub dropped: u32,
    /// The measured values.
    pub values: SensorValues,
}

/// The typed values of one sample, in fixed-point units so no float crosses the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SensorValues {
    /// Temperature in hundredths of a degree Celsius (2150 = 21.50 °C).
    pub temperature_centi_c: i16,
    /// Relative humidity in hundredths of a percent (4520 = 45.20 %).
    pub humidity_centi_pct: u16,
    /// Supply voltage in millivolts.
    pub supply_mv: u16,
}

/// Why a payload is not a [`Reading`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum DecodeError {
    /// The payload has no bytes at all, so not even a version.
    #[error("empty payload: a reading starts with a version byte")]
    Empty,
    /// The version byte names an encoding this build does not know.
    #[error("unsupported reading version {found} (this build reads version {supported})")]
    UnsupportedVersion { found: u8, supported: u8 },
    /// The body after the version byte is not a valid postcard `Reading`.
    #[error("malformed reading body ({len} bytes after the version byte)")]
    Malformed { len: usize },
    /// A valid reading is followed by bytes that belong to nothing.
    #[error("{count} trailing bytes after the reading")]
    TrailingBytes { count: usize },
}

/// Why a [`Reading`] could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum EncodeError {
    /// The output buffer is shorter than the encoding.
    #[error("output buffer of {capacity} bytes is too small for a reading")]
    BufferTooSmall { capacity: usize },
}

impl Reading {
    /// Encodes the version byte and the reading into `out`, returning the bytes written.
    /// A buffer of [`READING_MAX_ENCODED_LEN`] bytes always suffices.
    pub fn encode<'a>(&self, out: &'a mut [u8]) -> Result<&'a mut [u8], EncodeError> {
        let capacity = out.len();
        let Some((version, body)) = out.split_first_mut() else {
            return Err(EncodeError::BufferTooSmall { capacity });
        };
        *version = READING_VERSION;
        let body_len = postcard::to_slice(self, body)
            .map_err(|_| EncodeError::BufferTooSmall { capacity })?
            .len();
        out.get_mut(..1 + body_len)
            .ok_or(EncodeError::BufferTooSmall { capacity })
    }

    /// Decodes a payload produced by [`Reading::encode`], checking its version byte first.
    pub fn decode(payload: &[u8]) -> Result<Reading, DecodeError> {
        let (&version, body) = payload.split_first().ok_or(DecodeError::Empty)?;
        if version != READING_VERSION {
            return Err(DecodeError::UnsupportedVersion {
                found: version,
                supported: READING_VERSION,
            });
        }
        let (reading, rest) = postcard::take_from_bytes::<Reading>(body)
            .map_err(|_| DecodeError::Malformed { len: body.len() })?;
        if !rest.is_empty() {
            return Err(DecodeError::TrailingBytes { count: rest.len() });
        }
        Ok(reading)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sample() -> Reading {
        Reading {
            device_id: 7,
            sequence: 300,
            uptime_ms: 60_000,
            dropped: 0,
            values: SensorValues {
                temperature_centi_c: -150,
                humidity_centi_pct: 4520,
                supply_mv: 3300,
            },
        }
    }

    #[test]
    fn golden_bytes_pin_the_version_1_encoding() {
        let mut buf = [0u8; READING_MAX_ENCODED_LEN];
        let bytes = sample().encode(&mut buf).map(|b| b.to_vec());
        // version, device 7, sequence 300 (varint ac 02), uptime 60000 (e0 d4 03), dropped 0,
        // temperature -150 (zigzag 299 = ab 02), humidity 4520 (a8 23), supply 3300 (e4 19).
        let golden = vec![
            0x01, 0x07, 0xac, 0x02, 0xe0, 0xd4, 0x03, 0x00, 0xab, 0x02, 0xa8, 0x23, 0xe4, 0x19,
        ];
        assert_eq!(bytes, Ok(golden));
    }

    #[test]
    fn decode_reverses_encode() {
        let mut buf = [0u8; READING_MAX_ENCODED_LEN];
        let len = sample().encode(&mut buf).map(|b| b.len()).unwrap_or(0);
        assert_eq!(Reading::decode(&buf[..len]), Ok(sample()));
    }

    #[test]
    fn largest_reading_fits_the_advertised_maximum() {
        let max = Reading {
            device_id: u32::MAX,
            sequence: u32::MAX,
            uptime_ms: u64::MAX,
            dropped: u32::MAX,
            values: SensorValues {
                temperature_centi_c: i16::MIN,
                humidity_centi_pct: u16::MAX,
                supply_mv: u16::MAX,
            },
        };
        let mut buf = [0u8; READING_MAX_ENCODED_LEN];
        let len = max.encode(&mut buf).map(|b| b.len());
        assert_eq!(len, Ok(READING_MAX_ENCODED_LEN));
        assert_eq!(Reading::decode(&buf), Ok(max));
    }

    #[test]
    fn unknown_version_is_a_typed_error() {
        assert_eq!(
            Reading::decode(&[2, 7, 0, 0, 0, 0, 0, 0]),
            Err(DecodeError::UnsupportedVersion {
                found: 2,
                supported: READING_VERSION
            })
        );
        assert_eq!(Reading::decode(&[]), Err(DecodeError::Empty));
    }

    #[test]
    fn truncated_and_padded_payloads_are_rejected() {
        let mut buf = [0u8; READING_MAX_ENCODED_LEN + 1];
        let len = sample().encode(&mut buf).map(|b| b.len()).unwrap_or(0);
        assert_eq!(
            Reading::decode(&buf[..len - 1]),
            Err(DecodeError::Malformed { len: len - 2 })
        );
        assert_eq!(
            Reading::decode(&buf[..len + 1]),
            Err(DecodeError::TrailingBytes { count: 1 })
        );
    }

    #[test]
    fn short_buffer_is_an_encode_error() {
        let mut buf = [0u8; 4];
        assert_eq!(
            sample().encode(&mut buf).map(|b| b.len()),
            Err(EncodeError::BufferTooSmall { capacity: 4 })
        );
    }

    proptest! {
        #[test]
        fn any_payload_decodes_or_errors_without_panicking(
            payload in proptest::collection::vec(any::<u8>(), 0..48)
        ) {
            // postcard accepts overlong varints, so a decoded payload need not be canonical:
            // re-encoding gives the canonical (never longer) form of the same reading.
            if let Ok(reading) = Reading::decode(&payload) {
                let mut buf = [0u8; READING_MAX_ENCODED_LEN];
                let len = reading.encode(&mut buf).map(|b| b.len()).unwrap_or(0);
                prop_assert!(len > 0 && len <= payload.len());
                prop_assert_eq!(Reading::decode(&buf[..len]), Ok(reading));
            }
        }

        #[test]
        fn every_reading_round_trips(
            ids in any::<(u32, u32, u64, u32)>(),
            values in any::<(i16, u16, u16)>(),
        ) {
            let reading = Reading {
                device_id: ids.0,
                sequence: ids.1,
                uptime_ms: ids.2,
                dropped: ids.3,
                values: SensorValues {
                    temperature_centi_c: values.0,
                    humidity_centi_pct: values.1,
                    supply_mv: values.2,
                },
            };
            let mut buf = [0u8; READING_MAX_ENCODED_LEN];
            let len = reading.encode(&mut buf).map(|b| b.len());
            prop_assert!(len.is_ok());
            prop_assert_eq!(Reading::decode(&buf[..len.unwrap_or(0)]), Ok(reading));
        }
    }
}
