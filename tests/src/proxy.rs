//! A loopback TCP proxy that tests can cut and restore, to simulate a WAN link between tern and
//! Kafka going down. Cutting closes every open connection and refuses new ones until restored.
//! It forwards bytes unchanged; towards the broker it reads them as Kafka request frames (size,
//! api key) so a test can arm a cut that fires when a given request arrives, before it is
//! forwarded ([`TcpProxy::cut_at_request`]: a link lost between two requests of one exchange),
//! or one that holds that request until released ([`TcpProxy::hold_at_request`]: a link that
//! stalls without closing, so the request arrives late on the same connection). Towards the
//! client it can lose every answer ([`TcpProxy::lose_responses`]: requests arrive and are
//! served, their answers never come back).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A running proxy from `addr` to its target. Dropping it stops it and closes its connections.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    cut: AtomicBool,
    /// The api key whose request cuts the proxy (−1: none armed).
    cut_at: AtomicI32,
    /// Set when an armed cut fired.
    tripped: AtomicBool,
    /// The api key whose request is held (−1: none armed).
    hold_at: AtomicI32,
    /// True while a held request waits; cleared by [`TcpProxy::release`] (and on drop), which
    /// wakes `released`.
    holding: Mutex<bool>,
    released: Condvar,
    /// While set, bytes from the target are read and dropped.
    lose_responses: AtomicBool,
    stopped: AtomicBool,
    connections: Mutex<Vec<TcpStream>>,
    /// When each connection forwarded to the target was opened (what the broker saw).
    opened: Mutex<Vec<Instant>>,
    /// Every answered request: what the client waited for the broker, from the request leaving
    /// the proxy to its response arriving in it.
    answered: Mutex<Vec<Answered>>,
}

/// One request the target answered, as the proxy saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answered {
    pub api_key: i16,
    /// When the response arrived.
    pub at: Instant,
    /// From the request's last byte forwarded to the response's last byte received.
    pub latency: Duration,
}

/// The requests of one connection waiting for their responses: correlation id → (api key, when
/// forwarded).
type Pending = Arc<Mutex<HashMap<i32, (i16, Instant)>>>;

impl State {
    /// Ends a hold: the held request goes on (or its pump sees `stopped`).
    fn release_hold(&self) {
        *self.holding.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.released.notify_all();
    }

    fn close_all(&self) {
        let mut connections = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        for stream in connections.drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

impl TcpProxy {
    /// Listens on `listen` (`127.0.0.1:port`) and forwards each connection to `target`.
    pub fn start(listen: SocketAddr, target: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            cut_at: AtomicI32::new(-1),
            hold_at: AtomicI32::new(-1),
            ..State::default()
        });
        let accept_state = Arc::clone(&state);
        std::thread::spawn(move || accept_loop(&listener, target, &accept_state));
        Ok(Self { addr, state })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// When each connection the proxy forwarded to its target was opened, oldest first.
    pub fn opened(&self) -> Vec<Instant> {
        (self.state.opened.lock().unwrap_or_else(|e| e.into_inner())).clone()
    }

    /// Every request the target answered so far, in the order of the answers per connection.
    pub fn answered(&self) -> Vec<Answered> {
        (self
            .state
            .answered
            .lock()
            .unwrap_or_else(|e| e.into_inner()))
        .clone()
    }

    /// Closes every connection and refuses new ones.
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        self.state.close_all();
    }

    /// Accepts connections again (and disarms a request cut that did not fire).
    pub fn restore(&self) {
        self.state.cut_at.store(-1, Ordering::SeqCst);
        self.state.cut.store(false, Ordering::SeqCst);
    }

    /// Arms a cut: the next request with `api_key` is dropped and the proxy cuts, as
    /// [`TcpProxy::cut`] (restore it the same way).
    pub fn cut_at_request(&self, api_key: i16) {
        self.state.tripped.store(false, Ordering::SeqCst);
        self.state
            .cut_at
            .store(i32::from(api_key), Ordering::SeqCst);
    }

    /// Arms a hold: the next request with `api_key` is not forwarded (its connection and every
    /// other stay open, the requests after it on that connection wait behind it) until
    /// [`TcpProxy::release`]; [`TcpProxy::tripped`] tells when it arrived.
    pub fn hold_at_request(&self, api_key: i16) {
        self.state.tripped.store(false, Ordering::SeqCst);
        self.state
            .hold_at
            .store(i32::from(api_key), Ordering::SeqCst);
    }

    /// Forwards a held request (and disarms a hold that did not fire).
    pub fn release(&self) {
        self.state.hold_at.store(-1, Ordering::SeqCst);
        self.state.release_hold();
    }

    /// While `lose` holds, every answer of the target is dropped (the requests still reach it):
    /// a client whose answers are lost on the way.
    pub fn lose_responses(&self, lose: bool) {
        self.state.lose_responses.store(lose, Ordering::SeqCst);
    }

    /// Whether the armed cut or hold fired.
    pub fn tripped(&self) -> bool {
        self.state.tripped.load(Ordering::SeqCst)
    }

