//! The wall clock as every layer stamps records, reports and file names with it: milliseconds
//! since the Unix epoch. One function, so a clock before 1970 (0) or past i64 (saturated) is
//! read the same way everywhere. The log's `Clock` adds monotonic time and its own rules on top.

/// Milliseconds since the Unix epoch, now; 0 for a clock set before 1970.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    #[test]
    fn now_is_after_2020() {
        assert!(super::now_ms() > 1_577_836_800_000);
    }
}
