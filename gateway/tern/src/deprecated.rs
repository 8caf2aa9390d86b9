//! Keys kept for configuration files written for older versions. Each names a fact another key
//! now owns: at load its value is moved there (unless the file sets that key too, which then
//! wins) and the key is cleared, so nothing after loading ever reads it. Each one found is
//! reported: a WARN line when `tern serve` starts and at each SIGHUP reload, a line on stderr
//! from `tern config check`.
//!
//! It only moves values between the loaded structs; it never reads a file itself.

use std::fmt;

use tern_log::WearConfig;

use crate::status::StatusConfig;

/// A deprecated key found in a file, and what became of its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deprecation {
    /// The old key, dotted.
    pub key: &'static str,
    /// The key that owns its fact now.
    pub instead: &'static str,
    /// What was done with the old value.
    pub outcome: String,
}

impl fmt::Display for Deprecation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is deprecated, set `{}` instead: {}",
            self.key, self.instead, self.outcome
        )
    }
}

/// Moves the deprecated keys of a configuration parsed from `text` (its `[status]` and
/// `[log.flush.wear]`) to the keys that own their facts.
pub fn resolve(status: &mut StatusConfig, wear: &mut WearConfig, text: &str) -> Vec<Deprecation> {
    let file: toml::Table = text.parse().unwrap_or_default();
    let set = |dotted: &str| is_set(&file, dotted);
    let mut found = Vec::new();
    if let Some(old) = status.card_bytes.take() {
        let new = Key::new("log.flush.wear.card_size", set("log.flush.wear.card_size"));
        found.push(new.take("status.card_bytes", old.0, &mut wear.card_size.0));
    }
    if let Some(old) = status.card_write_cycles.take() {
        let new = Key::new(
            "log.flush.wear.write_cycles",
            set("log.flush.wear.write_cycles"),
        );
        found.push(new.take("status.card_write_cycles", old, &mut wear.write_cycles));
    }
    found
}

/// Whether the file sets the dotted key.
fn is_set(file: &toml::Table, dotted: &str) -> bool {
    let mut parts = dotted.split('.').peekable();
    let mut table = file;
    while let Some(part) = parts.next() {
        match (table.get(part), parts.peek()) {
            (Some(_), None) => return true,
            (Some(toml::Value::Table(inner)), Some(_)) => table = inner,
            _ => return false,
        }
    }
    false
}

/// The key a deprecated one maps to.
struct Key {
    name: &'static str,
    /// The file sets it.
    set: bool,
}

impl Key {
    fn new(name: &'static str, set: bool) -> Self {
        Self { name, set }
    }

    /// The deprecated `key`'s value `old` moved to `new` (the current value of this key),
    /// unless 0 or this key is set in the file.
    fn take<T>(&self, key: &'static str, old: T, new: &mut T) -> Deprecation
    where
        T: Copy + PartialEq + Default + fmt::Display,
    {
        let outcome = if old == T::default() {
            format!(
                "0 is ignored (it meant unknown); `{}` = {new} applies",
                self.name
            )
        } else if !self.set {
            *new = old;
            format!("its value {old} is used as `{}`", self.name)
        } else if *new == old {
            format!("`{}` is set to the same value; remove `{key}`", self.name)
        } else {
            format!(
                "both are set and differ: `{}` = {new} wins over `{key}` = {old}",
                self.name
            )
        };
        Deprecation {
            key,
            instead: self.name,
            outcome,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{Config, read};

    fn load(text: &str) -> (Config, Vec<String>) {
        let (config, found) = read(text, Path::new("t.toml")).expect("parses");
        config.validate().expect("valid");
        (config, found.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn the_old_card_keys_still_set_the_card_and_name_the_new_keys() {
        let (config, warnings) =
            load("[status]\ncard_bytes = \"64GB\"\ncard_write_cycles = 3000\n");
        let wear = &config.log.flush.wear;
        assert_eq!(
            (wear.card_size.0, wear.write_cycles),
            (64_000_000_000, 3000)
        );
        assert_eq!(config.status.card_bytes, None, "never read after load");
        assert_eq!(config.status.card_write_cycles, None);
        assert_eq!(
            warnings,
            [
                "`status.card_bytes` is deprecated, set `log.flush.wear.card_size` instead: its value 64000000000 is used as `log.flush.wear.card_size`",
                "`status.card_write_cycles` is deprecated, set `log.flush.wear.write_cycles` instead: its value 3000 is used as `log.flush.wear.write_cycles`",
            ]
        );
        let printed = config.to_toml().expect("prints");
        assert!(!printed.contains("card_bytes"), "{printed}");
    }

    #[test]
    fn when_both_keys_are_set_and_differ_the_new_one_wins_and_says_so() {
        let text = "[status]\ncard_bytes = \"64GB\"\n[log.flush.wear]\ncard_size = \"16GB\"\n";
        let (config, warnings) = load(text);
        assert_eq!(config.log.flush.wear.card_size.0, 16_000_000_000);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].ends_with(
                "both are set and differ: `log.flush.wear.card_size` = 16000000000 wins over `status.card_bytes` = 64000000000"
            ),
            "{warnings:?}"
        );
        let text = "[status]\ncard_bytes = \"16GB\"\n[log.flush.wear]\ncard_size = \"16GB\"\n";
        let (_, warnings) = load(text);
        assert!(warnings[0].ends_with("is set to the same value; remove `status.card_bytes`"));
    }

    #[test]
    fn the_old_default_of_zero_is_ignored_and_the_card_size_applies() {
        let (config, warnings) = load("[status]\ncard_bytes = 0\ncard_write_cycles = 1000\n");
        assert_eq!(config.log.flush.wear, Config::default().log.flush.wear);
        assert!(
            warnings[0].contains("0 is ignored (it meant unknown)"),
            "{warnings:?}"
        );
        assert!(warnings[1].ends_with("its value 1000 is used as `log.flush.wear.write_cycles`"));
        let (_, none) = load("[log.flush.wear]\ncard_size = \"8GB\"\n");
        assert!(none.is_empty(), "{none:?}");
    }
}
