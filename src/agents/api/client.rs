//! The channel plugin's client for the daemon's local API. The routes and shapes are in
//! [`super::wire`]; this module adds what a caller needs to act on a failure: whether the
//! request reached the daemon at all, whether its outcome is known, and what the daemon
//! said when it refused.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};
use tokio_util::io::StreamReader;

use super::wire::{
    API_PREFIX, ATTACHMENT_KIND_HEADER, AckReceipt, AckRequest, ApiError, AttachmentQuery, EditRequest,
    ErrorCode, FILE_NAME_HEADER, FILE_SIZE_HEADER, HandoffReceipt, HandoffRequest, MAX_SHOWN_IN_HEADER,
    MISSED_HEARTBEATS, MessageActionReceipt, PLUGIN_HEADER, PendingList, PermissionReceipt,
    PermissionRequest, ReactRequest, ReplyReceipt, ReplyRequest, RevisionReceipt, RevisionRequest,
    SESSION_HEADER, SHOWN_HEADER, SessionEvent, ShownReceipt, ShownRequest, UploadReceipt,
};
use crate::config::{ApiSettings, ClientIdentity, DaemonUrl};
use crate::ids::{AgentName, Secret};

/// A daemon on loopback or a private network accepts at once: a connection (and its TLS
/// handshake) not made by then is not coming, and the next replica may be tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Answers to `pending` and `ack` are a database read or write away.
const QUERY_TIMEOUT: Duration = Duration::from_secs(15);

/// A reply may legitimately take minutes: the daemon waits out Telegram's rate limits
/// (`retry_after`) and sends a long text as several messages before it answers. Giving up
/// early would turn a delivered reply into one whose outcome the agent cannot know.
const REPLY_TIMEOUT: Duration = Duration::from_secs(300);

// The daemon's rate-limit waits must end well before the plugin stops waiting for them.
const _: () = assert!(REPLY_TIMEOUT.as_secs() >= 2 * crate::telegram::outbound::MAX_REPLY_WAIT.as_secs());

/// A permission request is answered once its prompt's send is classified, which waits
/// out Telegram's rate limits for up to a minute.
const PERMISSION_TIMEOUT: Duration = Duration::from_secs(90);

/// The daemon answers a download once Telegram said where the file is (`getFile`, within
/// `telegram.send_timeout_secs`); the bytes then take as long as they take.
const DOWNLOAD_START_TIMEOUT: Duration = Duration::from_secs(60);

/// Time for one file of a reply (at most 50 MB) to reach the daemon over loopback.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// Far above any envelope the daemon makes (a handoff's text is bounded by the local API's
/// request body, a room turn's transcript by `TRANSCRIPT_MAX_BYTES`); only a broken peer
/// sends a line this long without a newline. Past it the stream cannot go on (a framed
/// reader ends at its first error), and the envelope would be pushed again at every
/// reconnect, so it is far above what the daemon sends rather than near it.
const MAX_SESSION_LINE_BYTES: usize = 16 * 1024 * 1024;

/// A call refused as coming from a session that is no longer live, made while this client
/// had one (its stream just ended, or the daemon restarted), waits this long for the next
/// session and is made once more: the daemon did nothing with it. The plugin's stream
/// reconnects at once when a call waits, and a restarting daemon is back within seconds.
pub const NEXT_SESSION_WAIT: Duration = Duration::from_secs(3);

/// How much of an unexpected body to quote in an error message.
const BODY_PREVIEW_CHARS: usize = 200;

/// A failed call to the daemon, classified by what the caller may do next.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The request never reached the daemon, so nothing happened there; trying again is safe.
    #[error("switchboard daemon at {address} is not reachable: {detail}; is `switchboard run` running?")]
    Unreachable { address: String, detail: String },
    /// The request was sent but no complete answer came back: what the daemon did with it
    /// is unknown.
    #[error("the switchboard daemon at {address} did not answer: {detail}")]
    NoAnswer { address: String, detail: String },
    /// The daemon refused the request; its message is written for the model.
    #[error("{}", .error.message)]
    Refused { status: StatusCode, error: ApiError },
    /// The daemon answered something this client does not understand: another program on
    /// that port, or a daemon of a different version.
    #[error("the switchboard daemon at {address} sent an answer this plugin does not understand: {detail}")]
    Protocol { address: String, detail: String },
}

impl ClientError {
    /// The daemon's error code, when it refused the request.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Self::Refused { error, .. } => Some(error.code),
            _ => None,
        }
    }
}

