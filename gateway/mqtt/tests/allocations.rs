//! Heap allocations per durable QoS 1 publish, counted by a counting global allocator in this
//! test binary only (never in `tern`). The broker runs on a current-thread runtime on the test
//! thread over the in-memory log, and only that thread's allocations are counted; the client is
//! a plain socket on another thread. It prints the figure and guards it against regressions
//! (allocations are deterministic; this is no timing).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tern_log::MemoryLog;
use tern_mqtt::{Broker, MqttConfig, MqttListener, MqttMetrics};

thread_local! {
    /// Whether this thread's allocations are counted (the broker's thread only).
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    /// Allocations (including reallocations) this thread made while counting.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    /// Bytes this thread allocated minus bytes it freed while counting (wrapping).
    static LIVE_BYTES: Cell<u64> = const { Cell::new(0) };
}

/// This thread's counters: (allocations, live bytes).
fn counters() -> (u64, u64) {
    (ALLOCATIONS.with(Cell::get), LIVE_BYTES.with(Cell::get))
}

fn add(cell: &'static std::thread::LocalKey<Cell<u64>>, delta: u64, subtract: bool) {
    let _ = cell.try_with(|c| {
        let value = if subtract {
            c.get().wrapping_sub(delta)
        } else {
            c.get().wrapping_add(delta)
        };
        c.set(value);
    });
}

struct Counting;

// SAFETY: every call is forwarded to the system allocator unchanged; counting only touches
// const-initialised thread-locals (no allocation).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size(), 0);
        // SAFETY: the caller's contract for `alloc` is passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        freed(layout.size());
        // SAFETY: the caller's contract for `dealloc` is passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size, layout.size());
        // SAFETY: the caller's contract for `realloc` is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn count(size: usize, replaced: usize) {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        add(&ALLOCATIONS, 1, false);
        add(&LIVE_BYTES, size as u64, false);
        add(&LIVE_BYTES, replaced as u64, true);
    }
}

fn freed(size: usize) {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        add(&LIVE_BYTES, size as u64, true);
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Publishes measured, after a warm-up of the same size.
const PUBLISHES: usize = 20_000;
/// Unacknowledged publishes the client keeps in flight.
const WINDOW: usize = 64;

/// A two-byte integer as MQTT writes it (most significant byte first).
fn wire_u16(value: u16) -> [u8; 2] {
    [(value >> 8) as u8, value as u8]
}

/// A length-prefixed MQTT string.
fn field(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&wire_u16(u16::try_from(bytes.len()).unwrap_or(0)));
    out.extend_from_slice(bytes);
}

fn packet(first: u8, body: &[u8]) -> Vec<u8> {
    assert!(body.len() < 128, "one-byte remaining length only");
    let mut out = vec![first, body.len() as u8];
    out.extend_from_slice(body);
    out
}

fn publish(pkid: u16) -> Vec<u8> {
    let mut body = Vec::new();
    field(&mut body, b"bench/1");
    body.extend_from_slice(&wire_u16(pkid));
    body.extend_from_slice(&[0x5a; 64]);
    packet(0x32, &body)
}

/// Sends `count` QoS 1 publishes with `WINDOW` in flight and reads every PUBACK.
fn publish_all(stream: &mut TcpStream, count: usize, first_pkid: usize) {
    let mut sent = 0;
    let mut acked = 0;
    let mut buf = Vec::new();
    while acked < count {
        let mut out = Vec::new();
        while sent < count && sent - acked < WINDOW {
            out.extend(publish(((first_pkid + sent) % 65_535 + 1) as u16));
            sent += 1;
        }
        stream.write_all(&out).expect("write publishes");
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).expect("read acks");
        assert!(n > 0, "broker closed the connection");
        buf.extend_from_slice(&chunk[..n]);
        while buf.len() >= 4 {
            assert_eq!(&buf[..2], &[0x40, 2], "a PUBACK");
            buf.drain(..4);
            acked += 1;
        }
    }
}

fn client(addr: std::net::SocketAddr) -> TcpStream {
    connect(addr, "alloc-counter")
}

