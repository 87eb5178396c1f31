//! Webhook intake (`telegram.webhook`): Telegram pushes each update to the daemon instead
//! of being polled. At start-up [`register`] tells Telegram where (`setWebhook`, with the
//! secret it must send back); the listener ([`router`]) takes one update per request, on
//! the path of `public_url`, behind the user's load balancer or reverse proxy, which
//! terminates TLS.
//!
//! An update is committed (and handed over) before the `200`: Telegram delivers an update
//! until it gets a 2xx, so a crash before the answer, a busy ledger or a full disk (both
//! answered `503`) only make it come again, and a redelivery of a stored update is skipped
//! by the ledger (same `update_id`, same digest). A request without the right secret is
//! answered `401` and stores nothing.
//!
//! With replicas on PostgreSQL, a standby listens too: it commits each update for the
//! leader to take in ([`crate::telegram::relay`]) before its `200`, and registers nothing.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Backoff;
use crate::config::WebhookSettings;
use crate::ids::Secret;
use crate::ledger::{LedgerCongestion, LedgerError};
use crate::operate::health::WebhookHealth;
use crate::operate::metrics;
use crate::telegram::bot_api::{Answer, BotApi, Exchange};
use crate::telegram::intake::{Confirmation, UpdateIntake};
use crate::telegram::relay::UpdateRelay;
use crate::telegram::updates::{ALLOWED_UPDATES, RawUpdate, answer_refuses_the_token};

/// The header Telegram sends the webhook's `secret_token` back in.
pub const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";

/// What the daemon logs once the webhook listener is bound, with the address as `webhook`.
pub const LISTENING_MESSAGE: &str = "webhook listening";

/// Between failed `setWebhook` calls: as the poller's backoff, a blip is retried quickly
/// and a long outage still noticed within half a minute of its end.
const REGISTER_FIRST: Duration = Duration::from_millis(500);
const REGISTER_CAP: Duration = Duration::from_secs(30);

/// What logs a standby's webhook listener once bound, with the address as `webhook`.
pub const RELAYING_MESSAGE: &str = "webhook listening, relaying deliveries to the leader";

/// Where a delivery goes once its secret is checked.
#[derive(Clone)]
pub enum UpdateSink {
    /// Taken in here: the daemon that serves (SQLite's, or the leader's).
    Intake(UpdateIntake),
    /// Committed for the leader: a standby's.
    /// Boxed: it carries a ledger handle of its own.
    Relay(Box<UpdateRelay>),
}

impl UpdateSink {
    /// Commits one update; how many envelopes it made here (none when relayed).
    async fn take(&self, update: RawUpdate, update_id: i64) -> Result<usize, LedgerError> {
        match self {
            Self::Intake(intake) => Ok(intake.take(vec![update], Confirmation::Answer).await?.new_envelopes),
            Self::Relay(relay) => {
                if !relay.relay(&update, update_id).await? {
                    tracing::debug!(update_id, "webhook update relayed before (a redelivery): answered 200");
                }
                Ok(0)
            }
        }
    }
}

/// What registering the webhook with Telegram takes: the API to call `setWebhook` on, and
/// the health told whether Telegram accepted it (`/readyz`).
pub struct Registration {
    pub api: BotApi,
    pub health: WebhookHealth,
}

/// The webhook's listener, bound at build time so a taken port fails start-up.
pub struct WebhookListener {
    listener: TcpListener,
    settings: WebhookSettings,
    secret: Secret,
    sink: UpdateSink,
}

impl WebhookListener {
    pub async fn bind(settings: WebhookSettings, secret: Secret, sink: UpdateSink) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(settings.listen).await.with_context(|| {
            format!("binding the webhook listener to {} (telegram.webhook.listen)", settings.listen)
        })?;
        Ok(Self { listener, settings, secret, sink })
    }

    /// Where Telegram's requests are taken (useful when configured with port 0).
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    /// The path they arrive on.
    pub fn path(&self) -> &str {
        self.settings.path()
    }

    /// Registers the webhook with Telegram (until it is accepted) when given a
    /// [`Registration`] (a standby leaves that to the leader), and serves Telegram's
    /// requests until `shutdown`. Returns an error, which stops the daemon, when the listener fails or the
    /// ledger fails in a way that does not pass by itself.
    pub async fn run(
        self,
        registration: Option<Registration>,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let Self { listener, settings, secret, sink } = self;
        let (fatal, mut fatal_errors) = mpsc::channel(1);
        let deliveries = Deliveries { sink, secret: secret.clone(), tasks: tasks.clone(), fatal };
        let server = crate::serve::serve(
            listener,
            router(settings.path(), deliveries),
            crate::serve::Connections::Bounded,
            shutdown.clone(),
        );
        // The listener is up before Telegram is told of it, so its first delivery finds it.
        if let Some(Registration { api, health }) = registration {
            tasks.spawn(register(api, settings, secret, health, shutdown.child_token()));
        }
        tokio::select! {
            () = server => Ok(()),
            Some(error) = fatal_errors.recv() => {
                Err(anyhow::Error::new(error).context("recording a webhook update in the ledger"))
            }
        }
    }
}