/// A client of the local API, authenticated as one agent. Cheap to clone: clones share
/// the session, so the tools of a plugin speak for the session its stream opened.
#[derive(Debug, Clone)]
pub struct DaemonClient {
    http: reqwest::Client,
    /// Where the daemon listens (each replica's address, with several); the one in use is
    /// named in every error, so an operator knows which daemon the plugin was looking for.
    daemons: Arc<Daemons>,
    agent: AgentName,
    secret: Secret,
    /// The live session's token (from its `Hello`), sent with every call; `None` while no
    /// session stream of this client is open.
    session: Arc<watch::Sender<Option<String>>>,
    /// Rung by a call that waits for a session: the stream's next attempt to open goes at
    /// once instead of after its backoff (up to seconds, longer than a call waits).
    session_wanted: Arc<tokio::sync::Notify>,
    /// Envelopes pushed into the agent's context that the daemon has not yet been told of,
    /// oldest first: every call carries them in its [`SHOWN_HEADER`].
    unconfirmed: Arc<Mutex<VecDeque<String>>>,
    /// This plugin process's name for itself (`plg_…`), sent when the session stream
    /// opens ([`PLUGIN_HEADER`]): the same across reconnects, so a permission verdict finds
    /// the process that asked even after the daemon restarted.
    plugin: String,
    /// How long a call refused as from a session that just ended waits for the next one
    /// before it is made again ([`DaemonClient::again_after_a_stale_session`]); `None`: it is
    /// not made again. Only a client whose sessions another task reopens (the plugin's
    /// forwarder) waits: one that opens them itself between its calls would wait for
    /// nothing.
    next_session_wait: Option<Duration>,
}

/// Random characters of a plugin process's name: enough that two never meet.
const PLUGIN_SUFFIX_LEN: usize = 16;

/// What a plugin brings to an `https://` daemon.
#[derive(Default)]
pub struct DaemonTls {
    /// Certificates to trust for the daemon's, beside the system's roots (`api.ca`).
    pub trusted: Vec<reqwest::Certificate>,
    /// The certificate it shows a daemon that asks for one (`api.client_cert`).
    pub identity: Option<reqwest::Identity>,
}

impl DaemonTls {
    /// `api.ca`'s certificates and `api.client_cert`'s identity, read now: a file that
    /// cannot be read or holds nothing usable fails, naming its key.
    pub fn from_settings(api: &ApiSettings) -> anyhow::Result<Self> {
        let trusted = match &api.ca {
            Some(ca) => trusted_certificates(ca)?,
            None => Vec::new(),
        };
        let identity = api.client_identity.as_ref().map(client_identity).transpose()?;
        Ok(Self { trusted, identity })
    }
}

/// `api.ca`'s certificates: what the plugin trusts for the daemon's, beside the system's.
fn trusted_certificates(ca: &std::path::Path) -> anyhow::Result<Vec<reqwest::Certificate>> {
    let pem = std::fs::read(ca).with_context(|| format!("api.ca: cannot read {}", ca.display()))?;
    let certificates = reqwest::Certificate::from_pem_bundle(&pem)
        .with_context(|| format!("api.ca: {} is not PEM certificates", ca.display()))?;
    if certificates.is_empty() {
        anyhow::bail!("api.ca: {} holds no certificate (PEM, BEGIN CERTIFICATE)", ca.display());
    }
    Ok(certificates)
}

/// `api.client_cert` and `api.client_key`, read as one identity.
pub fn client_identity(files: &ClientIdentity) -> anyhow::Result<reqwest::Identity> {
    let read = |key: &str, path: &std::path::Path| {
        std::fs::read(path).with_context(|| format!("{key}: cannot read {}", path.display()))
    };
    let mut pem = read("api.client_cert", &files.cert)?;
    pem.push(b'\n');
    pem.extend(read("api.client_key", &files.key)?);
    reqwest::Identity::from_pem(&pem).with_context(|| {
        format!(
            "api.client_cert and api.client_key: {} and {} are not a PEM certificate chain and its private key",
            files.cert.display(),
            files.key.display()
        )
    })
}

impl DaemonClient {
    /// A client of the daemon listening at `address` on this machine, over plain HTTP.
    pub fn new(address: SocketAddr, agent: AgentName, secret: Secret) -> Result<Self, reqwest::Error> {
        Self::for_daemons(vec![DaemonUrl::beside(address, false)], DaemonTls::default(), agent, secret)
    }

