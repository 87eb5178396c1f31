//! `getUpdates` over the wire, kept raw: the batch is split into its updates as JSON text,
//! so each one is decoded on its own (see [`super::envelope::read`]) and one update that
//! cannot be decoded never holds back the others.
//!
//! teloxide's own request decodes the whole batch as `Vec<Update>`: one bad update fails
//! it on every retry, and the error quotes the raw batch (message text included). So the
//! request is made here with the bot's own HTTP client, base URL and token, and the
//! failures teloxide would have classified are classified by [`read_reply`].

use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use teloxide::Bot;

use super::lenient;
use crate::rules::nul::without_nul;

/// One update as Telegram sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawUpdate {
    /// Its JSON text.
    pub text: String,
    /// Its `update_id`, read leniently: `None` only when not even that can be read.
    pub update_id: Option<i64>,
}

impl RawUpdate {
    /// The update `text` as Telegram sent it, with every U+0000 in it (as the JSON escape
    /// `\u0000`, or raw) made U+FFFD ([`without_nul`]): everything read from it, and its
    /// raw text, are then the same on either backend.
    pub fn new(text: &str) -> Self {
        let text = without_nul(text);
        let update_id = lenient::member(&text, "update_id").and_then(lenient::integer);
        Self { text: text.into_owned(), update_id }
    }

    /// SHA-256 (hex) of the update's canonical JSON: its members sorted and no
    /// insignificant whitespace, so a re-poll of the same update has the same digest
    /// however it is formatted. Text that is not valid JSON (a lone UTF-16 surrogate
    /// escape, a syntax error) is hashed as received, trimmed: Telegram sends the same
    /// bytes again for the same update.
    pub fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        match serde_json::from_str::<serde_json::Value>(&self.text) {
            Ok(mut value) => {
                value.sort_all_objects();
                // Serialised straight into the hash, as `value.to_string()` would write it.
                serde_json::to_writer(&mut hasher, &value)
                    .expect("a JSON value serialises, and hashing never fails");
            }
            Err(_) => hasher.update(self.text.trim().as_bytes()),
        }
        hex::encode(hasher.finalize())
    }
}

/// Why a `getUpdates` call brought no batch. The display never quotes the response body:
/// a batch carries message text.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// 401 Unauthorized (or teloxide's other wording of an invalid token, 404 "Not Found"):
    /// the token was revoked or is wrong.
    #[error("Telegram refuses the bot token (HTTP {status})")]
    Unauthorized { status: u16 },
    /// 409: another process polls this bot token.
    #[error("409 Conflict: terminated by another getUpdates request")]
    Conflict,
    /// 409: a webhook is set, so Telegram refuses `getUpdates`.
    #[error("409 Conflict: a webhook is active")]
    WebhookActive,
    /// 429 with `retry_after`.
    #[error("rate limited: retry after {} s", .0.as_secs())]
    RetryAfter(Duration),
    /// `migrate_to_chat_id`, which Telegram only sends for a chat; should it come here,
    /// it is reported like any other refusal.
    #[error("Telegram answered that the chat migrated to {0}")]
    MigrateToChatId(i64),
    /// 5xx: Telegram's side failed.
    #[error("Telegram server error (HTTP {status}): {description}")]
    Server { status: u16, description: String },
    /// Any other refusal, with Telegram's description.
    #[error("Telegram refused getUpdates (error {code}): {description}")]
    Api { code: u16, description: String },
    /// The request did not complete: connection, timeout, TLS.
    #[error("network error: {}", error_chain(.0))]
    Network(reqwest::Error),
    /// An answer that is not a Bot API response (a proxy's HTML page, a truncated body).
    #[error("the answer is not a Bot API response (HTTP {status}; {detail}); its body is not logged")]
    Malformed { status: u16, detail: String },
}

impl FetchError {
    fn network(error: reqwest::Error) -> Self {
        // The URL carries the bot token.
        Self::Network(error.without_url())
    }
}

fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The kinds of update intake asks Telegram for, as `allowed_updates` on every `getUpdates`
/// call (and in `setWebhook`, in webhook mode):
/// messages and their edits (envelopes), reactions (notices about the bot's replies, which
/// Telegram sends only to a bot that lists them), and presses on the bot's buttons
/// (permission prompts, DESIGN.md §15). Telegram keeps the last list a bot asked for, so it
/// is sent on every call rather than left to a default. Channel posts are not asked for:
/// no route takes them.
pub const ALLOWED_UPDATES: &[&str] = &["message", "edited_message", "message_reaction", "callback_query"];

