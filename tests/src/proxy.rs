//! A loopback TCP proxy that tests can cut and restore, to simulate a WAN link between tern and
//! Kafka going down. Cutting closes every open connection and refuses new ones until restored.
//! It only forwards bytes; it never looks at or changes them.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A running proxy from `addr` to its target. Dropping it stops it and closes its connections.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    cut: AtomicBool,
    stopped: AtomicBool,
    connections: Mutex<Vec<TcpStream>>,
}

impl State {
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
        let state = Arc::new(State::default());
        let accept_state = Arc::clone(&state);
        std::thread::spawn(move || accept_loop(&listener, target, &accept_state));
        Ok(Self { addr, state })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every connection and refuses new ones.
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        self.state.close_all();
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }

    pub fn is_cut(&self) -> bool {
        self.state.cut.load(Ordering::SeqCst)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
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
    std::thread::spawn(move || pump(client_rx, server));
    std::thread::spawn(move || pump(server_rx, client));
    Ok(())
}

/// Copies `from` to `to` until either side closes, then closes both.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