    /// A client of the daemon at the first of `daemons` that accepts a connection: with
    /// replicas, the one that leads (the others listen nowhere), over TLS as `tls` says.
    pub fn for_daemons(
        daemons: Vec<DaemonUrl>,
        tls: DaemonTls,
        agent: AgentName,
        secret: Secret,
    ) -> Result<Self, reqwest::Error> {
        assert!(!daemons.is_empty(), "a plugin is given at least one daemon's address");
        let mut http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            // The daemon is ours to reach directly: a proxy from the environment must never
            // see the secret (nor, over TLS, learn where the agents' daemon is).
            .no_proxy();
        for certificate in tls.trusted {
            http = http.add_root_certificate(certificate);
        }
        if let Some(identity) = tls.identity {
            http = http.identity(identity);
        }
        Ok(Self {
            http: http.build()?,
            daemons: Arc::new(Daemons::new(daemons)),
            agent,
            secret,
            session: Arc::new(watch::Sender::new(None)),
            session_wanted: Arc::default(),
            unconfirmed: Arc::default(),
            plugin: format!("plg_{}", crate::ids::random_suffix(PLUGIN_SUFFIX_LEN)),
            next_session_wait: None,
        })
    }

    /// Calls refused as from a session that just ended wait up to `within` for the next
    /// session, which another task reopens, and are made once more.
    pub fn retrying_after_a_stale_session(mut self, within: Duration) -> Self {
        self.next_session_wait = Some(within);
        self
    }

    /// Waits up to `within` for a session stream of this client to be open; true when one is.
    pub async fn wait_for_session(&self, within: Duration) -> bool {
        let mut session = self.session.subscribe();
        if session.borrow().is_none() {
            self.session_wanted.notify_one();
        }
        tokio::time::timeout(within, session.wait_for(Option::is_some)).await.is_ok_and(|found| found.is_ok())
    }

    /// Returns once a call waits for a session ([`Self::wait_for_session`]), or has since
    /// the last time this returned: the session stream's cue to try again now.
    pub async fn session_wanted(&self) {
        self.session_wanted.notified().await;
    }

    /// The daemon's address in use (`scheme://host:port`).
    pub fn address(&self) -> String {
        self.daemons.in_use().origin().to_owned()
    }

    pub fn agent(&self) -> &AgentName {
        &self.agent
    }

    /// Opens the agent's session stream and waits for the daemon's `Hello`, so a returned
    /// stream is a registered session; from then on this client's calls speak for it.
    /// Dropping the stream ends the session.
    pub async fn open_session(&self) -> Result<SessionStream, ClientError> {
        let address = self.address();
        let request = self
            .http
            .get(self.url("session"))
            .bearer_auth(self.secret.expose())
            .header(PLUGIN_HEADER, &self.plugin);
        // No overall timeout: the stream is meant to stay open. Only the headers must come
        // promptly; after that, `SessionStream` watches for missed heartbeats. A daemon that
        // accepts the connection and says nothing (a paused or wedged leader, whose socket
        // the kernel still serves) is passed over like one that refused it: the next
        // attempt goes to the next replica.
        let response = match tokio::time::timeout(QUERY_TIMEOUT, request.send()).await {
            Ok(sent) => sent.map_err(|e| self.transport_error(&e))?,
            Err(_) => {
                self.daemons.pass_over(&address);
                let detail = format!("no answer within {}s", QUERY_TIMEOUT.as_secs());
                return Err(ClientError::NoAnswer { address, detail });
            }
        };
        let response = self.refusal_or(response).await?;
        let body = response.bytes_stream().map_err(std::io::Error::other);
        let lines =
            FramedRead::new(StreamReader::new(body), LinesCodec::new_with_max_length(MAX_SESSION_LINE_BYTES));
        let mut stream = SessionStream {
            lines: lines.boxed(),
            address,
            daemons: Arc::clone(&self.daemons),
            // The daemon says hello as soon as the headers are out; from then on, its
            // heartbeat sets the limit.
            idle_limit: QUERY_TIMEOUT,
            session_id: String::new(),
            token: String::new(),
            session: Arc::clone(&self.session),
        };
        match stream.next_event().await? {
            Some(SessionEvent::Hello { session_id, session_token, heartbeat_ms, .. }) => {
                stream.session_id = session_id;
                stream.token = session_token.clone();
                // A heartbeat announced as faster than once a second is taken as once a
                // second: a daemon of another version cannot make its plugin give up on
                // every stream at once.
                let heartbeat = Duration::from_millis(heartbeat_ms).max(Duration::from_secs(1));
                stream.idle_limit = heartbeat.saturating_mul(MISSED_HEARTBEATS);
                self.session.send_replace(Some(session_token));
                Ok(stream)
            }
            Some(other) => {
                Err(self.protocol(format!("the session stream began with {other:?} instead of hello")))
            }
            None => Err(self.no_answer("the daemon closed the session stream before saying hello".into())),
        }
    }

