//! Operator tools over a log directory: dump, verify, topics.
