//! The local API over TLS (`[api] tls`), for plugins on other machines: the daemon's
//! certificate, and a listener that hands axum connections whose handshake is done.
//!
//! The handshakes run beside the accept loop, each on a task of its own with a deadline,
//! so a client that opens a connection and never finishes its handshake holds up nobody.
//!
//! Certificates are renewed while the daemon runs (Let's Encrypt's last 90 days, a
//! private CA's often less): SIGHUP reads `api.tls`'s files again ([`ServedCertificate::
//! read_again`]), and each handshake from then on uses what they hold. A pair that cannot
//! be served (a renewal half written, a key that does not fit) is refused and the running
//! certificate stays, so a reload can never leave the local API without one. Connections
//! already open keep the certificate they were made with.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
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

/// The certificate the local API serves, and the files it came from.
#[derive(Clone)]
pub struct ServedCertificate {
    files: ApiTls,
    /// What each handshake reads, and a reload replaces.
    current: Arc<RwLock<Certificate>>,
}

/// One reading of the files: the chain and the client CAs, to tell a renewal from the same
/// files read again, when its certificate expires, and the configuration handshakes use.
struct Certificate {
    chain: Vec<CertificateDer<'static>>,
    client_cas: Vec<CertificateDer<'static>>,
    expires_at: DateTime<Utc>,
    config: Arc<ServerConfig>,
}

/// Under this long before its certificate expires, a daemon that reads it says so.
const EXPIRY_WARNING: chrono::TimeDelta = chrono::TimeDelta::days(14);

/// What reading the files again found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reread {
    /// A certificate other than the one served: served from now on.
    Renewed,
    /// The one served already.
    Unchanged,
}

impl ServedCertificate {
    /// Reads `files` now; fails as [`server_config`] does.
    pub fn read(files: &ApiTls) -> anyhow::Result<Self> {
        Ok(Self { files: files.clone(), current: Arc::new(RwLock::new(read(files)?)) })
    }

    /// Reads the same files again. A pair that can be served replaces the served one for
    /// every handshake after this; one that cannot is the error, and changes nothing.
    pub fn read_again(&self) -> anyhow::Result<Reread> {
        let fresh = read(&self.files)?;
        let mut served = self.current.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if served.chain == fresh.chain && served.client_cas == fresh.client_cas {
            return Ok(Reread::Unchanged);
        }
        *served = fresh;
        Ok(Reread::Renewed)
    }

    /// When the certificate served now expires.
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.current.read().unwrap_or_else(|poisoned| poisoned.into_inner()).expires_at
    }

    /// The files, as `api.tls` names them.
    pub fn files(&self) -> &ApiTls {
        &self.files
    }

    fn config_now(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.current.read().unwrap_or_else(|poisoned| poisoned.into_inner()).config)
    }
}

fn read(files: &ApiTls) -> anyhow::Result<Certificate> {
    let Served { chain, client_cas, config } = served(files)?;
    let expires_at = expiry_of(&chain[0]).with_context(|| {
        format!("api.tls.cert: reading the first certificate of {}", files.cert.display())
    })?;
    let left = expires_at - Utc::now();
    if left <= chrono::TimeDelta::zero() {
        tracing::error!(
            cert = %files.cert.display(), %expires_at,
            "api.tls: the certificate has expired: plugins will refuse it; renew it and send SIGHUP"
        );
    } else if left < EXPIRY_WARNING {
        tracing::warn!(
            cert = %files.cert.display(), %expires_at, days_left = left.num_days(),
            "api.tls: the certificate expires soon; renew it and send SIGHUP"
        );
    }
    Ok(Certificate { chain, client_cas, expires_at, config })
}

/// When a certificate stops being valid (its `notAfter`).
fn expiry_of(certificate: &CertificateDer<'_>) -> anyhow::Result<DateTime<Utc>> {
    let (_, parsed) = x509_parser::parse_x509_certificate(certificate.as_ref())
        .map_err(|e| anyhow::anyhow!("not an X.509 certificate: {e}"))?;
    let seconds = parsed.validity().not_after.timestamp();
    DateTime::from_timestamp(seconds, 0).context("its expiry is out of range")
}

/// The daemon's TLS configuration from `api.tls`'s files, read now: an unreadable file, a
/// file with no certificate or no key, a key that does not match, or a client CA file with
/// no usable certificate fails here, naming the file.
pub fn server_config(tls: &ApiTls) -> anyhow::Result<Arc<ServerConfig>> {
    served(tls).map(|served| served.config)
}

/// What `api.tls`'s files hold, and the configuration built from them.
struct Served {
    chain: Vec<CertificateDer<'static>>,
    client_cas: Vec<CertificateDer<'static>>,
    config: Arc<ServerConfig>,
}

fn certificates_in(file: &Path, key: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certificates = CertificateDer::pem_file_iter(file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("{key}: reading certificates (PEM) from {}", file.display()))?;
    if certificates.is_empty() {
        anyhow::bail!("{key}: {} holds no certificate (PEM, BEGIN CERTIFICATE)", file.display());
    }
    Ok(certificates)
}