    /// Tells the daemon this plugin is leaving (its agent session ended), so the agent is
    /// free for the next session at once instead of kept for this one, as after a stream
    /// that broke. Nothing to say without a session.
    pub async fn end_session(&self) -> Result<(), ClientError> {
        if self.session.borrow().is_none() {
            return Ok(());
        }
        let request = self.http.delete(self.url("session")).timeout(QUERY_TIMEOUT);
        let response = self.send(request).await?;
        self.refusal_or(response).await.map(drop)
    }

    /// Notes that an envelope is being pushed into the agent's context: the next call (any
    /// tool call, which is what could depend on it) tells the daemon, so an unnamed reply
    /// may resolve to it. Note it before the push, so that no call the agent makes after
    /// seeing the envelope can leave without it.
    pub fn note_shown(&self, trace_id: &str) {
        let mut unconfirmed = self.unconfirmed.lock().unwrap_or_else(|p| p.into_inner());
        if unconfirmed.len() == MAX_SHOWN_IN_HEADER {
            unconfirmed.pop_front();
        }
        unconfirmed.push_back(trace_id.to_owned());
    }

    /// Tells the daemon at once that an envelope was pushed into the agent's context, so an
    /// unnamed reply may resolve to it.
    pub async fn shown(&self, trace_id: &str) -> Result<ShownReceipt, ClientError> {
        let body = ShownRequest { trace_id: trace_id.to_owned() };
        self.exchange("shown", |url| self.http.post(url).json(&body).timeout(QUERY_TIMEOUT)).await
    }

    /// The agent's envelopes that wait for an answer.
    pub async fn pending(&self) -> Result<PendingList, ClientError> {
        self.exchange("pending", |url| self.http.get(url).timeout(QUERY_TIMEOUT)).await
    }

    /// Asks the daemon to resolve the target (DESIGN.md §3) and deliver the reply (§4).
    pub async fn reply(&self, reply: &ReplyRequest) -> Result<ReplyReceipt, ClientError> {
        self.exchange("reply", |url| self.http.post(url).json(reply).timeout(REPLY_TIMEOUT)).await
    }

    /// What became of a reply request: its receipt, or the refusal `reply` gave (or would
    /// give); `unknown_request` when the daemon never acted on it.
    pub async fn reply_outcome(&self, request_id: &str) -> Result<ReplyReceipt, ClientError> {
        self.exchange(&format!("replies/{request_id}"), |url| self.http.get(url).timeout(REPLY_TIMEOUT)).await
    }

    /// Hands an instruction to another agent (DESIGN.md §9).
    pub async fn handoff(&self, handoff: &HandoffRequest) -> Result<HandoffReceipt, ClientError> {
        self.exchange("handoffs", |url| self.http.post(url).json(handoff).timeout(QUERY_TIMEOUT)).await
    }

    /// `revise_task`: declares that an envelope changes the agent's task.
    pub async fn revise_task(&self, revision: &RevisionRequest) -> Result<RevisionReceipt, ClientError> {
        self.exchange("revisions", |url| self.http.post(url).json(revision).timeout(QUERY_TIMEOUT)).await
    }

    /// `react`: a reaction on a message of an envelope's conversation.
    pub async fn react(&self, react: &ReactRequest) -> Result<MessageActionReceipt, ClientError> {
        self.exchange("reactions", |url| self.http.post(url).json(react).timeout(REPLY_TIMEOUT)).await
    }

    /// `edit_message`: new text for a message the bot sent for this agent.
    pub async fn edit_message(&self, edit: &EditRequest) -> Result<MessageActionReceipt, ClientError> {
        self.exchange("edits", |url| self.http.post(url).json(edit).timeout(REPLY_TIMEOUT)).await
    }

    /// Relays a permission request of the agent session (DESIGN.md §15). Asking again
    /// with the same `request_id` records and posts nothing more: it answers with what
    /// became of the first.
    pub async fn ask_permission(&self, ask: &PermissionRequest) -> Result<PermissionReceipt, ClientError> {
        self.exchange("permissions", |url| self.http.post(url).json(ask).timeout(PERMISSION_TIMEOUT)).await
    }

    /// Confirms that the verdict of permission request `permission_id` was handed to
    /// Claude Code: until then the daemon writes it again on each session stream.
    pub async fn verdict_handed(&self, permission_id: &str) -> Result<(), ClientError> {
        let route = format!("permissions/{permission_id}/handed");
        let _: serde::de::IgnoredAny =
            self.exchange(&route, |url| self.http.post(url).timeout(QUERY_TIMEOUT)).await?;
        Ok(())
    }

