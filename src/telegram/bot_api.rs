//! One Bot API call made with reqwest directly, for the calls whose outcome must be
//! classified exactly: the caller sees the HTTP status and the body as Telegram sent
//! them. teloxide's request layer folds a 5xx into the same error as a refusal (after
//! sleeping ten seconds), which would let a message Telegram may have posted count as
//! "not sent".

use bytes::Bytes;
use serde::Deserialize;
use teloxide::Bot;

/// What became of one HTTP exchange with the Bot API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exchange {
    /// The connection was never made: the request provably did not leave.
    NotConnected(String),
    /// An HTTP answer arrived, complete.
    Answered { status: u16, body: Bytes },
    /// The request may have left and no complete answer came back (a timeout, a
    /// connection broken after sending).
    NoAnswer(String),
}

/// The envelope of every Bot API answer.
#[derive(Debug, Deserialize)]
pub struct Answer<T> {
    pub ok: bool,
    pub result: Option<T>,
    pub error_code: Option<u16>,
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<ResponseParameters>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ResponseParameters {
    pub retry_after: Option<u64>,
    pub migrate_to_chat_id: Option<i64>,
}

/// Calls Bot API methods with the HTTP client and base URL of a teloxide `Bot`, so the
/// timeouts configured for that bot apply.
#[derive(Debug, Clone)]
pub struct BotApi {
    client: reqwest::Client,
    /// `{api_url}/bot{token}/`: holds the token, so it is never logged or shown.
    base: reqwest::Url,
}

impl BotApi {
    pub fn from_bot(bot: &Bot) -> Self {
        let mut base = bot.api_url();
        let path = format!("{}/bot{}/", base.path().trim_end_matches('/'), bot.token());
        base.set_path(&path);
        Self { client: bot.client().clone(), base }
    }

    /// POSTs `params` as JSON to `method`.
    pub async fn call(&self, method: &str, params: &impl serde::Serialize) -> Exchange {
        let url = match self.base.join(method) {
            Ok(url) => url,
            Err(e) => return Exchange::NotConnected(format!("bad method name {method}: {e}")),
        };
        let response = match self.client.post(url).json(params).send().await {
            Ok(response) => response,
            Err(e) => return transport_failure(e),
        };
        let status = response.status().as_u16();
        match response.bytes().await {
            Ok(body) => Exchange::Answered { status, body },
            Err(e) => transport_failure(e),
        }
    }
}

/// A reqwest failure, with the URL (which holds the token) left out of every message.
fn transport_failure(error: reqwest::Error) -> Exchange {
    let connect = error.is_connect();
    let timeout = error.is_timeout();
    let detail = root_cause(&error.without_url());
    if connect {
        Exchange::NotConnected(detail)
    } else if timeout {
        Exchange::NoAnswer("Telegram did not answer within telegram.send_timeout_secs".to_owned())
    } else {
        Exchange::NoAnswer(format!("the connection to Telegram failed after the request went out: {detail}"))
    }
}

/// The innermost cause of an error: what went wrong, without the layers that wrapped it.
pub(super) fn root_cause(error: &dyn std::error::Error) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_url_holds_the_token_and_keeps_a_path_prefix() {
        let bot = Bot::new("123:abc").set_api_url("http://127.0.0.1:8081/prefix".parse().unwrap());
        let api = BotApi::from_bot(&bot);
        assert_eq!(
            api.base.join("sendMessage").unwrap().as_str(),
            "http://127.0.0.1:8081/prefix/bot123:abc/sendMessage"
        );
        let plain =
            BotApi::from_bot(&Bot::new("123:abc").set_api_url("https://api.telegram.org".parse().unwrap()));
        assert_eq!(plain.base.join("getMe").unwrap().as_str(), "https://api.telegram.org/bot123:abc/getMe");
    }

    #[test]
    fn answers_parse_with_and_without_parameters() {
        let ok: Answer<serde_json::Value> =
            serde_json::from_str(r#"{"ok":true,"result":{"message_id":5}}"#).unwrap();
        assert!(ok.ok && ok.result.is_some());
        let limited: Answer<serde_json::Value> = serde_json::from_str(
            r#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 3","parameters":{"retry_after":3}}"#,
        )
        .unwrap();
        assert_eq!(limited.parameters.unwrap().retry_after, Some(3));
    }
}
