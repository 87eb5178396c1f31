//! A TCP proxy between a plugin and the daemon that a test can break the way networks
//! break: [`CuttableProxy::cut`] closes every connection open now (both sides see it),
//! [`CuttableProxy::stall`] stops them silently (nothing more goes through, both sockets
//! stay open, as across a NAT that forgot the connection or a laptop that slept), and
//! [`CuttableProxy::refuse`] turns new connections away until [`CuttableProxy::admit`].

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

pub struct CuttableProxy {
    pub addr: SocketAddr,
    /// What breaks the connections open now; each break starts a fresh set for later ones.
    current: Arc<Mutex<Breaks>>,
    /// New connections are closed at once while set.
    refusing: Arc<AtomicBool>,
}

#[derive(Clone, Default)]
struct Breaks {
    cut: CancellationToken,
    stall: CancellationToken,
}

impl CuttableProxy {
    pub async fn to(daemon: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let current = Arc::new(Mutex::new(Breaks::default()));
        let refusing = Arc::new(AtomicBool::new(false));
        let (breaks, refused) = (Arc::clone(&current), Arc::clone(&refusing));
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if refused.load(Ordering::SeqCst) {
                    continue;
                }
                let Breaks { cut, stall } = breaks.lock().unwrap().clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(daemon).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        () = cut.cancelled() => {}
                        // Both sockets are kept, unread, until the connection is cut.
                        () = stall.cancelled() => cut.cancelled().await,
                    }
                });
            }
        });
        Self { addr, current, refusing }
    }

    /// Cuts every connection open now; later ones go through.
    pub fn cut(&self) {
        let mut current = self.current.lock().unwrap();
        current.cut.cancel();
        *current = Breaks::default();
    }

    /// Stops every connection open now without closing it; later ones go through.
    pub fn stall(&self) {
        let mut current = self.current.lock().unwrap();
        current.stall.cancel();
        // A later cut still closes the stalled ones.
        current.stall = CancellationToken::new();
    }

    /// Closes new connections as they come, until [`Self::admit`].
    pub fn refuse(&self) {
        self.refusing.store(true, Ordering::SeqCst);
    }

    pub fn admit(&self) {
        self.refusing.store(false, Ordering::SeqCst);
    }
}
