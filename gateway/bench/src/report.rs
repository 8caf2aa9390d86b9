//! What the three benches' reports share: a performance target with the figure measured against
//! it, and the two renderings every report has (its table for people, one pretty-printed JSON
//! object for scripts). Each bench keeps its own figures and table layout in its `report.rs`.
//!
//! It never measures anything and never fails a run on a missed target: a target only prints
//! whether it is met.

use std::fmt::Display;

use serde::Serialize;

use crate::BenchError;

/// One target and whether it is met.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Target {
    pub name: String,
    pub target: f64,
    pub measured: f64,
    pub met: bool,
}

impl Target {
    /// A target the measured figure must reach.
    pub fn at_least(name: impl Into<String>, target: f64, measured: f64) -> Self {
        Self {
            name: name.into(),
            target,
            measured,
            met: measured >= target,
        }
    }

    /// A target the measured figure must not exceed.
    pub fn at_most(name: impl Into<String>, target: f64, measured: f64) -> Self {
        Self {
            name: name.into(),
            target,
            measured,
            met: measured <= target,
        }
    }

    /// `met` or `NOT met`, as the MQTT and upstream tables print it.
    pub fn verdict(&self) -> &'static str {
        if self.met { "met" } else { "NOT met" }
    }
}

/// The report as one pretty-printed JSON object.
pub fn to_json(report: &impl Serialize) -> Result<String, BenchError> {
    serde_json::to_string_pretty(report).map_err(|source| BenchError::Json { source })
}

/// Prints the report on stdout: one JSON object with `json`, else its table.
pub fn print(report: &(impl Serialize + Display), json: bool) -> Result<(), BenchError> {
    if json {
        println!("{}", to_json(report)?);
    } else {
        print!("{report}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_compare_in_their_direction() {
        let ratio = Target::at_least("ratio", 2.0, 2.0);
        assert!(ratio.met);
        assert_eq!(ratio.verdict(), "met");
        let p99 = Target::at_most("p99", 20.0, 20.5);
        assert!(!p99.met);
        assert_eq!(p99.verdict(), "NOT met");
    }

    #[test]
    fn json_keeps_the_field_names() {
        let json = to_json(&Target::at_least("t", 1.0, 3.0)).expect("serializes");
        let value: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        assert_eq!(value["name"], "t");
        assert_eq!(value["measured"], 3.0);
        assert_eq!(value["met"], true);
    }
}