    pub fn is_cut(&self) -> bool {
        self.state.cut.load(Ordering::SeqCst)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        self.state.release_hold();
        self.state.close_all();
        // Wake the accept loop so it sees `stopped`.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn accept_loop(listener: &TcpListener, target: SocketAddr, state: &Arc<State>) {
    for incoming in listener.incoming() {
        if state.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = incoming else { continue };
        if state.cut.load(Ordering::SeqCst) {
            continue;
        }
        let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
            continue;
        };
        let opened = Instant::now();
        (state.opened.lock().unwrap_or_else(|e| e.into_inner())).push(opened);
        let _ = pump_both(client, server, state);
    }
}

fn pump_both(client: TcpStream, server: TcpStream, state: &Arc<State>) -> io::Result<()> {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    {
        let mut connections = state.connections.lock().unwrap_or_else(|e| e.into_inner());
        connections.push(client.try_clone()?);
        connections.push(server.try_clone()?);
    }
    let (client_rx, server_rx) = (client.try_clone()?, server.try_clone()?);
    let (requests, responses) = (Arc::clone(state), Arc::clone(state));
    let pending: Pending = Arc::default();
    let answers = Arc::clone(&pending);
    std::thread::spawn(move || pump_requests(client_rx, server, &requests, &pending));
    std::thread::spawn(move || pump_responses(server_rx, client, &responses, &answers));
    Ok(())
}

/// One size-prefixed Kafka frame from `from` (its big-endian int32 size, then the frame).
fn read_frame(from: &mut TcpStream, what: &str) -> io::Result<([u8; 4], Vec<u8>)> {
    let mut size = [0u8; 4];
    from.read_exact(&mut size)?;
    let len = size.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b));
    if len > 256 << 20 {
        return Err(io::Error::other(format!("a {what} frame of {len} bytes")));
    }
    let mut frame = vec![0u8; len];
    from.read_exact(&mut frame)?;
    Ok((size, frame))
}

/// The big-endian int32 at `at` of `frame`.
fn int32_at(frame: &[u8], at: usize) -> Option<i32> {
    let bytes = frame.get(at..at + 4)?;
    Some(bytes.iter().fold(0i32, |n, &b| (n << 8) | i32::from(b)))
}

/// Copies Kafka response frames from `from` to `to` (dropping them while answers are lost),
/// timing each against its request by correlation id, until either side closes, then closes
/// both.
fn pump_responses(mut from: TcpStream, mut to: TcpStream, state: &State, pending: &Pending) {
    let mut forward = || -> io::Result<()> {
        loop {
            let (size, frame) = read_frame(&mut from, "response")?;
            // A response starts with its request's correlation id.
            let asked = int32_at(&frame, 0).and_then(|id| {
                pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id)
            });
            if let Some((api_key, sent)) = asked {
                let at = Instant::now();
                let answered = Answered {
                    api_key,
                    at,
                    latency: at.duration_since(sent),
                };
                (state.answered.lock().unwrap_or_else(|e| e.into_inner())).push(answered);
            }
            if state.lose_responses.load(Ordering::SeqCst) {
                continue;
            }
            to.write_all(&size)?;
            to.write_all(&frame)?;
        }
    };
    let _ = forward();
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Copies Kafka request frames from `from` to `to` until either side closes or the armed cut
/// fires on a request (which is then not forwarded), then closes both.
fn pump_requests(mut from: TcpStream, mut to: TcpStream, state: &State, pending: &Pending) {
    let mut forward = || -> io::Result<()> {
        loop {
            let (size, frame) = read_frame(&mut from, "request")?;
            // Kafka's int16 api key is big-endian, first in the request header.
            let key = frame
                .get(..2)
                .map(|k| k.iter().fold(0i32, |n, &b| (n << 8) | i32::from(b)));
            let armed = state.cut_at.load(Ordering::SeqCst);
            if key.is_some_and(|k| k == armed) {
                state.cut_at.store(-1, Ordering::SeqCst);
                state.cut.store(true, Ordering::SeqCst);
                state.tripped.store(true, Ordering::SeqCst);
                state.close_all();
                return Ok(());
            }
            if key.is_some_and(|k| k == state.hold_at.load(Ordering::SeqCst)) {
                state.hold_at.store(-1, Ordering::SeqCst);
                let mut holding = state.holding.lock().unwrap_or_else(|e| e.into_inner());
                *holding = true;
                state.tripped.store(true, Ordering::SeqCst);
                while *holding && !state.stopped.load(Ordering::SeqCst) {
                    holding = state
                        .released
                        .wait(holding)
                        .unwrap_or_else(|e| e.into_inner());
                }
                drop(holding);
            }
            // The header: api key, api version, correlation id. Noted before the request leaves,
            // so its answer cannot come first.
            if let (Some(key), Some(id)) = (key, int32_at(&frame, 4)) {
                let api_key = i16::try_from(key).unwrap_or(-1);
                let mut waiting = pending.lock().unwrap_or_else(|e| e.into_inner());
                waiting.insert(id, (api_key, Instant::now()));
            }
            to.write_all(&size)?;
            to.write_all(&frame)?;
        }
    };
    let _ = forward();
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