    /// This plugin process's name for itself.
    pub fn plugin(&self) -> &str {
        &self.plugin
    }

    /// Marks an envelope handled without a reply.
    pub async fn ack(&self, ack: &AckRequest) -> Result<AckReceipt, ClientError> {
        self.exchange("ack", |url| self.http.post(url).json(ack).timeout(QUERY_TIMEOUT)).await
    }

    /// Opens an attachment's download (`GET attachments/{trace_id}`): once the daemon has
    /// said yes, its bytes arrive as the stream is read.
    pub async fn download_attachment(
        &self,
        trace_id: &str,
        query: &AttachmentQuery,
    ) -> Result<AttachmentStream, ClientError> {
        self.again_after_a_stale_session(|| self.download_attachment_once(trace_id, query)).await
    }

    async fn download_attachment_once(
        &self,
        trace_id: &str,
        query: &AttachmentQuery,
    ) -> Result<AttachmentStream, ClientError> {
        let request = self.http.get(self.url(&format!("attachments/{trace_id}"))).query(query);
        // No overall timeout: a large file takes as long as it takes. The answer's headers
        // come once the daemon asked Telegram where the file is.
        let response = tokio::time::timeout(DOWNLOAD_START_TIMEOUT, self.send(request))
            .await
            .map_err(|_| self.no_answer_within(DOWNLOAD_START_TIMEOUT))??;
        let response = self.refusal_or(response).await?;
        let header_text =
            |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let name = header_text(FILE_NAME_HEADER)
            .map(|encoded| percent_encoding::percent_decode_str(&encoded).decode_utf8_lossy().into_owned())
            .unwrap_or_default();
        let kind = header_text(ATTACHMENT_KIND_HEADER).unwrap_or_default();
        let size = response.content_length();
        let bytes = response.bytes_stream().map_err(std::io::Error::other).boxed();
        Ok(AttachmentStream { name, kind, size, bytes })
    }

    /// Streams a file to the daemon, which stages it for a reply (`POST uploads`); the file
    /// is read as it is sent, never held whole, to its end: `checked_len` (the size its
    /// check saw) only lets the daemon refuse a file too large before any byte, and one
    /// that changed since goes as it is now.
    pub async fn upload_file(
        &self,
        path: &std::path::Path,
        name: &str,
        checked_len: u64,
    ) -> Result<UploadReceipt, ClientError> {
        self.again_after_a_stale_session(|| self.upload_file_once(path, name, checked_len)).await
    }

