//! The persistent-session SUBSCRIBE figure of `tern bench mqtt`: one client with Clean Session 0
//! sends 1,000 SUBSCRIBE packets back to back, one filter each, and the time until the last
//! SUBACK is printed (tern's target: under a second; each SUBSCRIBE once waited for its own
//! durable commit, 480 of them took 44 s). The session is cleared afterwards. It never judges
//! beyond printing whether the target is met.

use std::net::SocketAddr;
use std::time::Instant;

use bytes::BytesMut;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use tern_shared::mqtt::{Connect, Packet, QoS};

use super::load::{FromBroker, next, put};
use crate::BenchError;
use crate::report::Target;

/// SUBSCRIBE packets sent by the figure's client.
pub const SUBSCRIBES: u16 = 1000;
/// tern's target for them, in seconds.
pub const TARGET_S: f64 = 1.0;
/// SUBACK is packet type 9.
const SUBACK: u8 = 9;

/// Seconds each broker took for [`SUBSCRIBES`] SUBSCRIBEs on a persistent session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SubscribeFigures {
    pub subscribes: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tern_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mosquitto_s: Option<f64>,
    /// `--broker`: the one broker measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_s: Option<f64>,
}

impl SubscribeFigures {
    /// tern's target, when tern was measured.
    pub fn target(&self) -> Option<Target> {
        let measured = self.tern_s?;
        Target::at_most(
            "tern 1,000 SUBSCRIBEs, persistent session, s",
            TARGET_S,
            measured,
        )
        .into()
    }
}

impl std::fmt::Display for SubscribeFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let figures = [
            ("tern", self.tern_s),
            ("mosquitto", self.mosquitto_s),
            ("broker", self.measured_s),
        ];
        let shown: Vec<String> = figures
            .iter()
            .filter_map(|(name, s)| s.map(|s| format!("{name} {s:.3} s")))
            .collect();
        writeln!(
            f,
            "{} SUBSCRIBEs back to back on a persistent session: {}",
            self.subscribes,
            shown.join(", ")
        )
    }
}

/// Seconds from the first SUBSCRIBE to the last SUBACK of one persistent-session client.
pub async fn persistent_subscribes(broker: SocketAddr, id: &str) -> Result<f64, BenchError> {
    let mut stream = connect(broker, id, false).await?;
    let mut out = BytesMut::new();
    let filters: Vec<String> = (1..=SUBSCRIBES).map(|i| format!("bench/sub/{i}")).collect();
    for (filter, packet_id) in filters.iter().zip(1..) {
        let subscribe = Packet::Subscribe {
            packet_id,
            filter,
            qos: QoS::AtLeastOnce,
        };
        put(&mut out, &subscribe)?;
    }
    let started = Instant::now();
    stream
        .write_all(&out)
        .await
        .map_err(io("sending SUBSCRIBEs"))?;
    let mut inbuf = BytesMut::with_capacity(16 * 1024);
    let mut acked = 0;
    while acked < SUBSCRIBES {
        let got = read(&mut stream, &mut inbuf).await?;
        if got
            == (FromBroker::Other {
                packet_type: SUBACK,
            })
        {
            acked += 1;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    drop(stream);
    // Clean Session 1 ends the stored session.
    drop(connect(broker, id, true).await?);
    Ok(elapsed)
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> BenchError {
    move |source| BenchError::Io { what, source }
}

async fn connect(broker: SocketAddr, id: &str, clean: bool) -> Result<TcpStream, BenchError> {
    let mut stream = TcpStream::connect(broker)
        .await
        .map_err(io("connecting the SUBSCRIBE client"))?;
    let mut out = BytesMut::new();
    let connect = Connect {
        client_id: id,
        keep_alive_s: 600,
        clean_session: clean,
        credentials: None,
    };
    put(&mut out, &Packet::Connect(connect))?;
    stream
        .write_all(&out)
        .await
        .map_err(io("sending CONNECT"))?;
    let mut inbuf = BytesMut::new();
    match read(&mut stream, &mut inbuf).await? {
        FromBroker::ConnAck { code: 0 } => Ok(stream),
        FromBroker::ConnAck { code } => Err(BenchError::Refused { code }),
        other => Err(BenchError::Unexpected {
            got: format!("{other:?}"),
            wanted: "CONNACK",
        }),
    }
}

async fn read(stream: &mut TcpStream, inbuf: &mut BytesMut) -> Result<FromBroker, BenchError> {
    loop {
        if let Some(packet) = next(inbuf)? {
            return Ok(packet);
        }
        let stall = std::time::Duration::from_secs(30);
        let read = tokio::time::timeout(stall, stream.read_buf(inbuf))
            .await
            .map_err(|_| BenchError::Silent { after: stall })?
            .map_err(io("reading SUBACKs"))?;
        if read == 0 {
            return Err(BenchError::Closed);
        }
    }
}
