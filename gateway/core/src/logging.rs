//! Process-wide diagnostics: installs the `tracing` subscriber that writes to stderr, with a
//! handle that changes its level later (SIGHUP).

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, fmt, reload};

/// Changes the level of the installed subscriber.
#[derive(Debug, Clone)]
pub struct LevelHandle {
    handle: Option<reload::Handle<EnvFilter, Registry>>,
    from_env: bool,
}

impl LevelHandle {
    /// Applies new directives; an error says why they were not applied (`RUST_LOG` is set and
    /// wins, no subscriber of ours is installed, or the directives do not parse).
    pub fn set(&self, directives: &str) -> Result<(), String> {
        if self.from_env {
            return Err("RUST_LOG is set and wins over [logging] level".to_owned());
        }
        let Some(handle) = &self.handle else {
            return Err("another diagnostics subscriber is installed".to_owned());
        };
        let filter = EnvFilter::try_new(directives).map_err(|e| e.to_string())?;
        handle.reload(filter).map_err(|e| e.to_string())
    }
}

/// Installs the stderr subscriber with `directives` (such as `"info"` or `"warn,rskafka=off"`)
/// unless `RUST_LOG` is set, which wins.
pub fn init(directives: &str) -> LevelHandle {
    let from_env = EnvFilter::try_from_default_env().ok();
    let is_env = from_env.is_some();
    let filter = from_env.unwrap_or_else(|| EnvFilter::new(directives));
    let (filter, handle) = reload::Layer::new(filter);
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(fmt::layer().with_writer(std::io::stderr).with_ansi(false))
        .try_init();
    // A second call (tests that run `serve` twice in one process) keeps the first subscriber.
    LevelHandle {
        handle: installed.is_ok().then_some(handle),
        from_env: is_env,
    }
}