/// `getUpdates` for one bot, through the bot's own HTTP client.
#[derive(Debug, Clone)]
pub struct UpdatesClient {
    client: reqwest::Client,
    /// `{api_url}/bot{token}/getUpdates`, built as teloxide builds its method URLs.
    url: reqwest::Url,
}

impl UpdatesClient {
    pub fn new(bot: &Bot) -> Self {
        let mut url = bot.api_url();
        url.path_segments_mut()
            // `telegram.api_url` is validated to be an http(s) URL with a host, which always
            // has path segments.
            .expect("telegram.api_url can be a base URL")
            .push(&format!("bot{}", bot.token()))
            .push("getUpdates");
        Self { client: bot.client().clone(), url }
    }

    /// One long poll: the updates from `offset` on, at most `limit`, waiting up to
    /// `timeout` for the first.
    pub async fn get_updates(
        &self,
        offset: Option<i64>,
        timeout: Duration,
        limit: u8,
    ) -> Result<Vec<RawUpdate>, FetchError> {
        let mut params = serde_json::json!({
            "timeout": timeout.as_secs(),
            "limit": limit,
            "allowed_updates": ALLOWED_UPDATES,
        });
        if let Some(offset) = offset {
            params["offset"] = offset.into();
        }
        let response =
            self.client.post(self.url.clone()).json(&params).send().await.map_err(FetchError::network)?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(FetchError::network)?;
        read_reply(status, &String::from_utf8_lossy(&body))
    }
}

/// A Bot API response, with the batch left as raw elements.
#[derive(Deserialize)]
struct Reply<'a> {
    ok: bool,
    #[serde(borrow, default)]
    result: Option<Vec<&'a RawValue>>,
    #[serde(default)]
    error_code: Option<u16>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Parameters>,
}

#[derive(Deserialize)]
struct Parameters {
    #[serde(default)]
    retry_after: Option<u64>,
    #[serde(default)]
    migrate_to_chat_id: Option<i64>,
}

/// Reads a `getUpdates` response: its updates as raw text, or what went wrong. A batch a
/// strict parser refuses as a whole is split leniently, so each update is judged alone.
pub fn read_reply(status: u16, body: &str) -> Result<Vec<RawUpdate>, FetchError> {
    match serde_json::from_str::<Reply<'_>>(body) {
        Ok(Reply { ok: true, result: Some(updates), .. }) => {
            Ok(updates.into_iter().map(|raw| RawUpdate::new(raw.get())).collect())
        }
        Ok(Reply { ok: true, result: None, .. }) => {
            Err(FetchError::Malformed { status, detail: "success without a result".into() })
        }
        Ok(Reply { error_code, description, parameters, .. }) => {
            Err(classify_refusal(status, error_code, description.unwrap_or_default(), parameters))
        }
        Err(strict) => {
            if let Some(updates) = lenient::ok_result(body).filter(|_| is_success(status)) {
                return Ok(updates.into_iter().map(RawUpdate::new).collect());
            }
            Err(match status {
                401 => FetchError::Unauthorized { status },
                500.. => FetchError::Server { status, description: "(not a Bot API response)".into() },
                // Only the category and position: serde's messages may quote the body.
                _ => FetchError::Malformed {
                    status,
                    detail: format!(
                        "{:?} error at line {} column {}",
                        strict.classify(),
                        strict.line(),
                        strict.column()
                    ),
                },
            })
        }
    }
}

/// Whether a refusal says Telegram does not take the bot token. teloxide reads both
/// "Unauthorized" and a bare "Not Found" (the answer to a malformed token) so.
fn refuses_the_token(code: u16, description: &str) -> bool {
    code == 401 || description == "Unauthorized" || description == "Not Found"
}

/// [`refuses_the_token`] for the answer of any Bot API method (the webhook's checks): an
/// answer that is no Bot API response counts by its status alone, as for `getUpdates`.
pub(crate) fn answer_refuses_the_token(status: u16, body: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Refusal {
        ok: bool,
        error_code: Option<u16>,
        #[serde(default)]
        description: String,
    }
    match serde_json::from_slice::<Refusal>(body) {
        Ok(refusal) => {
            !refusal.ok && refuses_the_token(refusal.error_code.unwrap_or(status), &refusal.description)
        }
        Err(_) => status == 401,
    }
}