    async fn upload_file_once(
        &self,
        path: &std::path::Path,
        name: &str,
        checked_len: u64,
    ) -> Result<UploadReceipt, ClientError> {
        let file = tokio::fs::File::open(path).await.map_err(|e| ClientError::Unreachable {
            address: self.address(),
            detail: format!("{} could not be opened: {e}", path.display()),
        })?;
        let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file));
        let encoded =
            percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC).to_string();
        self.exchange_once("uploads", |url| {
            self.http
                .post(url)
                .header(FILE_NAME_HEADER, encoded)
                .header(FILE_SIZE_HEADER, checked_len)
                .body(body)
                .timeout(UPLOAD_TIMEOUT)
        })
        .await
    }

    fn url(&self, route: &str) -> String {
        self.url_at(self.daemons.in_use().origin(), route)
    }

    fn url_at(&self, origin: &str, route: &str) -> String {
        format!("{origin}{API_PREFIX}/{}/{route}", self.agent)
    }

    /// Sends an authenticated request to `route` of the daemon in use, built by `build`
    /// from its URL, and decodes a success body as `T`; once more when it was refused as
    /// from a session that just ended ([`Self::again_after_a_stale_session`]).
    async fn exchange<T: DeserializeOwned>(
        &self,
        route: &str,
        build: impl Fn(String) -> reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        self.again_after_a_stale_session(|| self.exchange_once(route, &build)).await
    }

    /// Makes a call (`call`), and makes it once more when the daemon refused it as coming
    /// from a session that is not the live one while this client had a session: its stream
    /// ended a moment ago (the daemon restarted, or the connection broke) and the next one
    /// is on its way. The refusal means nothing was done, so the call is made again under
    /// the next session, once it is open (within [`Self::retrying_after_a_stale_session`]'s
    /// wait; a client without one does not retry). Without a session to begin with, the
    /// refusal stands: another session holds the agent.
    async fn again_after_a_stale_session<T, F>(&self, call: impl Fn() -> F) -> Result<T, ClientError>
    where
        F: Future<Output = Result<T, ClientError>>,
    {
        let presented = self.session.borrow().clone();
        let first = call().await;
        let stale = matches!(&first, Err(ClientError::Refused { error, .. }) if error.code == ErrorCode::SessionConflict);
        let (Some(presented), Some(within)) = (presented.filter(|_| stale), self.next_session_wait) else {
            return first;
        };
        if !self.wait_for_another_session(&presented, within).await {
            return first;
        }
        tracing::debug!(
            "a call was refused as from the session that just ended; made again under the next one"
        );
        call().await
    }

    /// Waits up to `within` for a session other than the one whose token is `stale`.
    async fn wait_for_another_session(&self, stale: &str, within: Duration) -> bool {
        let mut session = self.session.subscribe();
        self.session_wanted.notify_one();
        let another = session.wait_for(|current| current.as_deref().is_some_and(|token| token != stale));
        tokio::time::timeout(within, another).await.is_ok_and(|found| found.is_ok())
    }

    /// [`Self::exchange`], once.
    async fn exchange_once<T: DeserializeOwned>(
        &self,
        route: &str,
        build: impl FnOnce(String) -> reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        // Once the plugin has moved on from this call's daemon (its session stream missed
        // its heartbeats), the answer is not waited for any longer: its outcome is unknown,
        // as with any connection lost, and the caller asks the next daemon about it. The
        // daemon is the one chosen here, which the request is addressed to, whatever a move
        // made since.
        let origin = self.daemons.in_use().origin().to_owned();
        let request = build(self.url_at(&origin, route));
        let exchange = async {
            let response = self.send(request).await?;
            let response = self.refusal_or(response).await?;
            let body = response.bytes().await.map_err(|e| self.transport_error(&e))?;
            serde_json::from_slice(&body)
                .map_err(|e| self.protocol(format!("{e} in the answer '{}'", preview(&body))))
        };
        tokio::select! {
            answer = exchange => answer,
            () = self.daemons.moved_on(&origin) => Err(ClientError::NoAnswer {
                address: origin,
                detail: "it stopped answering, and this plugin moved on to the next daemon".into(),
            }),
        }
    }

    /// Sends a request with the agent's credentials, its session and the envelopes shown.
    async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, ClientError> {
        let mut request = request.bearer_auth(self.secret.expose());
        if let Some(token) = self.session.borrow().as_deref() {
            request = request.header(SESSION_HEADER, token);
        }
        let confirming: Vec<String> =
            self.unconfirmed.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect();
        if !confirming.is_empty() {
            request = request.header(SHOWN_HEADER, confirming.join(","));
        }
        let response = request.send().await.map_err(|e| self.transport_error(&e))?;
        // The daemon read the header before acting on the call, whatever its answer. A call
        // that never got an answer leaves them noted, for the next one.
        self.confirmed(&confirming);
        Ok(response)
    }

    /// Forgets the noted envelopes a call just confirmed; any noted since stay.
    fn confirmed(&self, confirmed: &[String]) {
        if !confirmed.is_empty() {
            self.unconfirmed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|noted| !confirmed.contains(noted));
        }
    }

    /// Passes a success through; turns anything else into the daemon's refusal.
    async fn refusal_or(&self, response: reqwest::Response) -> Result<reqwest::Response, ClientError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.bytes().await.map_err(|e| self.transport_error(&e))?;
        match serde_json::from_slice::<ApiError>(&body) {
            Ok(error) => Err(ClientError::Refused { status, error }),
            Err(_) => Err(self.protocol(format!(
                "HTTP {status} with the body '{}' (is another program listening on {}?)",
                preview(&body),
                self.address()
            ))),
        }
    }

    /// Classifies a reqwest failure: a connection that was never made means the request
    /// did not reach the daemon; anything later leaves its outcome unknown.
    /// A daemon that could not be reached is passed over: the next call goes to the next
    /// address, as the retries of every caller then do.
    fn transport_error(&self, error: &reqwest::Error) -> ClientError {
        let detail = root_cause(error);
        let address = error.url().map_or_else(|| self.address(), |url| url.origin().ascii_serialization());
        if error.is_connect() || refused_our_certificate(error) {
            self.daemons.pass_over(&address);
            ClientError::Unreachable { address, detail }
        } else if error.is_timeout() {
            ClientError::NoAnswer { address, detail: "it did not answer in time".into() }
        } else {
            ClientError::NoAnswer { address, detail }
        }
    }

    fn no_answer(&self, detail: String) -> ClientError {
        ClientError::NoAnswer { address: self.address(), detail }
    }

    fn no_answer_within(&self, limit: Duration) -> ClientError {
        self.no_answer(format!("no answer within {}s", limit.as_secs()))
    }

    fn protocol(&self, detail: String) -> ClientError {
        ClientError::Protocol { address: self.address(), detail }
    }
}

