//! Metrics in the Prometheus text exposition format. Each subsystem implements [`MetricsSource`]
//! and renders its own families; the admin endpoint concatenates them. No global registry.

use std::fmt::Write;
use std::time::Instant;

/// Something that can append its metric families to a `/metrics` response.
pub trait MetricsSource: Send + Sync {
    /// Appends `# HELP`, `# TYPE` and sample lines to `out`.
    fn render(&self, out: &mut String);
}

/// Writes one metric family with a single unlabelled sample.
pub fn write_single(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    value: impl std::fmt::Display,
) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name} {value}");
}

/// Process-level metrics: build information and uptime.
#[derive(Debug)]
pub struct ProcessMetrics {
    started: Instant,
}

impl ProcessMetrics {
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
        }
    }
}

impl Default for ProcessMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricsSource for ProcessMetrics {
    fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP tern_build_info Build information; always 1.");
        let _ = writeln!(out, "# TYPE tern_build_info gauge");
        let _ = writeln!(
            out,
            "tern_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        write_single(
            out,
            "tern_uptime_seconds",
            "gauge",
            "Seconds since the process started.",
            format_args!("{:.3}", self.started.elapsed().as_secs_f64()),
        );
        if let Some(rss) = resident_bytes() {
            write_single(
                out,
                "tern_process_resident_memory_bytes",
                "gauge",
                "Resident set size of the process.",
                rss,
            );
        }
    }
}

/// Resident set size from /proc/self/statm, when the platform has it.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page_size).ok().map(|size| pages * size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_metrics_render_valid_families() {
        let mut out = String::new();
        ProcessMetrics::new().render(&mut out);
        assert!(out.contains("# TYPE tern_uptime_seconds gauge\n"), "{out}");
        assert!(out.contains("tern_build_info{version=\""), "{out}");
        for line in out.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().expect("sample has a value");
            value.parse::<f64>().expect("sample value is a number");
        }
    }
}
