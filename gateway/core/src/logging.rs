//! Process-wide diagnostics: installs the `tracing` subscriber that writes to stderr.

use tracing_subscriber::EnvFilter;

/// Installs the stderr subscriber with `directives` (such as `"info"` or `"warn,rskafka=off"`)
/// unless `RUST_LOG` is set, which wins.
pub fn init(directives: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(directives));
    // A second call (tests that run `serve` twice in one process) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