/// Whether the daemon ended the connection with a TLS alert about our certificate (none
/// shown, or one its `api.tls.client_ca` did not sign). Under TLS 1.3 the client has sent
/// its request before it reads that alert, so reqwest reports a request that failed, not a
/// connection; but a server that refuses the client's certificate aborts its handshake and
/// never reads a request. So the request did not reach the daemon: it is unreachable, not
/// an unknown outcome.
fn refused_our_certificate(error: &reqwest::Error) -> bool {
    use tokio_rustls::rustls::{AlertDescription, Error as TlsError};
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = cause {
        // An io::Error's `source` skips the error it wraps: look inside it first.
        let wrapped = current.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref());
        let tls = wrapped
            .and_then(|inner| inner.downcast_ref::<TlsError>())
            .or_else(|| current.downcast_ref::<TlsError>());
        if let Some(TlsError::AlertReceived(alert)) = tls {
            return matches!(
                alert,
                AlertDescription::CertificateRequired
                    | AlertDescription::BadCertificate
                    | AlertDescription::UnknownCA
                    | AlertDescription::CertificateUnknown
                    | AlertDescription::CertificateExpired
                    | AlertDescription::CertificateRevoked
                    | AlertDescription::UnsupportedCertificate
                    | AlertDescription::AccessDenied
            );
        }
        cause = current.source();
    }
    false
}

/// The daemons a plugin may reach and the one it uses: each replica listens only while it
/// leads, so the one that accepts a connection is the one to use.
#[derive(Debug)]
struct Daemons {
    urls: Vec<DaemonUrl>,
    /// The index of the one in use; watched by the calls made to it (see [`Daemons::moved_on`]).
    in_use: watch::Sender<usize>,
}

impl Daemons {
    fn new(urls: Vec<DaemonUrl>) -> Self {
        Self { urls, in_use: watch::Sender::new(0) }
    }

    fn in_use(&self) -> &DaemonUrl {
        &self.urls[*self.in_use.borrow()]
    }

    /// Moves on from `unreachable` to the next address, unless another call already did.
    fn pass_over(&self, unreachable: &str) {
        if self.urls.len() < 2 {
            return;
        }
        let moved = self.in_use.send_if_modified(|in_use| {
            if self.urls[*in_use].origin() != unreachable {
                return false;
            }
            *in_use = (*in_use + 1) % self.urls.len();
            true
        });
        if moved {
            tracing::debug!(unreachable, next = %self.in_use(), "the daemon is not reachable there; trying the next address");
        }
    }

    /// Resolves once the plugin has moved on from `origin` to another daemon: a call still
    /// waiting for `origin`'s answer then waits for a daemon that stopped answering (a
    /// paused or wedged leader, whose socket the kernel still serves).
    async fn moved_on(&self, origin: &str) {
        let mut in_use = self.in_use.subscribe();
        // The sender lives as long as `self`, so the wait ends only by a move.
        let _ = in_use.wait_for(|index| self.urls[*index].origin() != origin).await;
    }
}

/// An attachment being downloaded from the daemon.
pub struct AttachmentStream {
    /// The name the daemon suggests (the sender's, or Telegram's), not yet made safe.
    pub name: String,
    pub kind: String,
    /// The exact size, when the daemon announced it.
    pub size: Option<u64>,
    pub bytes: futures::stream::BoxStream<'static, std::io::Result<bytes::Bytes>>,
}

/// The agent's session: a stream of [`SessionEvent`]s, one JSON object per line.
pub struct SessionStream {
    lines: futures::stream::BoxStream<'static, Result<String, LinesCodecError>>,
    address: String,
    /// Every daemon's address: a stream whose daemon fell silent passes over its own.
    daemons: Arc<Daemons>,
    /// How long the stream may carry nothing: [`MISSED_HEARTBEATS`] of the daemon's.
    idle_limit: Duration,
    /// The daemon's id for this session, from its `Hello`.
    pub session_id: String,
    /// This session's token, cleared from the client when the stream is dropped.
    token: String,
    session: Arc<watch::Sender<Option<String>>>,
}

impl std::fmt::Debug for SessionStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionStream")
            .field("address", &self.address)
            .field("session_id", &self.session_id)
            .finish()
    }
}

