//! Where the local API listens: plain TCP on loopback, or TLS with `[api] tls`.

use std::net::SocketAddr;

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
                let tcp = tcp.tap_io(|tcp| send_writes_at_once(tcp));
                crate::serve::serve(tcp, router, Connections::Unbounded, stop).await;
            }
            Self::Tls(tls, _) => crate::serve::serve(tls, router, Connections::Unbounded, stop).await,
        }
        Ok(())
    }
}

/// Each session line is a small write of its own: sent at once, not held back by Nagle's
/// algorithm until the previous one is acknowledged.
pub(super) fn send_writes_at_once(tcp: &tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY on a local API connection");
    }
}
