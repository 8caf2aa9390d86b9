//! One Kafka client connection: reads request frames, decodes each header, dispatches it, and
//! writes the answers in request order. Requests are read ahead while earlier answers wait (a
//! produce for its fdatasync, a fetch for data), at most [`MAX_IN_FLIGHT`] of them, so a
//! pipelining producer keeps the group commit busy. Generic over the byte stream, so a TLS
//! stream serves the same way.
//!
//! It never interprets a request body (that is `api/`), except the bare SASL tokens that follow
//! a SaslHandshake v0, and it closes the connection on a request it cannot answer, or after a
//! failed authentication, as Apache Kafka does.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

use crate::api::{self, Conn, Ctx, Reply};
use crate::frame;
use crate::header;
use crate::sasl::Step;
use tern_log::LogPort;

/// Requests read ahead of their answers, per connection (Kafka's producers send at most 5).
pub const MAX_IN_FLIGHT: usize = 16;

/// An answer waiting for its turn: the response header and the reply.
struct Answer {
    header: Bytes,
    reply: Reply,
}

/// Serves one connection until the client leaves, a request cannot be answered, or shutdown;
/// answers already accepted are written before the connection closes.
pub async fn serve<S, L>(stream: S, ctx: Arc<Ctx<L>>, conn: Conn)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
    L: LogPort,
{
    let (reader, writer) = tokio::io::split(stream);
    let (tx, rx) = mpsc::channel(MAX_IN_FLIGHT);
    let peer = conn.peer;
    tokio::join!(
        read_loop(reader, &ctx, conn, tx),
        write_loop(writer, rx, peer)
    );
    tracing::debug!(%peer, "kafka connection closed");
}

async fn read_loop<R: AsyncRead + Unpin, L: LogPort>(
    mut reader: R,
    ctx: &Ctx<L>,
    mut conn: Conn,
    tx: mpsc::Sender<Answer>,
) {
    let max = usize::try_from(ctx.config.max_request_size.0).unwrap_or(usize::MAX);
    let mut shutdown = ctx.shutdown.clone();
    loop {
        let frame = tokio::select! {
            () = shutdown.wait() => break,
            () = tx.closed() => break,
            frame = frame::read_frame(&mut reader, max) => frame,
        };
        let frame = match frame {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(err) => {
                tracing::debug!(peer = %conn.peer, %err, "kafka connection ends");
                break;
            }
        };
        if conn.sasl.raw_tokens() {
            // After SaslHandshake v0: a bare token, answered by a bare token; a failure closes.
            let users = ctx.security.as_deref().and_then(|s| s.users());
            let token = match conn.sasl.authenticate(&frame, users, conn.peer.ip()).await {
                Step::Continue(token) | Step::Done(token) => token,
                Step::Failed(err) => {
                    tracing::info!(peer = %conn.peer, %err, "kafka SASL authentication failed");
                    break;
                }
                Step::Illegal => break,
            };
            let answer = Answer {
                header: Bytes::new(),
                reply: Reply::Now(Bytes::from(token)),
            };
            if tx.send(answer).await.is_err() {
                break;
            }
            continue;
        }
        let request = match header::decode(Bytes::from(frame)) {
            Ok(request) => request,
            Err(err) => {
                tracing::warn!(peer = %conn.peer, %err, "closing a Kafka connection");
                break;
            }
        };
        let reply = match api::dispatch(ctx, &mut conn, &request).await {
            Ok(Reply::Nothing) => continue,
            Ok(reply) => reply,
            Err(err) => {
                tracing::warn!(
                    peer = %conn.peer,
                    client_id = %clip(request.client_id()),
                    %err,
                    "closing a Kafka connection"
                );
                break;
            }
        };
        let answer = Answer {
            header: header::encode_response_header(&request),
            reply,
        };
        if tx.send(answer).await.is_err() || conn.sasl.failed() {
            // A failed SASL exchange closes once its answer is written.
            break;
        }
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    writer: W,
    mut rx: mpsc::Receiver<Answer>,
    peer: SocketAddr,
) {
    let mut writer = BufWriter::new(writer);
    while let Some(answer) = rx.recv().await {
        let body = match answer.reply {
            Reply::Now(body) => body,
            Reply::Later(pending) => match pending.0.await {
                Ok(body) => body,
                Err(err) => {
                    tracing::warn!(%peer, %err, "closing a Kafka connection");
                    break;
                }
            },
            Reply::Nothing => continue,
        };
        let written = async {
            frame::write_frame(&mut writer, &[&answer.header, &body]).await?;
            if rx.is_empty() {
                writer.flush().await?;
            }
            std::io::Result::Ok(())
        };
        if let Err(err) = written.await {
            tracing::debug!(%peer, %err, "kafka client gone");
            return;
        }
    }
    let _ = writer.shutdown().await;
}

/// Client input in a log line: at most 64 characters, control characters escaped.
fn clip(text: &str) -> String {
    text.chars().take(64).flat_map(char::escape_debug).collect()
}

#[cfg(test)]
mod test;
