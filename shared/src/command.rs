//! The commands a sensor node acts on, as the datacenter writes them (the value of a command
//! record, `docs/downstream.md`) and as they arrive in a PUBLISH on `sensors/{id}/command`, and
//! the reply a node publishes to `sensors/{id}/reply` once it applied one.
//!
//! MQTT 3.1.1 carries no properties, so a command names itself: `period <ms> <tag>` sets the
//! sampling period, `<tag>` (1 to [`TAG_LEN`] bytes of ASCII letters, digits, `-`, `_`, `.`)
//! identifies it, and a node that sees the same tag again (a QoS 1 redelivery after the gateway
//! lost power before it recorded the PUBACK) does not apply it twice; `halt` ends the run. The
//! reply is `applied <tag> period <ms>`. Pure: parsing and formatting only, never allocating.

/// The longest tag a command may carry.
pub const TAG_LEN: usize = 24;
/// The shortest and longest sampling period a command may set, in ms.
pub const PERIOD_MS_MIN: u32 = 100;
pub const PERIOD_MS_MAX: u32 = 3_600_000;
/// The longest reply, `applied <tag> period <ms>`.
pub const REPLY_LEN: usize = 8 + TAG_LEN + 8 + 10;

/// A command's tag.
pub type Tag = heapless::String<TAG_LEN>;

/// A command a node understands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceCommand {
    /// Stop the run (send DISCONNECT, log the stack high-water mark).
    Halt,
    /// Sample every `period_ms` from now on.
    SetPeriod { period_ms: u32, tag: Tag },
}

/// Why a payload is not a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CommandError {
    #[error("not ASCII text")]
    NotText,
    #[error("unknown command")]
    Unknown,
    #[error("a period in ms from 100 to 3600000 is needed")]
    BadPeriod,
    #[error("a tag of 1 to 24 letters, digits, '-', '_' or '.' is needed")]
    BadTag,
    #[error("more words than the command takes")]
    TrailingWords,
}

impl DeviceCommand {
    /// Parses a command payload (surrounding whitespace allowed, words separated by spaces).
    pub fn parse(payload: &[u8]) -> Result<Self, CommandError> {
        let text = core::str::from_utf8(payload)
            .ok()
            .filter(|t| t.is_ascii())
            .ok_or(CommandError::NotText)?;
        let mut words = text.split_ascii_whitespace();
        let command = match words.next() {
            Some("halt") => Self::Halt,
            Some("period") => {
                let period_ms = words
                    .next()
                    .and_then(|w| w.parse::<u32>().ok())
                    .filter(|p| (PERIOD_MS_MIN..=PERIOD_MS_MAX).contains(p))
                    .ok_or(CommandError::BadPeriod)?;
                let tag = words.next().ok_or(CommandError::BadTag)?;
                Self::SetPeriod {
                    period_ms,
                    tag: parse_tag(tag)?,
                }
            }
            _ => return Err(CommandError::Unknown),
        };
        match words.next() {
            Some(_) => Err(CommandError::TrailingWords),
            None => Ok(command),
        }
    }
}

fn parse_tag(word: &str) -> Result<Tag, CommandError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if !word.chars().all(allowed) {
        return Err(CommandError::BadTag);
    }
    let mut tag = Tag::new();
    tag.push_str(word).map_err(|_| CommandError::BadTag)?;
    Ok(tag)
}

/// The reply to an applied `period` command.
pub fn reply(tag: &str, period_ms: u32) -> Option<heapless::String<REPLY_LEN>> {
    let mut text = heapless::String::new();
    core::fmt::write(&mut text, format_args!("applied {tag} period {period_ms}")).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn commands_parse_and_bad_ones_say_why() {
        assert_eq!(DeviceCommand::parse(b"halt"), Ok(DeviceCommand::Halt));
        let set = DeviceCommand::parse(b" period 2000 cmd-7\n");
        let tag = parse_tag("cmd-7");
        assert_eq!(
            set,
            tag.map(|tag| DeviceCommand::SetPeriod {
                period_ms: 2000,
                tag
            })
        );
        assert_eq!(
            DeviceCommand::parse(b"period 50 t"),
            Err(CommandError::BadPeriod)
        );
        assert_eq!(
            DeviceCommand::parse(b"period 500"),
            Err(CommandError::BadTag)
        );
        assert_eq!(
            DeviceCommand::parse(b"period 500 a/b"),
            Err(CommandError::BadTag)
        );
        let long = [b'a'; TAG_LEN + 1];
        let mut payload = b"period 500 ".to_vec();
        payload.extend_from_slice(&long);
        assert_eq!(DeviceCommand::parse(&payload), Err(CommandError::BadTag));
        assert_eq!(
            DeviceCommand::parse(b"halt now"),
            Err(CommandError::TrailingWords)
        );
        assert_eq!(DeviceCommand::parse(b"reboot"), Err(CommandError::Unknown));
        assert_eq!(
            DeviceCommand::parse(&[0xff, 0xfe]),
            Err(CommandError::NotText)
        );
    }

    #[test]
    fn the_longest_reply_fits() {
        let tag = "t".repeat(TAG_LEN);
        let text = reply(&tag, u32::MAX);
        assert_eq!(
            text.as_deref(),
            Some(format!("applied {tag} period {}", u32::MAX).as_str())
        );
    }

    proptest! {
        /// Any payload is judged without panicking; what parses prints back to itself.
        #[test]
        fn any_payload_is_judged_and_what_parses_round_trips(
            payload in proptest::collection::vec(any::<u8>(), 0..64),
            period in PERIOD_MS_MIN..=PERIOD_MS_MAX,
            tag in "[A-Za-z0-9._-]{1,24}",
        ) {
            let _ = DeviceCommand::parse(&payload);
            let text = format!("period {period} {tag}");
            let parsed = DeviceCommand::parse(text.as_bytes());
            let expected = parse_tag(&tag).map(|tag| DeviceCommand::SetPeriod { period_ms: period, tag });
            prop_assert_eq!(parsed, expected);
        }
    }
}
