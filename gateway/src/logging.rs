//! Process-wide diagnostics: installs the `tracing` subscriber that writes to stderr.

use tracing_subscriber::EnvFilter;

use crate::config::LoggingConfig;

/// Installs the stderr subscriber. `RUST_LOG`, when set, wins over the configured level.
pub fn init(config: &LoggingConfig) {
    init_with(config.level.as_str());
}

/// Installs the stderr subscriber with `directives` (such as `"warn,rskafka=off"`) unless
/// `RUST_LOG` is set.
pub fn init_with(directives: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(directives));
    // A second call (tests that run `serve` twice in one process) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