fn is_success(status: u16) -> bool {
    (200..300).contains(&status)
}

/// What an `{"ok": false, …}` answer means. Parameters first (as teloxide decides), then
/// Telegram's `error_code` (the HTTP status if it gave none), then the description.
fn classify_refusal(
    status: u16,
    error_code: Option<u16>,
    description: String,
    parameters: Option<Parameters>,
) -> FetchError {
    if let Some(parameters) = parameters {
        if let Some(seconds) = parameters.retry_after {
            return FetchError::RetryAfter(Duration::from_secs(seconds));
        }
        if let Some(chat_id) = parameters.migrate_to_chat_id {
            return FetchError::MigrateToChatId(chat_id);
        }
    }
    let code = error_code.unwrap_or(status);
    if refuses_the_token(code, &description) {
        return FetchError::Unauthorized { status: code };
    }
    if description.contains("webhook is active") {
        return FetchError::WebhookActive;
    }
    if code == 409 || description.starts_with("Conflict") {
        return FetchError::Conflict;
    }
    if code >= 500 {
        return FetchError::Server { status: code, description };
    }
    FetchError::Api { code, description }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(status: u16, body: &str) -> FetchError {
        read_reply(status, body).expect_err("a refusal")
    }

    #[test]
    fn a_nul_character_escaped_or_raw_becomes_the_replacement_character_and_nothing_else_changes() {
        let read = |text: &str| RawUpdate::new(text).text;
        assert_eq!(read(r#"{"update_id":1,"text":"a\u0000b"}"#), r#"{"update_id":1,"text":"a\ufffdb"}"#);
        assert_eq!(read("{\"update_id\":1,\"text\":\"a\0b\"}"), "{\"update_id\":1,\"text\":\"a\u{FFFD}b\"}");
        // An escaped backslash before `u0000` is a backslash and five characters.
        let backslash = r#"{"update_id":1,"text":"a\\u0000b \\\u0000"}"#;
        assert_eq!(read(backslash), r#"{"update_id":1,"text":"a\\u0000b \\\ufffd"}"#);
        let plain = r#"{"update_id":1,"text":"é \"q\" \\"}"#;
        assert_eq!(read(plain), plain);
        let update: serde_json::Value =
            serde_json::from_str(&read(r#"{"update_id":7,"text":"\u0000"}"#)).unwrap();
        assert_eq!(update["text"], "\u{FFFD}");
        assert_eq!(RawUpdate::new(r#"{"update_id":7,"text":"\u0000"}"#).update_id, Some(7));
        // A trailing lone backslash, or one before a raw NUL (neither is JSON).
        assert_eq!(read("x\\"), "x\\");
        assert_eq!(read("\\\0\\u0000"), "\\\u{FFFD}\\ufffd");
    }

    #[test]
    fn a_batch_splits_into_raw_updates_even_with_a_lone_surrogate() {
        let body = r#"{"ok":true,"result":[{"update_id":5,"message":{"text":"\ud800"}},{"update_id":6}]}"#;
        let updates = read_reply(200, body).unwrap();
        assert_eq!(updates.iter().map(|u| u.update_id).collect::<Vec<_>>(), [Some(5), Some(6)]);
        assert_eq!(updates[0].text, r#"{"update_id":5,"message":{"text":"\ud800"}}"#);
        assert_eq!(read_reply(200, r#"{"ok":true,"result":[]}"#).unwrap(), []);
    }

    #[test]
    fn a_batch_a_strict_parser_refuses_is_split_update_by_update() {
        let body = "{\"ok\":true,\"result\":[{\"update_id\":5,\"message\":{\"text\":\"bad \\q escape\"}},{\"update_id\":6,\"message\":{}}]}";
        assert!(serde_json::from_str::<serde_json::Value>(body).is_err());
        let updates = read_reply(200, body).unwrap();
        assert_eq!(updates.iter().map(|u| u.update_id).collect::<Vec<_>>(), [Some(5), Some(6)]);
    }

    #[test]
    fn refusals_are_classified_as_teloxide_would() {
        assert!(matches!(
            refusal(401, r#"{"ok":false,"error_code":401,"description":"Unauthorized"}"#),
            FetchError::Unauthorized { status: 401 }
        ));
        assert!(matches!(
            refusal(404, r#"{"ok":false,"error_code":404,"description":"Not Found"}"#),
            FetchError::Unauthorized { .. }
        ));
        assert!(matches!(
            refusal(
                409,
                r#"{"ok":false,"error_code":409,"description":"Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"}"#
            ),
            FetchError::Conflict
        ));
        for webhook in [
            "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first",
            "can't use getUpdates method while webhook is active",
        ] {
            let body =
                serde_json::json!({"ok": false, "error_code": 409, "description": webhook}).to_string();
            assert!(matches!(refusal(409, &body), FetchError::WebhookActive), "{webhook}");
        }
        assert!(matches!(
            refusal(429, r#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 7","parameters":{"retry_after":7}}"#),
            FetchError::RetryAfter(wait) if wait == Duration::from_secs(7)
        ));
        assert!(matches!(
            refusal(
                400,
                r#"{"ok":false,"error_code":400,"description":"Bad Request: group chat was upgraded to a supergroup chat","parameters":{"migrate_to_chat_id":-100123}}"#
            ),
            FetchError::MigrateToChatId(-100123)
        ));
        assert!(matches!(
            refusal(500, r#"{"ok":false,"error_code":500,"description":"Internal Server Error"}"#),
            FetchError::Server { status: 500, .. }
        ));
        assert!(matches!(refusal(502, "<html>Bad Gateway</html>"), FetchError::Server { status: 502, .. }));
        assert!(matches!(
            refusal(400, r#"{"ok":false,"error_code":400,"description":"Bad Request: wrong parameter"}"#),
            FetchError::Api { code: 400, .. }
        ));
        assert!(matches!(
            refusal(200, "<html>a proxy page</html>"),
            FetchError::Malformed { status: 200, .. }
        ));
    }

    #[test]
    fn errors_never_quote_the_body() {
        // A body that fails to parse where a value is quoted by serde's message.
        let body = r#"{"ok":"a private thought","result":[]}"#;
        let error = refusal(200, body);
        assert!(matches!(error, FetchError::Malformed { .. }));
        assert!(!error.to_string().contains("private thought"), "{error}");
        let truncated = r#"{"ok":true,"result":[{"update_id":1,"message":{"text":"a private thought"#;
        let error = refusal(200, truncated);
        assert!(!error.to_string().contains("private thought"), "{error}");
    }

    #[test]
    fn the_digest_is_stable_across_formatting_and_tells_contents_apart() {
        let compact = RawUpdate::new(r#"{"update_id":1,"message":{"text":"hi","date":5}}"#);
        let spaced = RawUpdate::new("{ \"message\": { \"date\": 5, \"text\": \"hi\" },\n \"update_id\": 1 }");
        let other = RawUpdate::new(r#"{"update_id":1,"message":{"text":"hello","date":5}}"#);
        assert_eq!(compact.digest(), spaced.digest());
        assert_ne!(compact.digest(), other.digest());
        assert_eq!(compact.digest().len(), 64);
        // Not JSON a strict parser accepts: hashed as received, still stable.
        let surrogate = RawUpdate::new(r#"{"update_id":2,"message":{"text":"\ud800"}}"#);
        assert_eq!(surrogate.digest(), RawUpdate::new(&surrogate.text).digest());
        assert_ne!(
            surrogate.digest(),
            RawUpdate::new(r#"{"update_id":2,"message":{"text":"\ud801"}}"#).digest()
        );
    }

    /// Ledgers keep the digests they stored: a re-poll after an upgrade must hash the same.
    #[test]
    fn the_digest_is_the_sha256_of_the_canonical_text_in_lowercase_hex() {
        // sha256 of `{"message":{"text":"hi"},"update_id":1}`.
        assert_eq!(
            RawUpdate::new(r#"{"update_id":1, "message":{"text":"hi"}}"#).digest(),
            "3c1982a6e5d58e0245b2da464baaa66b7c7ff5fa882312ad80325d83929ea778"
        );
        // Not JSON: the trimmed text as received.
        assert_eq!(
            RawUpdate::new(" {\"update_id\":2,\"message\":{\"text\":\"\\ud801\"}}\n").digest(),
            "70b297fe1ebd7d11d57adc8586aa67b1dd8524251819aa9195c6babcd19a9493"
        );
    }
}
