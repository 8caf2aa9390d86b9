//! Bounded log fields: whatever a client sends (client ids up to 64 KiB, topics, filters, group
//! names) reaches a log line only through [`clip`], which keeps at most [`MAX_LOGGED`] bytes,
//! escapes control characters (no forged log lines) and says how much it left out. Pure.

use std::fmt;

/// Most bytes of one client-supplied field written into a log line.
pub(crate) const MAX_LOGGED: usize = 128;

/// A client-supplied text, bounded for a log line (see [`clip`]).
#[derive(Clone, Copy)]
pub(crate) struct Clipped<'a>(&'a str);

/// `text` bounded to [`MAX_LOGGED`] bytes, cut at a character boundary, for `%` or `?` fields.
pub(crate) fn clip(text: &str) -> Clipped<'_> {
    Clipped(text)
}

impl fmt::Display for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut end = self.0.len().min(MAX_LOGGED);
        while !self.0.is_char_boundary(end) {
            end -= 1;
        }
        let (kept, rest) = self.0.split_at(end);
        write!(f, "{}", kept.escape_debug())?;
        if !rest.is_empty() {
            write!(f, "…(+{} bytes)", rest.len())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn short_text_is_kept_and_long_text_cut() {
        assert_eq!(clip("sensor-7").to_string(), "sensor-7");
        assert_eq!(format!("{:?}", clip("a\nb")), "\"a\\nb\"");
        let long = "x".repeat(65_000);
        let shown = clip(&long).to_string();
        assert_eq!(
            shown,
            format!("{}…(+{} bytes)", "x".repeat(128), 65_000 - 128)
        );
    }

    proptest! {
        #[test]
        fn clipped_text_is_bounded(text in ".{0,400}") {
            let shown = clip(&text).to_string();
            // Escapes at most quadruple-ish a character; the suffix is short.
            prop_assert!(shown.len() <= MAX_LOGGED * 10 + 32, "{}", shown.len());
            prop_assert!(shown.lines().count() <= 1);
        }
    }
}