/// What each request needs.
#[derive(Clone)]
struct Deliveries {
    sink: UpdateSink,
    /// What Telegram must send in [`SECRET_HEADER`].
    secret: Secret,
    /// Intake runs as a task of its own on the daemon's tracker: a request cut off by
    /// Telegram or the proxy cannot cut off a commit and its hand-over.
    tasks: TaskTracker,
    /// A ledger error that does not pass by itself: the daemon stops, as a poller would.
    fatal: mpsc::Sender<LedgerError>,
}

/// The listener's one route: `POST <path>` with one update as its JSON body.
fn router(path: &str, deliveries: Deliveries) -> Router {
    Router::new().route(path, post(deliver)).with_state(Arc::new(deliveries))
}

/// How a request was answered: the metric label and the status Telegram sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answered {
    /// Committed (or stored before): `200`, Telegram forgets the update.
    Stored,
    /// Wrong or missing secret: `401`, nothing stored.
    Unauthorized,
    /// A body that is not an update with an id: `400`, nothing stored.
    NotAnUpdate,
    /// A body that did not arrive whole within [`BODY_READ_TIMEOUT`], or is larger than
    /// [`MAX_BODY_BYTES`]: `408`, nothing stored, and Telegram delivers it again.
    Incomplete,
    /// A busy ledger or a full disk: `503`, and Telegram delivers it again.
    LedgerCongested,
    /// Any other ledger error: `500`, and the daemon stops.
    LedgerFailed,
}

