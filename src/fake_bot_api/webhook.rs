//! The fake's webhook: `setWebhook`, `deleteWebhook` and `getWebhookInfo`, and the
//! deliverer that POSTs pending updates to the webhook as Telegram does, one at a time, in
//! order, with the secret in `X-Telegram-Bot-Api-Secret-Token`, until each is answered 2xx.
//!
//! The updates are the ones `getUpdates` would have served (the same queue, the same ids):
//! a test pushes messages as it always does, and they arrive by whichever road the daemon
//! asked for. While a webhook is set, `getUpdates` answers 409 as Telegram does.
//!
//! Telegram calls the public https URL it was given; in a test the daemon listens in plain
//! HTTP on loopback. [`super::FakeTelegram::route_webhook_to`] plays the load balancer: it
//! says where the URL's requests go.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Map, Value, json};

use super::server::{api_error, ok, str_param};
use super::state::Shared;

/// Telegram's answer to `getUpdates` while a webhook is set.
pub(super) const WEBHOOK_ACTIVE_DESCRIPTION: &str = "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first";

/// The header Telegram sends the webhook's secret in.
const SECRET_HEADER: &str = "X-Telegram-Bot-Api-Secret-Token";

/// Between failed deliveries of an update. Telegram waits longer; a test wants the retry
/// soon, and the number of retries is not what any test counts.
const RETRY_INTERVAL: Duration = Duration::from_millis(100);

/// How long one delivery may take. Beyond the daemon's 10-second wait for a busy ledger,
/// so that a delivery answered 503 after it is seen as answered.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// The webhook as set by `setWebhook`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookInfo {
    pub url: String,
    /// What deliveries carry in the secret header; `None` when none was given.
    pub secret_token: Option<String>,
}

/// What became of one delivery of an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The webhook answered with this status.
    Answered(u16),
    /// No answer came: nothing listened, the connection broke, or the test had the
    /// answer lost ([`super::FakeTelegram::lose_next_webhook_answer`]).
    NoAnswer,
}

impl Delivery {
    /// Whether Telegram counts the update as delivered.
    pub fn succeeded(self) -> bool {
        matches!(self, Self::Answered(200..=299))
    }
}

/// What the state keeps about the webhook.
#[derive(Debug, Default)]
pub(super) struct WebhookState {
    pub(super) set: Option<WebhookInfo>,
    /// Where the webhook URL's requests go (`http://host:port`): the load balancer's
    /// backends, taken in turn. Nothing is delivered until a test says.
    pub(super) targets: Vec<String>,
    /// How many deliveries were made: the next one goes to `targets[turn % len]`.
    pub(super) turn: usize,
    /// Every delivery, in order: the update id and what became of it.
    pub(super) deliveries: Vec<(i64, Delivery)>,
    /// Deliveries whose answer is to be thrown away, as if the connection broke after the
    /// webhook had taken the update; each also unroutes the webhook (`targets`).
    pub(super) answers_to_lose: usize,
    /// `setWebhook` calls Telegram accepted.
    pub(super) registrations: usize,
    /// The text of each update delivered, by id, for a test to deliver it again.
    pub(super) delivered: HashMap<i64, String>,
    /// The delivery on its way: the update, where to, and since when. A test that timed
    /// out tells from it a delivery still waiting for its answer from a backlog moving on.
    pub(super) in_flight: Option<(i64, String, std::time::Instant)>,
}

/// `setWebhook`, `deleteWebhook` and `getWebhookInfo`; `None` for any other method.
pub(super) fn answer(shared: &Shared, method: &str, params: &Map<String, Value>) -> Option<Response> {
    let response = match method {
        "setwebhook" => set_webhook(shared, params),
        "deletewebhook" => {
            let mut state = shared.lock();
            state.webhook.set = None;
            if str_param(params, "drop_pending_updates").as_deref() == Some("true") {
                state.updates.clear();
            }
            ok(json!(true))
        }
        "getwebhookinfo" => {
            let state = shared.lock();
            let mut info = json!({
                "url": state.webhook.set.as_ref().map_or("", |set| set.url.as_str()),
                "has_custom_certificate": false,
                "pending_update_count": state.updates.len(),
            });
            if let Some(allowed) = state.allowed_updates.as_ref().filter(|_| state.webhook.set.is_some()) {
                info["allowed_updates"] = json!(allowed);
            }
            ok(info)
        }
        _ => return None,
    };
    shared.changed.notify_waiters();
    Some(response)
}