/// A client with a fresh id.
fn client_with_id(addr: std::net::SocketAddr) -> TcpStream {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    connect(
        addr,
        &format!("idle-{}", NEXT.fetch_add(1, Ordering::Relaxed)),
    )
}

fn connect(addr: std::net::SocketAddr, id: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut body = Vec::new();
    field(&mut body, b"MQTT");
    body.extend_from_slice(&[4, 0x02, 0, 60]);
    field(&mut body, id.as_bytes());
    stream.write_all(&packet(0x10, &body)).expect("CONNECT");
    let mut connack = [0u8; 4];
    stream.read_exact(&mut connack).expect("CONNACK");
    assert_eq!(connack, [0x20, 2, 0, 0]);
    stream
}

/// A broker over the in-memory log on `runtime`, listening on loopback.
fn broker(
    runtime: &tokio::runtime::Runtime,
    shutdown: tern_core::shutdown::Shutdown,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    runtime.block_on(async {
        let log = MemoryLog::new(1);
        let metrics = Arc::new(MqttMetrics::default());
        let broker = Broker::open(log, MqttConfig::default(), Vec::new(), metrics)
            .await
            .expect("broker");
        let listener = MqttListener::bind("127.0.0.1:0".parse().expect("addr"), broker)
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        (addr, tokio::spawn(listener.run(shutdown)))
    })
}

#[test]
fn a_durable_qos1_publish_takes_few_allocations() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (trigger, shutdown) = tern_core::shutdown::channel();
    let (addr, server) = broker(&runtime, shutdown);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<u64>();
    let (warm_tx, warm_rx) = tokio::sync::oneshot::channel::<()>();
    let publisher = std::thread::spawn(move || {
        let mut stream = client(addr);
        publish_all(&mut stream, PUBLISHES, 0);
        let _ = warm_tx.send(());
        publish_all(&mut stream, PUBLISHES, PUBLISHES);
        let _ = done_tx.send(0);
    });
    let allocations = runtime.block_on(async {
        warm_rx.await.expect("warm-up done");
        COUNTING.with(|c| c.set(true));
        let (before, _) = counters();
        done_rx.await.expect("measured run done");
        let counted = counters().0 - before;
        COUNTING.with(|c| c.set(false));
        counted
    });
    publisher.join().expect("publisher");
    trigger.trigger();
    runtime.block_on(server).expect("listener stops");
    let per_publish = allocations as f64 / PUBLISHES as f64;
    println!("allocations per durable QoS 1 publish: {per_publish:.2}");
    // 14.50 before the header names were borrowed and the message moved into its record
    // (issue #16), 8.30 after, 6.30 with the fixed `mqtt.qos`/`mqtt.retain` values borrowed.
    assert!(
        per_publish <= 8.0,
        "{per_publish:.2} allocations per publish"
    );
}

/// Idle clients whose memory is measured.
const IDLE: usize = 200;

#[test]
fn an_idle_connection_holds_little_memory() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (trigger, shutdown) = tern_core::shutdown::channel();
    let (addr, server) = broker(&runtime, shutdown);
    let (connected_tx, connected_rx) = tokio::sync::oneshot::channel::<Vec<TcpStream>>();
    let before = runtime.block_on(async {
        COUNTING.with(|c| c.set(true));
        counters().1
    });
    std::thread::spawn(move || {
        let clients: Vec<TcpStream> = (0..IDLE).map(|_| client_with_id(addr)).collect();
        let _ = connected_tx.send(clients);
    });
    let (held, clients) = runtime.block_on(async {
        let clients = connected_rx.await.expect("clients connected");
        // Every CONNACK was read, so every connection task is in its packet loop; one more
        // turn of the runtime lets each settle its read buffer.
        tokio::task::yield_now().await;
        let held = counters().1.wrapping_sub(before);
        COUNTING.with(|c| c.set(false));
        (held, clients)
    });
    drop(clients);
    trigger.trigger();
    runtime.block_on(server).expect("listener stops");
    let per_client = held as f64 / IDLE as f64;
    println!("heap bytes per idle connection: {per_client:.0}");
    // 6,552 bytes (debug build) before the connection's rare phases were boxed, 4,488 after.
    assert!(
        per_client <= 6_144.0,
        "{per_client:.0} bytes per idle connection"
    );
}