impl Answered {
    fn label(self) -> &'static str {
        match self {
            Self::Stored => "stored",
            Self::Unauthorized => "unauthorized",
            Self::NotAnUpdate => "not_an_update",
            Self::Incomplete => "incomplete",
            Self::LedgerCongested => "ledger_congested",
            Self::LedgerFailed => "ledger_failed",
        }
    }

    fn status(self) -> StatusCode {
        match self {
            Self::Stored => StatusCode::OK,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::NotAnUpdate => StatusCode::BAD_REQUEST,
            Self::Incomplete => StatusCode::REQUEST_TIMEOUT,
            Self::LedgerCongested => StatusCode::SERVICE_UNAVAILABLE,
            Self::LedgerFailed => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// How long a delivery's body may take to arrive once its headers have: Telegram sends an
/// update of a few kilobytes at once. A client that trickles or stalls it would otherwise
/// hold one of the listener's connections for as long as it likes.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest body read: far above any update (a message's text is at most 4096
/// characters), as axum's default.
const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

async fn deliver(State(deliveries): State<Arc<Deliveries>>, headers: HeaderMap, body: Body) -> StatusCode {
    let answered = take_delivery(&deliveries, &headers, body).await;
    metrics::webhook_request(answered.label());
    answered.status()
}

/// The body of a request whose secret was checked, read within [`BODY_READ_TIMEOUT`].
async fn read_body(body: Body) -> Option<axum::body::Bytes> {
    match tokio::time::timeout(BODY_READ_TIMEOUT, axum::body::to_bytes(body, MAX_BODY_BYTES)).await {
        Ok(Ok(bytes)) => Some(bytes),
        Ok(Err(error)) => {
            tracing::warn!(%error, "webhook request whose body could not be read: answered 408, nothing stored");
            None
        }
        Err(_) => {
            tracing::warn!(
                within = ?BODY_READ_TIMEOUT,
                "webhook request whose body did not arrive in time: answered 408, nothing stored"
            );
            None
        }
    }
}

/// The secret is checked before the body is read: a request without it costs a header.
async fn take_delivery(deliveries: &Deliveries, headers: &HeaderMap, body: Body) -> Answered {
    let presented = headers.get(SECRET_HEADER).and_then(|value| value.to_str().ok());
    if !presented.is_some_and(|presented| deliveries.secret.matches(presented)) {
        tracing::warn!(
            secret_header = presented.is_some(),
            "webhook request without the right secret: answered 401, nothing stored (is something other than Telegram calling telegram.webhook.public_url?)"
        );
        return Answered::Unauthorized;
    }
    let Some(body) = read_body(body).await else { return Answered::Incomplete };
    let Some((update, update_id)) = std::str::from_utf8(&body)
        .ok()
        .map(RawUpdate::new)
        .and_then(|update| update.update_id.map(|update_id| (update, update_id)))
    else {
        tracing::warn!(
            bytes = body.len(),
            "webhook request whose body is not an update with an update_id: answered 400"
        );
        return Answered::NotAnUpdate;
    };
    let sink = deliveries.sink.clone();
    let taking = deliveries.tasks.spawn(async move { sink.take(update, update_id).await });
    let taken = match taking.await {
        Ok(taken) => taken,
        // A panic outside the decoder (which catches its own) goes on as on this task.
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Cancelled only as the runtime goes away: nothing was recorded for sure, so
        // Telegram must deliver it again.
        Err(_) => return Answered::LedgerCongested,
    };
    match taken {
        Ok(new_envelopes) => {
            if new_envelopes == 0 && matches!(deliveries.sink, UpdateSink::Intake(_)) {
                tracing::debug!(
                    update_id,
                    "webhook update stored before (a redelivery) or no envelope: answered 200"
                );
            }
            Answered::Stored
        }
        Err(error) => match LedgerCongestion::of(&error) {
            Some(congestion) => {
                tracing::error!(
                    update_id,
                    error = %error,
                    "{congestion}: webhook update not recorded, answered 503 so Telegram delivers it again"
                );
                Answered::LedgerCongested
            }
            None => {
                tracing::error!(update_id, error = %error, "the ledger failed recording a webhook update: answered 500, stopping");
                // Only the first is needed: the daemon is stopping.
                let _ = deliveries.fatal.try_send(error);
                Answered::LedgerFailed
            }
        },
    }
}

/// `setWebhook`'s parameters.
#[derive(Serialize)]
struct SetWebhook<'a> {
    url: &'a str,
    secret_token: &'a str,
    allowed_updates: &'a [&'a str],
    /// Updates that came while no daemon served the webhook (or while one polled) are
    /// delivered, never dropped.
    drop_pending_updates: bool,
}

/// Keeps the webhook set for as long as the daemon runs: calls `setWebhook` until Telegram
/// accepts it, then asks every `check_every` (`getWebhookInfo`) whether it still is, and
/// sets it again when it is not (another program with the bot's token removed or replaced
/// it: a poller removes it before its first `getUpdates`). The same question tells whether
/// Telegram still takes the token. Each finding goes to `health`.
async fn register(
    api: BotApi,
    settings: WebhookSettings,
    secret: Secret,
    health: WebhookHealth,
    shutdown: CancellationToken,
) {
    loop {
        if !set_webhook(&api, &settings, &secret, &health, &shutdown).await {
            return;
        }
        if !watch_webhook(&api, &settings, &health, &shutdown).await {
            return;
        }
    }
}

/// Calls `setWebhook` until Telegram accepts it; `false` on `shutdown`.
async fn set_webhook(
    api: &BotApi,
    settings: &WebhookSettings,
    secret: &Secret,
    health: &WebhookHealth,
    shutdown: &CancellationToken,
) -> bool {
    let params = SetWebhook {
        url: settings.public_url.as_str(),
        secret_token: secret.expose(),
        allowed_updates: ALLOWED_UPDATES,
        drop_pending_updates: false,
    };
    let mut backoff = Backoff::new(REGISTER_FIRST, REGISTER_CAP);
    loop {
        let exchange = tokio::select! {
            exchange = api.call("setWebhook", &params) => exchange,
            () = shutdown.cancelled() => return false,
        };
        if is_unauthorized(&exchange) {
            health.token_refused();
        }
        let Some(why) = set_webhook_refusal(exchange) else {
            tracing::info!(url = %settings.public_url, "webhook set: Telegram delivers updates to telegram.webhook.public_url; not polling");
            health.registered();
            return true;
        };
        metrics::bot_api_error("setWebhook", "refused");
        let delay = backoff.next_delay();
        tracing::error!(retry_in_ms = delay.as_millis() as u64, "setWebhook failed, retrying: {why}");
        health.refused(why);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.cancelled() => return false,
        }
    }
}

