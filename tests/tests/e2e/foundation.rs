//! The process itself: serve with defaults, admin endpoint, data-directory lock, signals, config
//! errors, CLI help.

use std::time::{Duration, Instant};

use tern_tests::{Gateway, ServeOptions, TempDir, http_get, in_netns_of, run_tern, workspace_root};

#[test]
fn serve_answers_healthz_and_metrics() -> anyhow::Result<()> {
    let dir = TempDir::new("health")?;
    let gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let (status, body) = gateway.admin_get("/healthz")?;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, body) = gateway.admin_get("/metrics")?;
    assert_eq!(status, 200);
    assert!(body.contains("# TYPE tern_uptime_seconds gauge"), "{body}");
    assert!(body.contains("tern_build_info{version="), "{body}");
    assert_eq!(gateway.admin_get("/missing")?.0, 404);
    Ok(())
}

#[test]
fn serve_with_no_arguments_uses_the_embedded_defaults() -> anyhow::Result<()> {
    let (status, stdout, stderr) = run_tern(&["serve", "--help"])?;
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("./tern-data"), "{stdout}");
    assert!(stdout.contains("127.0.0.1:9090"), "{stdout}");

    // Exactly `tern serve`: the default admin port answers and ./tern-data appears in the cwd.
    // This is the only test that uses the default ports, in a network namespace of its own:
    // another broker on the machine may hold them (both cross suites once failed on that).
    // Held here as another broker would hold them (where they are free), for the whole test.
    let _held: Vec<std::net::TcpListener> = [1883, 9090, 9092]
        .into_iter()
        .filter_map(|port| std::net::TcpListener::bind(("127.0.0.1", port)).ok())
        .collect();
    let cwd = TempDir::new("defaults")?;
    let mut gateway = Gateway::start_exact_isolated(cwd.path(), &["serve"])?;
    assert_eq!(gateway.admin.to_string(), "127.0.0.1:9090");
    assert_eq!(gateway.kafka.to_string(), "127.0.0.1:9092");
    let admin = gateway.admin;
    let pid = gateway.pid().expect("running");
    let (status, body) = in_netns_of(pid, || http_get(admin, "/healthz"))?;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, body) = in_netns_of(pid, || http_get(admin, "/metrics"))?;
    assert_eq!(status, 200);
    assert!(body.contains("tern_uptime_seconds"), "{body}");
    assert!(cwd.path().join("tern-data").join("LOCK").is_file());
    gateway.signal(libc::SIGTERM)?;
    assert_eq!(gateway.wait_exit(Duration::from_secs(10))?.code(), Some(0));
    Ok(())
}

#[test]
fn a_second_instance_on_the_same_data_dir_refuses() -> anyhow::Result<()> {
    let dir = TempDir::new("lock")?;
    let first = Gateway::start(dir.path(), &ServeOptions::default())?;
    let (status, _, stderr) = run_tern(&[
        "serve",
        "--data-dir",
        &dir.path().display().to_string(),
        "--mqtt-listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ])?;
    assert!(!status.success(), "second instance must fail");
    let pid = first.pid().expect("first is running");
    assert!(
        stderr.contains("in use by another tern process"),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("pid {pid}")), "{stderr}");
    Ok(())
}

#[test]
fn sigterm_exits_zero_promptly() -> anyhow::Result<()> {
    let dir = TempDir::new("sigterm")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let started = Instant::now();
    gateway.signal(libc::SIGTERM)?;
    let status = gateway.wait_exit(Duration::from_secs(10))?;
    assert_eq!(status.code(), Some(0), "{:?}", gateway.stderr_lines());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    // The lock is free again: a new instance starts on the same directory.
    Gateway::start(dir.path(), &ServeOptions::default())?;
    Ok(())
}

#[test]
fn sigint_exits_zero() -> anyhow::Result<()> {
    let dir = TempDir::new("sigint")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    gateway.signal(libc::SIGINT)?;
    assert_eq!(gateway.wait_exit(Duration::from_secs(10))?.code(), Some(0));
    Ok(())
}

#[test]
fn bad_config_names_the_key_and_does_not_panic() -> anyhow::Result<()> {
    let dir = TempDir::new("badconfig")?;
    let cases = [
        ("[admin]\nlisten = \"not-an-address\"\n", "admin.listen"),
        ("[mqtt]\nlisen = \"127.0.0.1:1883\"\n", "lisen"),
        ("[shutdown]\ngrace = \"soonish\"\n", "shutdown.grace"),
        ("[logging]\nlevel = 7\n", "logging.level"),
    ];
    for (text, key) in cases {
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, text)?;
        let file = file.display().to_string();
        for args in [
            vec!["config", "check", &file],
            vec!["serve", "--config", &file],
        ] {
            let (status, _, stderr) = run_tern(&args)?;
            assert_eq!(status.code(), Some(1), "{args:?}: {stderr}");
            assert!(stderr.contains(key), "{args:?} should name {key}: {stderr}");
            assert!(!stderr.contains("panicked"), "{stderr}");
        }
    }
    Ok(())
}

#[test]
fn config_check_prints_the_effective_configuration() -> anyhow::Result<()> {
    let example = workspace_root().join("tern.example.toml");
    let (status, stdout, stderr) = run_tern(&["config", "check", &example.display().to_string()])?;
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("listen = \"127.0.0.1:1883\""), "{stdout}");
    assert!(stdout.contains("grace = \"10s\""), "{stdout}");
    Ok(())
}

#[test]
fn version_and_help() -> anyhow::Result<()> {
    let (status, stdout, _) = run_tern(&["--version"])?;
    assert!(status.success());
    assert!(stdout.starts_with("tern "), "{stdout}");
    let (status, stdout, _) = run_tern(&["--help"])?;
    assert!(status.success());
    assert!(stdout.contains("serve"), "{stdout}");
    let (status, stdout, _) = run_tern(&["config", "check", "--help"])?;
    assert!(status.success());
    assert!(stdout.contains("Validate"), "{stdout}");
    Ok(())
}
