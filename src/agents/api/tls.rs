//! The local API over TLS (`[api] tls`), for plugins on other machines: the daemon's
//! certificate, and a listener that hands axum connections whose handshake is done.
//!
//! The handshakes run beside the accept loop, each on a task of its own with a deadline,
//! so a client that opens a connection and never finishes its handshake holds up nobody.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_util::task::AbortOnDropHandle;

use crate::config::ApiTls;

/// Long enough for a plugin across a slow network; a peer that takes longer is not one.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections whose handshake is done and that axum has not taken yet.
const HANDSHAKEN_BACKLOG: usize = 64;

/// After an accept error that is not one connection's (out of file descriptors): a pause,
/// as axum's own listener makes, instead of a loop that spins.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// The daemon's TLS configuration from `api.tls`'s files, read now: an unreadable file, a
/// file with no certificate or no key, or a key that does not match fails here, naming
/// the file.
pub fn server_config(tls: &ApiTls) -> anyhow::Result<Arc<ServerConfig>> {
    let chain = CertificateDer::pem_file_iter(&tls.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("api.tls.cert: reading certificates (PEM) from {}", tls.cert.display()))?;
    if chain.is_empty() {
        anyhow::bail!("api.tls.cert: {} holds no certificate (PEM, BEGIN CERTIFICATE)", tls.cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(&tls.key)
        .with_context(|| format!("api.tls.key: reading a private key (PEM) from {}", tls.key.display()))?;
    let config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .context("api.tls: the TLS versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .with_context(|| {
            format!(
                "api.tls: the key in {} does not fit the certificate in {}",
                tls.key.display(),
                tls.cert.display()
            )
        })?;
    Ok(Arc::new(config))
}

/// A listener whose connections have finished their TLS handshake.
pub struct TlsListener {
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
    /// Accepting and shaking hands stop when axum drops the listener.
    _accepting: AbortOnDropHandle<()>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> io::Result<Self> {
        let local_addr = tcp.local_addr()?;
        let (handshaken, to_axum) = mpsc::channel(HANDSHAKEN_BACKLOG);
        let accepting = tokio::spawn(accept_and_shake_hands(tcp, TlsAcceptor::from(config), handshaken));
        Ok(Self { handshaken: to_axum, local_addr, _accepting: AbortOnDropHandle::new(accepting) })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(connection) => connection,
            // The accepting task ends only once this receiver is gone.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}

async fn accept_and_shake_hands(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    handshaken: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            accepted = tcp.accept() => match accepted {
                Ok((stream, peer)) => {
                    super::listener::send_writes_at_once(&stream);
                    let acceptor = acceptor.clone();
                    handshakes.spawn(async move {
                        (tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await, peer)
                    });
                }
                Err(e) if is_one_connections_error(&e) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "the local API could not accept a connection");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            },
            Some(done) = handshakes.join_next() => match done {
                Ok((Ok(Ok(stream)), peer)) => {
                    if handshaken.send((stream, peer)).await.is_err() {
                        return;
                    }
                }
                // A plugin with the wrong CA, a port scanner, a plain-HTTP client: the
                // peer's problem, seen in its own logs.
                Ok((Ok(Err(e)), peer)) => tracing::debug!(%peer, error = %e, "a TLS handshake on the local API failed"),
                Ok((Err(_), peer)) => tracing::debug!(%peer, "a TLS handshake on the local API took too long"),
                Err(e) => tracing::warn!(error = %e, "a TLS handshake task of the local API failed"),
            },
        }
    }
}

/// Errors that end one connection, not the listener (as hyper's and axum's servers tell them).
fn is_one_connections_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}
