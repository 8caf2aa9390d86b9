//! The log's file operations: tern-core's `fs` module (the [`Fs`] trait, [`RealFs`], the
//! power-cut simulator `FaultyFs` and [`write_atomic`]), re-exported so the log names them as
//! its own. The log reaches files only through them (`scripts/layout.sh`), so the power-cut
//! simulation covers every write.

pub use tern_core::fs::*;
