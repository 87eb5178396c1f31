//! Where the local API listens: plain TCP on loopback, or TLS with `[api] tls`.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::serve::ListenerExt as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::tls::{ServedCertificate, TlsListener};
use crate::config::ApiSettings;

pub enum ApiListener {
    Plain(TcpListener),
    Tls(TlsListener, ServedCertificate),
}

impl ApiListener {
    /// Binds `api.listen`, with `api.tls`'s certificate read now when it is set.
    pub async fn bind(api: &ApiSettings) -> anyhow::Result<Self> {
        let tcp = TcpListener::bind(api.listen)
            .await
            .with_context(|| format!("binding the local API to {} (api.listen)", api.listen))?;
        match &api.tls {
            None => Ok(Self::Plain(tcp)),
            Some(files) => {
                let certificate = ServedCertificate::read(files)?;
                Ok(Self::Tls(TlsListener::new(tcp, certificate.clone())?, certificate))
            }
        }
    }

    /// The certificate a TLS listener serves, which a reload reads again.
    pub fn certificate(&self) -> Option<ServedCertificate> {
        match self {
            Self::Plain(_) => None,
            Self::Tls(_, certificate) => Some(certificate.clone()),
        }
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            Self::Plain(tcp) => tcp.local_addr(),
            Self::Tls(tls, _) => axum::serve::Listener::local_addr(tls),
        }
    }

    /// Serves `router` until `stop`, then lets the requests in progress finish.
    /// Serves every connection: see [`crate::serve`] on why the local API has no cap.
    pub async fn serve(self, router: Router, stop: CancellationToken) -> anyhow::Result<()> {
        use crate::serve::Connections;
        match self {
            Self::Plain(tcp) => {
                let tcp = tcp.tap_io(|tcp| prepare_accepted(tcp));
                crate::serve::serve(tcp, router, Connections::Unbounded, stop).await;
            }
            Self::Tls(tls, _) => crate::serve::serve(tls, router, Connections::Unbounded, stop).await,
        }
        Ok(())
    }
}

/// How long an accepted connection may be silent before the kernel starts asking its peer
/// whether it is still there, how far apart it asks, and how many unanswered questions end
/// the connection: a peer that vanished without closing (a laptop that slept, a NAT that
/// forgot the mapping, a network switch) is noticed within [`DEAD_PEER_NOTICED_WITHIN`].
const KEEPALIVE_IDLE: Duration = Duration::from_secs(20);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 3;

/// How long data written to a connection may go unacknowledged before the kernel gives the
/// connection up (Linux's `TCP_USER_TIMEOUT`). Without it a session stream into a dead
/// peer goes on taking heartbeats into its send buffer, and ends only when TCP's own
/// retransmissions give up, about 15 minutes later; until then the agent's slot stays held
/// and its envelopes go nowhere.
const DEAD_PEER_NOTICED_WITHIN: Duration = Duration::from_secs(60);

/// Every accepted local API connection: its writes sent at once, and a dead peer noticed.
pub(super) fn prepare_accepted(tcp: &tokio::net::TcpStream) {
    send_writes_at_once(tcp);
    notice_dead_peers(tcp);
}

/// Each session line is a small write of its own: sent at once, not held back by Nagle's
/// algorithm until the previous one is acknowledged.
fn send_writes_at_once(tcp: &tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY on a local API connection");
    }
}

/// TCP keepalive (and, on Linux, a user timeout) on a connection, so that a session stream
/// whose plugin vanished ends within about a minute and frees the agent's slot. A plugin
/// on this host is noticed at once anyway (its kernel closes the connection).
fn notice_dead_peers(tcp: &tokio::net::TcpStream) {
    let socket = socket2::SockRef::from(tcp);
    let keepalive = socket2::TcpKeepalive::new().with_time(KEEPALIVE_IDLE).with_interval(KEEPALIVE_INTERVAL);
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "macos", target_os = "freebsd"))]
    let keepalive = keepalive.with_retries(KEEPALIVE_PROBES);
    if let Err(e) = socket.set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %e, "could not set TCP keepalive on a local API connection");
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Err(e) = socket.set_tcp_user_timeout(Some(DEAD_PEER_NOTICED_WITHIN)) {
        tracing::debug!(error = %e, "could not set TCP_USER_TIMEOUT on a local API connection");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Keepalive alone notices a silent dead peer within the same minute as the user timeout.
    const _: () = assert!(
        KEEPALIVE_IDLE.as_secs() + KEEPALIVE_PROBES as u64 * KEEPALIVE_INTERVAL.as_secs()
            <= DEAD_PEER_NOTICED_WITHIN.as_secs()
    );

    #[tokio::test]
    async fn an_accepted_connection_asks_after_a_silent_peer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        prepare_accepted(&accepted);
        let socket = socket2::SockRef::from(&accepted);
        assert!(socket.keepalive().unwrap());
        assert!(accepted.nodelay().unwrap());
        #[cfg(target_os = "linux")]
        {
            assert_eq!(socket.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
            assert_eq!(socket.tcp_user_timeout().unwrap(), Some(DEAD_PEER_NOTICED_WITHIN));
        }
        drop(client);
    }
}
