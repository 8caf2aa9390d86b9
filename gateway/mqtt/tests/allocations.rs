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

/// Allocations (including reallocations) made by threads whose `COUNTING` flag is set.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

struct Counting;

// SAFETY: every call is forwarded to the system allocator unchanged; counting only reads a
// thread-local flag (no allocation) and bumps an atomic.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for `alloc` is passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc` is passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for `realloc` is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn count() {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Publishes measured, after a warm-up of the same size.
const PUBLISHES: usize = 20_000;
/// Unacknowledged publishes the client keeps in flight.
const WINDOW: usize = 64;

/// A length-prefixed MQTT string.
fn field(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&u16::try_from(bytes.len()).unwrap_or(0).to_be_bytes());
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
    body.extend_from_slice(&pkid.to_be_bytes());
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
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut body = Vec::new();
    field(&mut body, b"MQTT");
    body.extend_from_slice(&[4, 0x02, 0, 60]);
    field(&mut body, b"alloc-counter");
    stream.write_all(&packet(0x10, &body)).expect("CONNECT");
    let mut connack = [0u8; 4];
    stream.read_exact(&mut connack).expect("CONNACK");
    assert_eq!(connack, [0x20, 2, 0, 0]);
    stream
}

#[test]
fn a_durable_qos1_publish_takes_few_allocations() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (trigger, shutdown) = tern_core::shutdown::channel();
    let (addr, server) = runtime.block_on(async {
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
    });
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
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        done_rx.await.expect("measured run done");
        let counted = ALLOCATIONS.load(Ordering::Relaxed) - before;
        COUNTING.with(|c| c.set(false));
        counted
    });
    publisher.join().expect("publisher");
    trigger.trigger();
    runtime.block_on(server).expect("listener stops");
    let per_publish = allocations as f64 / PUBLISHES as f64;
    println!("allocations per durable QoS 1 publish: {per_publish:.2}");
    assert!(
        per_publish <= 20.0,
        "{per_publish:.2} allocations per publish"
    );
}
