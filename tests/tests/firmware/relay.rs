//! A loopback TCP relay between QEMU's serial socket and the broker that can cut every live
//! connection at once, as a gateway crash or a network drop would. It never changes a byte.

use std::io::copy;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// The relay; its accept thread lives as long as the test process.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    live: Arc<Mutex<Vec<TcpStream>>>,
    accepted: Arc<Mutex<usize>>,
}

impl Relay {
    /// Listens on a free loopback port and forwards each connection to `upstream`.
    pub fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let live = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(Mutex::new(0));
        let (live_in, accepted_in) = (Arc::clone(&live), Arc::clone(&accepted));
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                *accepted_in.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
                    live_in
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend([c, s]);
                }
                pump(client, server);
            }
        });
        Ok(Relay {
            addr,
            live,
            accepted,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        *self.accepted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes every live connection in both directions.
    pub fn cut(&self) {
        for stream in self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Copies bytes both ways until either side closes.
fn pump(client: TcpStream, server: TcpStream) {
    let (Ok(mut client_rx), Ok(mut server_rx)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let (mut client_tx, mut server_tx) = (client, server);
    std::thread::spawn(move || {
        let _ = copy(&mut client_rx, &mut server_tx);
        let _ = server_tx.shutdown(Shutdown::Both);
    });
    std::thread::spawn(move || {
        let _ = copy(&mut server_rx, &mut client_tx);
        let _ = client_tx.shutdown(Shutdown::Both);
    });
}