impl Drop for SessionStream {
    fn drop(&mut self) {
        // Calls made after the stream ended must not carry a token the daemon already
        // forgot: they wait for the next session instead (see `wait_for_session`).
        self.session.send_if_modified(|current| {
            let ours = current.as_deref() == Some(self.token.as_str());
            if ours {
                *current = None;
            }
            ours
        });
    }
}

impl SessionStream {
    /// The next event, or `None` once the daemon has closed the stream.
    ///
    /// A line that does not parse is consumed and reported as [`ClientError::Protocol`];
    /// the stream stays usable, so the caller may log it and read on. Any other error
    /// means the stream is dead.
    pub async fn next_event(&mut self) -> Result<Option<SessionEvent>, ClientError> {
        loop {
            let Ok(line) = tokio::time::timeout(self.idle_limit, self.lines.next()).await else {
                // The daemon stopped answering without closing the connection: with
                // replicas, the next attempt goes to the next one, which may lead by now.
                self.daemons.pass_over(&self.address);
                return Err(ClientError::NoAnswer {
                    address: self.address.clone(),
                    detail: format!("no heartbeat on the session stream for {:.1?}", self.idle_limit),
                });
            };
            let line = match line {
                None => return Ok(None),
                Some(Ok(line)) => line,
                Some(Err(LinesCodecError::MaxLineLengthExceeded)) => {
                    return Err(ClientError::Protocol {
                        address: self.address.clone(),
                        detail: format!("a session line longer than {MAX_SESSION_LINE_BYTES} bytes"),
                    });
                }
                Some(Err(LinesCodecError::Io(e))) => {
                    return Err(ClientError::NoAnswer {
                        address: self.address.clone(),
                        detail: root_cause(&e),
                    });
                }
            };
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            return serde_json::from_str(line).map(Some).map_err(|e| ClientError::Protocol {
                address: self.address.clone(),
                detail: format!("{e} in the session line '{}'", preview(line.as_bytes())),
            });
        }
    }
}

/// The innermost cause of an error: "Connection refused (os error 111)" says more than
/// reqwest's "error sending request for url (…)".
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

fn preview(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut shown: String = text.chars().take(BODY_PREVIEW_CHARS).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_waits_for_its_daemon_until_the_plugin_moves_on_from_it() {
        let url = |text: &str| DaemonUrl::parse(text, false).unwrap();
        let daemons = Daemons::new(vec![url("http://127.0.0.1:7001/"), url("http://127.0.0.1:7002")]);
        let first = "http://127.0.0.1:7001";
        let waiting = daemons.moved_on(first);
        tokio::pin!(waiting);
        // Passing over another address, or a move already made, leaves the call waiting.
        daemons.pass_over("http://127.0.0.1:7002");
        let still_waiting = tokio::time::timeout(Duration::from_millis(20), &mut waiting).await;
        assert!(still_waiting.is_err(), "no move from {first} yet");
        daemons.pass_over(first);
        tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("moved on from the first");
        assert_eq!(daemons.in_use().origin(), "http://127.0.0.1:7002");
        // With one address there is nowhere to move: a call waits for its answer.
        let alone = Daemons::new(vec![url("http://127.0.0.1:7001")]);
        alone.pass_over(first);
        let alone_waiting = tokio::time::timeout(Duration::from_millis(20), alone.moved_on(first)).await;
        assert!(alone_waiting.is_err());
    }

    #[test]
    fn preview_shortens_long_bodies() {
        assert_eq!(preview(b"short"), "short");
        let long = "x".repeat(BODY_PREVIEW_CHARS + 10);
        let shown = preview(long.as_bytes());
        assert_eq!(shown.chars().count(), BODY_PREVIEW_CHARS + 1);
        assert!(shown.ends_with('…'));
    }

    #[test]
    fn unreachable_error_names_the_address_and_the_fix() {
        let error = ClientError::Unreachable {
            address: "http://127.0.0.1:7797".into(),
            detail: "Connection refused (os error 111)".into(),
        };
        assert_eq!(
            error.to_string(),
            "switchboard daemon at http://127.0.0.1:7797 is not reachable: Connection refused (os error 111); \
             is `switchboard run` running?"
        );
    }

    #[test]
    fn refusal_shows_the_daemons_message() {
        let error = ClientError::Refused {
            status: StatusCode::CONFLICT,
            error: ApiError::new(ErrorCode::Ambiguous, "two wait"),
        };
        assert_eq!(error.to_string(), "two wait");
        assert_eq!(error.code(), Some(ErrorCode::Ambiguous));
    }
}