/// What `getWebhookInfo` says of the webhook.
#[derive(serde::Deserialize)]
struct WebhookInfo {
    url: String,
}

/// Asks every `check_every` whether the webhook is still `public_url`; returns `true` when
/// it is not (to set it again), `false` on `shutdown`.
async fn watch_webhook(
    api: &BotApi,
    settings: &WebhookSettings,
    health: &WebhookHealth,
    shutdown: &CancellationToken,
) -> bool {
    let no_arguments = serde_json::json!({});
    let mut refusing = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep(settings.check_every) => {}
            () = shutdown.cancelled() => return false,
        }
        let exchange = tokio::select! {
            exchange = api.call("getWebhookInfo", &no_arguments) => exchange,
            () = shutdown.cancelled() => return false,
        };
        if is_unauthorized(&exchange) {
            if !refusing {
                tracing::error!(
                    "Telegram refuses the bot token (401): no update arrives and nothing can be sent; the token was \
                     revoked or is wrong: put a valid one in the variable telegram.token_env names"
                );
            }
            refusing = true;
            metrics::bot_api_error("getWebhookInfo", "unauthorized");
            health.token_refused();
            continue;
        }
        let Exchange::Answered { body, .. } = exchange else { continue };
        let Some(info) = serde_json::from_slice::<Answer<WebhookInfo>>(&body).ok().and_then(|a| a.result)
        else {
            continue;
        };
        if info.url == settings.public_url.as_str() {
            if refusing {
                tracing::info!("Telegram takes the bot token again");
                refusing = false;
            }
            health.registered();
            continue;
        }
        let now = if info.url.is_empty() { "none".to_owned() } else { format!("'{}'", info.url) };
        tracing::warn!(
            url = %settings.public_url,
            "the webhook is no longer telegram.webhook.public_url (Telegram has {now}): another program with this bot's \
             token removed or replaced it (a poller removes it before it polls); setting it again"
        );
        health.refused(format!("the webhook was removed or replaced (Telegram had {now})"));
        return true;
    }
}

fn is_unauthorized(exchange: &Exchange) -> bool {
    matches!(exchange, Exchange::Answered { status, body } if answer_refuses_the_token(*status, body))
}

/// Why a `setWebhook` exchange did not set the webhook; `None` when it did. Never quotes
/// the request (it carries the secret and the token).
fn set_webhook_refusal(exchange: Exchange) -> Option<String> {
    match exchange {
        Exchange::Answered { status, body } => match serde_json::from_slice::<Answer<bool>>(&body) {
            Ok(Answer { ok: true, .. }) => None,
            Ok(Answer { error_code, description, .. }) => Some(format!(
                "Telegram refused setWebhook (error {}): {}",
                error_code.unwrap_or(status),
                description.unwrap_or_default()
            )),
            Err(_) => Some(format!("the answer to setWebhook is not a Bot API response (HTTP {status})")),
        },
        Exchange::NotConnected(why) | Exchange::NoAnswer(why) => {
            Some(format!("no answer from Telegram: {why}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(status: u16, body: &str) -> Exchange {
        Exchange::Answered { status, body: axum::body::Bytes::from(body.to_owned()) }
    }

    #[test]
    fn set_webhook_is_done_only_when_telegram_says_ok() {
        assert_eq!(
            set_webhook_refusal(answered(
                200,
                r#"{"ok":true,"result":true,"description":"Webhook was set"}"#
            )),
            None
        );
        let refused = set_webhook_refusal(answered(
            400,
            r#"{"ok":false,"error_code":400,"description":"Bad Request: bad webhook: HTTPS url must be provided for webhook"}"#,
        ))
        .unwrap();
        assert!(refused.contains("400") && refused.contains("HTTPS url"), "{refused}");
        assert!(set_webhook_refusal(answered(502, "<html>proxy</html>")).unwrap().contains("502"));
        assert!(set_webhook_refusal(Exchange::NotConnected("refused".into())).is_some());
    }

    #[test]
    fn each_answer_has_its_status() {
        assert_eq!(Answered::Stored.status(), StatusCode::OK);
        assert_eq!(Answered::Unauthorized.status(), StatusCode::UNAUTHORIZED);
        // Telegram delivers again on anything but a 2xx: neither of these loses the update.
        assert!(Answered::LedgerCongested.status().is_server_error());
        assert!(Answered::LedgerFailed.status().is_server_error());
    }
}