fn served(tls: &ApiTls) -> anyhow::Result<Served> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates_in(&tls.cert, "api.tls.cert")?;
    let key = PrivateKeyDer::from_pem_file(&tls.key)
        .with_context(|| format!("api.tls.key: reading a private key (PEM) from {}", tls.key.display()))?;
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .context("api.tls: the TLS versions")?;
    let (builder, client_cas) = match &tls.client_ca {
        None => (builder.with_no_client_auth(), Vec::new()),
        Some(file) => {
            let client_cas = certificates_in(file, "api.tls.client_ca")?;
            let mut roots = rustls::RootCertStore::empty();
            for ca in &client_cas {
                roots.add(ca.clone()).with_context(|| {
                    format!("api.tls.client_ca: a certificate in {} cannot be a CA to trust", file.display())
                })?;
            }
            // Every connection must show a certificate one of these CAs signed, or its
            // handshake fails: nothing of the API is reachable without one.
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .with_context(|| format!("api.tls.client_ca: {}", file.display()))?;
            (builder.with_client_cert_verifier(verifier), client_cas)
        }
    };
    let config = builder.with_single_cert(chain.clone(), key).with_context(|| {
        format!(
            "api.tls: the key in {} does not fit the certificate in {}",
            tls.key.display(),
            tls.cert.display()
        )
    })?;
    Ok(Served { chain, client_cas, config: Arc::new(config) })
}

/// A listener whose connections have finished their TLS handshake.
pub struct TlsListener {
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
    /// Accepting and shaking hands stop when axum drops the listener.
    _accepting: AbortOnDropHandle<()>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, certificate: ServedCertificate) -> io::Result<Self> {
        let local_addr = tcp.local_addr()?;
        let (handshaken, to_axum) = mpsc::channel(HANDSHAKEN_BACKLOG);
        let accepting = tokio::spawn(accept_and_shake_hands(tcp, certificate, handshaken));
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
    certificate: ServedCertificate,
    handshaken: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            accepted = tcp.accept() => match accepted {
                Ok((stream, peer)) => {
                    super::listener::prepare_accepted(&stream);
                    // The certificate served now: a renewal applies from the next handshake.
                    let acceptor = TlsAcceptor::from(certificate.config_now());
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use rcgen::{CertificateParams, KeyPair};

    use super::*;

    /// A self-signed certificate for localhost written to `cert`, and its key to `key` if
    /// given (without, the certificate is a renewal half written).
    fn write_certificate(cert: &Path, key: Option<&Path>) {
        let pair = KeyPair::generate().unwrap();
        let certificate =
            CertificateParams::new(vec!["localhost".to_owned()]).unwrap().self_signed(&pair).unwrap();
        std::fs::write(cert, certificate.pem()).unwrap();
        if let Some(key) = key {
            std::fs::write(key, pair.serialize_pem()).unwrap();
        }
    }

    #[test]
    fn client_cas_are_read_with_the_pair_and_a_changed_set_is_served_after_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let files = ApiTls {
            cert: dir.path().join("cert.pem"),
            key: dir.path().join("key.pem"),
            client_ca: Some(dir.path().join("clients.pem")),
        };
        write_certificate(&files.cert, Some(&files.key));
        let client_ca = files.client_ca.as_deref().unwrap();
        std::fs::write(client_ca, "not PEM").unwrap();
        let refused = ServedCertificate::read(&files).err().expect("a client CA file with no certificate");
        assert!(format!("{refused:#}").contains("api.tls.client_ca"), "{refused:#}");

        write_certificate(client_ca, None);
        let served = ServedCertificate::read(&files).unwrap();
        assert_eq!(served.read_again().unwrap(), Reread::Unchanged);
        // Another CA for clients, the daemon's own pair unchanged: served from the next
        // handshake, as a renewal is.
        write_certificate(client_ca, None);
        assert_eq!(served.read_again().unwrap(), Reread::Renewed);
    }

    #[test]
    fn an_expired_certificate_is_still_served_and_says_when_it_expired() {
        let dir = tempfile::tempdir().unwrap();
        let files =
            ApiTls { cert: dir.path().join("cert.pem"), key: dir.path().join("key.pem"), client_ca: None };
        let pair = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        std::fs::write(&files.cert, params.self_signed(&pair).unwrap().pem()).unwrap();
        std::fs::write(&files.key, pair.serialize_pem()).unwrap();
        // Refusing it would take the local API away for what the operator can fix with a
        // renewal and SIGHUP; the daemon logs it as an error instead.
        let served = ServedCertificate::read(&files).unwrap();
        assert_eq!(served.expires_at().to_rfc3339(), "2021-01-01T00:00:00+00:00");
    }

    #[test]
    fn a_renewed_pair_is_served_from_the_next_handshake_and_one_that_cannot_be_served_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let files =
            ApiTls { cert: dir.path().join("cert.pem"), key: dir.path().join("key.pem"), client_ca: None };
        write_certificate(&files.cert, Some(&files.key));
        let served = ServedCertificate::read(&files).unwrap();
        let first = served.config_now();

        assert_eq!(served.read_again().unwrap(), Reread::Unchanged);
        assert!(
            Arc::ptr_eq(&first, &served.config_now()),
            "the same files read again serve what they served"
        );

        // rcgen's certificates are valid until 4096 unless told otherwise.
        assert_eq!(served.expires_at().format("%Y").to_string(), "4096");

        write_certificate(&files.cert, Some(&files.key));
        assert_eq!(served.read_again().unwrap(), Reread::Renewed);
        let renewed = served.config_now();
        assert!(!Arc::ptr_eq(&first, &renewed), "a renewal is served");

        // A renewal half written: the new certificate beside the old key.
        write_certificate(&files.cert, None);
        let refused = served.read_again().unwrap_err().to_string();
        assert!(refused.contains("does not fit"), "{refused}");
        assert!(Arc::ptr_eq(&renewed, &served.config_now()), "the running certificate stays");

        std::fs::write(&files.cert, "not a certificate").unwrap();
        assert!(served.read_again().is_err());
        assert!(Arc::ptr_eq(&renewed, &served.config_now()), "the running certificate stays");
    }
}