fn set_webhook(shared: &Shared, params: &Map<String, Value>) -> Response {
    let url = str_param(params, "url").unwrap_or_default();
    if url.is_empty() {
        // Telegram's way of removing a webhook.
        shared.lock().webhook.set = None;
        return ok(json!(true));
    }
    if !url.starts_with("https://") {
        return api_error(
            StatusCode::BAD_REQUEST,
            "Bad Request: bad webhook: An HTTPS URL must be provided for webhook",
            None,
        );
    }
    let secret_token = str_param(params, "secret_token");
    let valid_secret = secret_token.as_deref().is_none_or(|secret| {
        (1..=256).contains(&secret.len())
            && secret.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    });
    if !valid_secret {
        return api_error(
            StatusCode::BAD_REQUEST,
            "Bad Request: secret token contains unallowed characters",
            None,
        );
    }
    let allowed = match super::server::allowed_updates_param(params) {
        Ok(allowed) => allowed,
        Err(description) => return api_error(StatusCode::BAD_REQUEST, &description, None),
    };
    let mut state = shared.lock();
    if str_param(params, "drop_pending_updates").as_deref() == Some("true") {
        state.updates.clear();
    }
    if allowed.is_some() {
        state.allowed_updates = allowed;
    }
    state.webhook.set = Some(WebhookInfo { url, secret_token });
    state.webhook.registrations += 1;
    ok(json!(true))
}

/// The next delivery to make: where, with which secret, which update.
struct Next {
    url: String,
    secret_token: Option<String>,
    update_id: i64,
    text: String,
}

/// Delivers pending updates to the webhook, one at a time and in order, until the fake
/// shuts down. An update leaves the queue once a delivery of it is answered 2xx.
pub(super) async fn deliver(shared: Arc<Shared>) {
    let client = match reqwest::Client::builder().no_proxy().timeout(DELIVERY_TIMEOUT).build() {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "fake Telegram: no HTTP client for webhook deliveries");
            return;
        }
    };
    loop {
        let next = shared
            .wait_for(None, |state| {
                if state.shut_down {
                    return Some(None);
                }
                let set = state.webhook.set.as_ref()?;
                let targets = &state.webhook.targets;
                let target = targets.get(state.webhook.turn % targets.len().max(1))?;
                let update = state.updates.iter().find(|u| u.is_allowed(state.allowed_updates.as_deref()))?;
                // The load balancer forwards the URL's path (and query) to its backend.
                let path =
                    set.url.strip_prefix("https://").and_then(|rest| rest.find('/').map(|at| &rest[at..]));
                Some(Some(Next {
                    url: format!("{target}{}", path.unwrap_or("/")),
                    secret_token: set.secret_token.clone(),
                    update_id: update.id,
                    text: update.text.clone(),
                }))
            })
            .await
            .flatten();
        let Some(next) = next else { return };
        shared.lock().webhook.in_flight = Some((next.update_id, next.url.clone(), std::time::Instant::now()));
        let mut request =
            client.post(&next.url).header("content-type", "application/json").body(next.text.clone());
        if let Some(secret) = &next.secret_token {
            request = request.header(SECRET_HEADER, secret);
        }
        let answered = tokio::select! {
            response = request.send() => response.ok().map(|response| response.status().as_u16()),
            () = shared.hang(Duration::MAX) => return,
        };
        let delivery = {
            let mut state = shared.lock();
            state.webhook.in_flight = None;
            let delivery = match answered {
                Some(_) if state.webhook.answers_to_lose > 0 => {
                    state.webhook.answers_to_lose -= 1;
                    state.webhook.targets.clear();
                    Delivery::NoAnswer
                }
                Some(status) => Delivery::Answered(status),
                None => Delivery::NoAnswer,
            };
            state.webhook.deliveries.push((next.update_id, delivery));
            // Round robin, as a load balancer spreads requests; a failed delivery is
            // retried at the next backend.
            state.webhook.turn += 1;
            if delivery.succeeded() {
                // The first queued update with this id and text: a redelivery the test
                // queued again stays for its own turn.
                if let Some(at) =
                    state.updates.iter().position(|u| u.id == next.update_id && u.text == next.text)
                {
                    state.updates.remove(at);
                }
                state.webhook.delivered.insert(next.update_id, next.text.clone());
            }
            delivery
        };
        shared.changed.notify_waiters();
        if !delivery.succeeded() {
            shared.hang(RETRY_INTERVAL).await;
        }
    }
}
