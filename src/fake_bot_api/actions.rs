//! The fake's answers to the calls around messages (issue 22): `setMessageReaction`,
//! `editMessageText`, `sendChatAction`, `setMyCommands`, and the check Telegram makes of
//! a message's HTML (`parse_mode = "HTML"`), which refuses what it cannot parse with
//! 400 "Bad Request: can't parse entities". Every request is recorded by the server before
//! it gets here ([`super::FakeTelegram::requests_for`]).

use serde_json::{Map, Value, json};

use super::server::{bad_request, bot_user_json, chat_json, int_param, ok, str_param, unix_now};
use super::state::Shared;

/// The tags Telegram's HTML knows (<https://core.telegram.org/bots/api#html-style>).
const TELEGRAM_TAGS: &[&str] = &[
    "b",
    "strong",
    "i",
    "em",
    "u",
    "ins",
    "s",
    "strike",
    "del",
    "span",
    "tg-spoiler",
    "a",
    "code",
    "pre",
    "blockquote",
    "tg-emoji",
];

/// The entities Telegram's HTML knows by name (numeric ones are accepted too).
const NAMED_ENTITIES: &[&str] = &["lt", "gt", "amp", "quot"];

/// Answers one of the methods of this module; `None` for any other method.
pub(super) fn answer(
    shared: &Shared,
    method: &str,
    params: &Map<String, Value>,
) -> Option<axum::response::Response> {
    Some(match method {
        "setmessagereaction" => match (int_param(params, "chat_id"), int_param(params, "message_id")) {
            (Ok(Some(_)), Ok(Some(_))) => ok(json!(true)),
            _ => bad_request("Bad Request: message to react not found"),
        },
        "editmessagetext" => edit_message_text(shared, params),
        "sendchataction" => match int_param(params, "chat_id") {
            Ok(Some(_)) if str_param(params, "action").is_some() => ok(json!(true)),
            _ => bad_request("Bad Request: chat_id and action are required"),
        },
        "setmycommands" => match params.get("commands") {
            Some(Value::Array(_)) => ok(json!(true)),
            Some(Value::String(text)) if serde_json::from_str::<Vec<Value>>(text).is_ok() => ok(json!(true)),
            _ => bad_request("Bad Request: can't parse BotCommand array"),
        },
        _ => return None,
    })
}

/// Replaces the text of a message the bot sent, as Telegram does: a message it did not
/// send is not found, and the same text again is "not modified".
fn edit_message_text(shared: &Shared, params: &Map<String, Value>) -> axum::response::Response {
    let (Ok(Some(chat_id)), Ok(Some(message_id))) =
        (int_param(params, "chat_id"), int_param(params, "message_id"))
    else {
        return bad_request("Bad Request: message to edit not found");
    };
    let text = str_param(params, "text").unwrap_or_default();
    if text.is_empty() {
        return bad_request("Bad Request: message text is empty");
    }
    let parse_mode = str_param(params, "parse_mode");
    if is_html(parse_mode.as_deref())
        && let Err(description) = check_html(&text)
    {
        return bad_request(&description);
    }
    let edited = {
        let mut state = shared.lock();
        let kind = state.chat_kind(chat_id);
        let Some(sent) = state
            .sent
            .iter_mut()
            .find(|sent| sent.chat_id == chat_id && i64::from(sent.message_id) == message_id)
        else {
            return bad_request("Bad Request: message to edit not found");
        };
        if sent.text == text {
            return bad_request(
                "Bad Request: message is not modified: specified new message content and reply markup are exactly \
                 the same as a current content and reply markup of the message",
            );
        }
        sent.text = text.clone();
        sent.parse_mode = parse_mode;
        json!({
            "message_id": message_id,
            "date": unix_now(),
            "edit_date": unix_now(),
            "chat": chat_json(chat_id, &kind),
            "from": bot_user_json(),
            "text": text,
        })
    };
    shared.changed.notify_waiters();
    ok(edited)
}

/// Whether a parse mode is Telegram's HTML.
pub(super) fn is_html(parse_mode: Option<&str>) -> bool {
    parse_mode.is_some_and(|mode| mode.eq_ignore_ascii_case("html"))
}

/// Telegram's check of a message's HTML: known tags only, each closed in order, and every
/// `<`, `>` and `&` that is no part of a tag or an entity escaped. What fails is answered
/// as Telegram answers it.
pub(super) fn check_html(text: &str) -> Result<(), String> {
    let refuse = |why: String| Err(format!("Bad Request: can't parse entities: {why}"));
    let mut open: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(['<', '&', '>']) {
        let from = &rest[at..];
        if from.starts_with('>') {
            return refuse("unexpected \">\"".into());
        }
        if from.starts_with('&') {
            let Some(end) = from.find(';') else { return refuse("unescaped \"&\"".into()) };
            let name = &from[1..end];
            let numeric = name.strip_prefix('#').is_some_and(|n| {
                n.strip_prefix('x')
                    .map_or_else(|| n.parse::<u32>().is_ok(), |h| u32::from_str_radix(h, 16).is_ok())
            });
            if !numeric && !NAMED_ENTITIES.contains(&name) {
                return refuse(format!("unsupported entity \"&{name};\""));
            }
            rest = &from[end + 1..];
            continue;
        }
        let Some(end) = from.find('>') else { return refuse("unclosed start tag".into()) };
        let inner = &from[1..end];
        let (closing, inner) = inner.strip_prefix('/').map_or((false, inner), |inner| (true, inner));
        let name = inner.split_whitespace().next().unwrap_or_default().to_ascii_lowercase();
        if !TELEGRAM_TAGS.contains(&name.as_str()) {
            return refuse(format!("unsupported start tag \"{name}\""));
        }
        if closing {
            if open.pop().as_deref() != Some(name.as_str()) {
                return refuse(format!("unmatched end tag \"{name}\""));
            }
        } else {
            open.push(name);
        }
        rest = &from[end + 1..];
    }
    match open.pop() {
        Some(unclosed) => refuse(format!("can't find end tag corresponding to start tag \"{unclosed}\"")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn telegram_html_is_checked_as_telegram_does() {
        for good in
            ["plain", "<b>bold</b> &amp; <a href=\"x\">l</a>", "<pre><code>x &lt; y</code></pre>", "&#65;"]
        {
            assert_eq!(check_html(good), Ok(()), "{good}");
        }
        for bad in ["<b>open", "</b>", "<div>x</div>", "a < b", "a & b", "<b><i>x</b></i>"] {
            let refused = check_html(bad).unwrap_err();
            assert!(refused.starts_with("Bad Request: can't parse entities"), "{bad}: {refused}");
        }
    }
}
