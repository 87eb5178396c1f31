//! Serving HTTP on a listener that may be open to a network: the local API, the health
//! listener and the webhook. `axum::serve` sets no timer, so a client that opens a
//! connection and never finishes its request's headers holds it (and a file descriptor)
//! for good, and a thousand such clients leave the daemon no descriptor for Telegram, the
//! database or the ledger. Here a request's headers must arrive within
//! [`HEADER_READ_TIMEOUT`], on every listener. The listeners open to anyone (the health
//! routes, the webhook) also serve at most [`MAX_CONNECTIONS`] at once (more wait in the
//! kernel's backlog). The local API has no cap: its clients are agents' plugins, which
//! may open many short connections while they reconnect (a cap they fill would hold every
//! tool call), and a connection is closed within the timeout once idle. A response that
//! streams (a session) is bound by neither.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::serve::Listener;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// How long a client has to send a request's headers, once it starts one (and between two
/// requests of a kept-alive connection: an idle one is closed after this).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the requests in progress at a stop have to finish. A client that is still
/// sending after it (stalled, or slow on purpose) is cut off: it must not hold a stopping
/// daemon, or a standby elected while it relayed a delivery (whose lease would lapse
/// meanwhile). Telegram delivers a cut-off update again.
pub const DRAIN_WITHIN: Duration = Duration::from_secs(5);

/// Connections served at once by a listener open to anyone: well above what a load
/// balancer's probes and Telegram's webhook deliveries (40 at most by default) open.
pub const MAX_CONNECTIONS: usize = 256;

/// How many connections a listener serves at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connections {
    /// The local API: its clients are the agents' plugins.
    Unbounded,
    /// A listener open to anyone: at most [`MAX_CONNECTIONS`].
    Bounded,
}

/// Serves `router` on `listener` until `stop`, then lets go of the address at once and
/// lets the requests in progress finish within [`DRAIN_WITHIN`] (a session stream ends
/// when the router's own shutdown ends it).
pub async fn serve<L: Listener>(
    listener: L,
    router: Router,
    connections: Connections,
    stop: CancellationToken,
) {
    serve_within(listener, router, connections, stop, HEADER_READ_TIMEOUT, DRAIN_WITHIN).await;
}

async fn serve_within<L: Listener>(
    mut listener: L,
    router: Router,
    connections: Connections,
    stop: CancellationToken,
    header_read_timeout: Duration,
    drain_within: Duration,
) {
    let graceful = GracefulShutdown::new();
    let cut_off = CancellationToken::new();
    let cap = match connections {
        Connections::Unbounded => Semaphore::MAX_PERMITS,
        Connections::Bounded => MAX_CONNECTIONS,
    };
    let permits = Arc::new(Semaphore::new(cap));
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(header_read_timeout);
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => permit.expect("the semaphore is never closed"),
            () = stop.cancelled() => break,
        };
        let (io, _) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(io), service));
        let cut_off = cut_off.clone();
        tokio::spawn(async move {
            tokio::select! {
                ended = connection => {
                    if let Err(error) = ended {
                        tracing::debug!(%error, "an HTTP connection ended with an error");
                    }
                }
                // Dropping the connection closes its socket.
                () = cut_off.cancelled() => {}
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(drain_within, graceful.shutdown()).await.is_err() {
        tracing::warn!(
            within = ?drain_within,
            "requests still in progress at a stop were cut off (a client sending too slowly)"
        );
        cut_off.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// `router` served on a port of its own, bounded, with these timeouts; its address, the
    /// token that stops it and the task serving it.
    async fn serving(
        router: Router,
        header_read_timeout: Duration,
        drain_within: Duration,
    ) -> (std::net::SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let serving = serve_within(
            listener,
            router,
            Connections::Bounded,
            stop.clone(),
            header_read_timeout,
            drain_within,
        );
        (address, stop, tokio::spawn(serving))
    }

    /// A client that starts a request and never finishes its headers is cut off; one that
    /// sends a whole request is answered.
    #[tokio::test]
    async fn a_request_whose_headers_never_end_is_cut_off() {
        let timeout = Duration::from_millis(300);
        let router = Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        let (address, stop, server) = serving(router, timeout, timeout).await;

        let mut slow = tokio::net::TcpStream::connect(address).await.unwrap();
        slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        let mut whole = tokio::net::TcpStream::connect(address).await.unwrap();
        whole.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut answer = String::new();
        whole.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"), "{answer}");

        let mut rest = Vec::new();
        let read = tokio::time::timeout(timeout * 10, slow.read_to_end(&mut rest));
        read.await.expect("the server closes the connection once the timeout has passed").ok();
        stop.cancel();
        server.await.unwrap();
    }

    /// A client whose body stalls holds no stop: the address is free at once, and the
    /// request is cut off once the drain is over.
    #[tokio::test]
    async fn a_stop_frees_the_address_at_once_and_cuts_off_a_stalled_body() {
        let drain = Duration::from_millis(300);
        let router = Router::new().route("/hook", axum::routing::post(|body: String| async move { body }));
        let (address, stop, server) = serving(router, Duration::from_secs(30), drain).await;

        let mut stalled = tokio::net::TcpStream::connect(address).await.unwrap();
        stalled
            .write_all(b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.cancel();
        tokio::time::sleep(Duration::from_millis(50)).await;
        tokio::net::TcpListener::bind(address).await.expect("the address is free while the request drains");
        tokio::time::timeout(drain * 10, server).await.expect("the stop ends after the drain").unwrap();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(drain * 10, stalled.read_to_end(&mut rest));
        read.await.expect("the stalled request was cut off").ok();
    }
}
