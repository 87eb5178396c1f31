//! A TCP proxy between the daemon and PostgreSQL that can lose the answer to a COMMIT: the
//! server commits, and the daemon's connection closes before the answer reaches it, as when
//! the network or a connection pooler fails at that moment. From its side the daemon
//! cannot tell whether its transaction committed.
//!
//! The proxy turns TLS down, so it reads the frontend protocol in the clear, and follows
//! the statements each connection's transaction runs, to lose the answer to the COMMIT of
//! the transaction a test names by one of its statements.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// The startup codes of the requests for an encrypted connection (SSL, GSSAPI).
const ENCRYPTION_REQUESTS: [i32; 2] = [80_877_103, 80_877_104];

pub struct PostgresProxy {
    pub addr: SocketAddr,
    /// A statement's text (a part of it): the next COMMIT of a transaction that ran it
    /// loses its answer.
    armed: Arc<Mutex<Option<String>>>,
    /// How many answers were lost.
    lost: Arc<AtomicUsize>,
}

impl PostgresProxy {
    /// A proxy to `server`, on a thread and a runtime of its own: it goes on carrying the
    /// daemon's statements while the test blocks (in [`super::daemon::TestDaemon::launch`],
    /// say).
    pub fn to(server: SocketAddr) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let armed = Arc::new(Mutex::new(None));
        let lost = Arc::new(AtomicUsize::new(0));
        let (connections_armed, connections_lost) = (Arc::clone(&armed), Arc::clone(&lost));
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                while let Ok((client, _)) = listener.accept().await {
                    let (armed, lost) = (Arc::clone(&connections_armed), Arc::clone(&connections_lost));
                    tokio::spawn(async move {
                        let Ok(server) = TcpStream::connect(server).await else { return };
                        let _ = carry(client, server, armed, lost).await;
                    });
                }
            });
        });
        Self { addr, armed, lost }
    }

    /// `url` (a PostgreSQL URL naming the machine's server) through this proxy.
    pub fn url_through(&self, url: &str) -> String {
        let mut through = reqwest::Url::parse(url).expect("a PostgreSQL URL");
        through.set_host(Some(&self.addr.ip().to_string())).expect("a host");
        through.set_port(Some(self.addr.port())).expect("a port");
        through.to_string()
    }

    /// The server a PostgreSQL `url` names (host and port; 5432 when it names none).
    pub fn server_of(url: &str) -> SocketAddr {
        use std::net::ToSocketAddrs;
        let parsed = reqwest::Url::parse(url).expect("a PostgreSQL URL");
        let host = parsed.host_str().expect("a host");
        (host, parsed.port().unwrap_or(5432)).to_socket_addrs().expect("a resolvable host").next().unwrap()
    }

    /// The server carries out the next COMMIT of a transaction that ran a statement
    /// containing `statement`; its connection closes before the answer is passed on.
    pub fn lose_next_commit_answer_after(&self, statement: &str) {
        *self.armed.lock().unwrap() = Some(statement.to_owned());
    }

    pub fn answers_lost(&self) -> usize {
        self.lost.load(Ordering::SeqCst)
    }

    pub async fn wait_for_a_lost_answer(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.answers_lost() == 0 {
            assert!(tokio::time::Instant::now() < deadline, "no COMMIT's answer was lost within {within:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn carry(
    mut client: TcpStream,
    mut server: TcpStream,
    armed: Arc<Mutex<Option<String>>>,
    lost: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    // The startup message, after any request for encryption, which is turned down.
    let startup = loop {
        let length = client.read_i32().await?;
        let mut body = vec![0; usize::try_from(length - 4).unwrap()];
        client.read_exact(&mut body).await?;
        if body.len() == 4 && ENCRYPTION_REQUESTS.contains(&i32::from_be_bytes(body[..4].try_into().unwrap()))
        {
            client.write_all(b"N").await?;
            continue;
        }
        break [length.to_be_bytes().to_vec(), body].concat();
    };
    server.write_all(&startup).await?;
    let (client_reads, client_writes) = client.into_split();
    let (server_reads, server_writes) = server.into_split();
    let swallowing = Arc::new(AtomicBool::new(false));
    let to_server = frontend(client_reads, server_writes, armed, Arc::clone(&swallowing));
    let to_client = backend(server_reads, client_writes, swallowing, lost);
    // Either side ending ends the connection: dropping the halves closes both sockets.
    tokio::select! {
        _ = to_server => {}
        _ = to_client => {}
    }
    Ok(())
}

/// One protocol message: its type byte and its whole frame.
async fn message(reads: &mut OwnedReadHalf) -> std::io::Result<(u8, Vec<u8>)> {
    let kind = reads.read_u8().await?;
    let length = reads.read_i32().await?;
    let mut frame = Vec::with_capacity(usize::try_from(length + 1).unwrap());
    frame.push(kind);
    frame.extend_from_slice(&length.to_be_bytes());
    frame.resize(usize::try_from(length + 1).unwrap(), 0);
    reads.read_exact(&mut frame[5..]).await?;
    Ok((kind, frame))
}

/// The zero-terminated strings at the start of a message's body.
fn strings(frame: &[u8]) -> impl Iterator<Item = String> + '_ {
    frame[5..].split(|byte| *byte == 0).map(|text| String::from_utf8_lossy(text).into_owned())
}

/// The daemon's messages, passed on; a COMMIT that loses its answer sets `swallowing`
/// before it goes.
async fn frontend(
    mut reads: OwnedReadHalf,
    mut writes: OwnedWriteHalf,
    armed: Arc<Mutex<Option<String>>>,
    swallowing: Arc<AtomicBool>,
) -> std::io::Result<()> {
    let mut prepared: HashMap<String, String> = HashMap::new();
    let mut transaction: Vec<String> = Vec::new();
    loop {
        let (kind, frame) = message(&mut reads).await?;
        match kind {
            b'P' => {
                let mut parts = strings(&frame);
                let (name, query) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
                prepared.insert(name, query);
            }
            b'B' => {
                let statement = strings(&frame).nth(1).unwrap_or_default();
                transaction.extend(prepared.get(&statement).cloned());
            }
            b'Q' => {
                let query = strings(&frame).next().unwrap_or_default();
                match query.trim().to_ascii_uppercase().as_str() {
                    "COMMIT" => {
                        let mut armed = armed.lock().unwrap();
                        let ran =
                            |statement: &String| transaction.iter().any(|query| query.contains(statement));
                        if armed.as_ref().is_some_and(ran) {
                            *armed = None;
                            swallowing.store(true, Ordering::SeqCst);
                        }
                        transaction.clear();
                    }
                    "ROLLBACK" | "BEGIN" => transaction.clear(),
                    _ => transaction.push(query),
                }
            }
            _ => {}
        }
        writes.write_all(&frame).await?;
    }
}

/// The server's messages, passed on until an answer is swallowed: then the connection ends
/// once the server says it is ready again (the COMMIT carried out).
async fn backend(
    mut reads: OwnedReadHalf,
    mut writes: OwnedWriteHalf,
    swallowing: Arc<AtomicBool>,
    lost: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    loop {
        let (kind, frame) = message(&mut reads).await?;
        if swallowing.load(Ordering::SeqCst) {
            if kind == b'Z' {
                lost.fetch_add(1, Ordering::SeqCst);
                return Ok(());
            }
            continue;
        }
        writes.write_all(&frame).await?;
    }
}
