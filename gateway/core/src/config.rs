//! The error a layer's configuration check returns: the dotted key at fault and what is wrong
//! with it. Every crate validates its own section and names keys the way the TOML file spells
//! them, so the binary can print `key `mqtt.listen`: …` whatever layer found the problem.

/// A setting that types alone could not reject, named by its dotted key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key `{key}`: {message}")]
pub struct InvalidConfig {
    /// The dotted key, such as `mqtt.tls.listen` or `upstream[0].linger`.
    pub key: String,
    /// What is wrong with its value.
    pub message: String,
}

/// An [`InvalidConfig`] for `key`.
pub fn invalid(key: &str, message: impl Into<String>) -> InvalidConfig {
    InvalidConfig {
        key: key.to_owned(),
        message: message.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_key_and_the_problem() {
        let err = invalid("log.segment_bytes", "must be at least 64KiB");
        assert_eq!(
            err.to_string(),
            "key `log.segment_bytes`: must be at least 64KiB"
        );
    }
}
