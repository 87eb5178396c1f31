//! Reading JSON that a strict parser refused, just enough to keep going: the elements of an
//! array and the members of an object, found by tracking strings and brackets only.
//!
//! Nothing is validated or unescaped, so one broken value cannot hide its neighbours: a
//! batch of updates with one syntax error still splits into its updates, and an update
//! that cannot be decoded still tells its `update_id` and, usually, its chat.

/// The elements of the JSON array `text`, as raw text. `None` when `text` is not an
/// array or is not closed.
pub fn elements(text: &str) -> Option<Vec<&str>> {
    let text = text.trim();
    if !text.starts_with('[') {
        return None;
    }
    parts(text)
}

/// The members of the JSON object `text`, as (key, raw value) pairs. Keys are taken as
/// written (the Bot API's are plain identifiers). A member that does not even look like
/// `"key": value` is left out. `None` when `text` is not an object or is not closed.
pub fn members(text: &str) -> Option<Vec<(&str, &str)>> {
    let text = text.trim();
    if !text.starts_with('{') {
        return None;
    }
    let members = parts(text)?
        .into_iter()
        .filter_map(|part| {
            let key_end = string_end(part.as_bytes(), 0)?;
            let key = &part[1..key_end - 1];
            let value = part[key_end..].trim_start().strip_prefix(':')?.trim();
            Some((key, value))
        })
        .collect();
    Some(members)
}

/// The raw value of `key` in the JSON object `text`.
pub fn member<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    members(text)?.into_iter().find(|(k, _)| *k == key).map(|(_, value)| value)
}

/// A JSON integer, as written.
pub fn integer(value: &str) -> Option<i64> {
    value.trim().parse().ok()
}

/// A JSON string without escapes, as written (enough for the Bot API's enumerations such
/// as a chat's `type`).
pub fn plain_string(value: &str) -> Option<&str> {
    let inner = value.trim().strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains(['"', '\\'])).then_some(inner)
}

/// The `result` array of a successful Bot API response (`{"ok": true, "result": [...]}`).
pub fn ok_result(body: &str) -> Option<Vec<&str>> {
    let members = members(body)?;
    let ok = members.iter().any(|(key, value)| *key == "ok" && *value == "true");
    let result = members.iter().find(|(key, _)| *key == "result").map(|(_, value)| *value)?;
    if ok { elements(result) } else { None }
}

/// The top-level parts of the array or object that `text` starts with, split at the commas
/// outside strings and nested brackets. Empty parts are left out.
fn parts(text: &str) -> Option<Vec<&str>> {
    let bytes = text.as_bytes();
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 1;
    let mut i = 1;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i = string_end(bytes, i)?;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' if depth > 0 => depth -= 1,
            b'}' | b']' => {
                push_part(&mut parts, &text[start..i]);
                return Some(parts);
            }
            b',' if depth == 0 => {
                push_part(&mut parts, &text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

fn push_part<'a>(parts: &mut Vec<&'a str>, part: &'a str) {
    let part = part.trim();
    if !part.is_empty() {
        parts.push(part);
    }
}

/// The index just past the string that starts at `bytes[start]` (a `"`), skipping
/// backslash escapes without interpreting them.
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    if bytes.get(start) != Some(&b'"') {
        return None;
    }
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_an_array_whose_elements_a_strict_parser_refuses() {
        // A raw line break inside a string and an unknown escape: both invalid JSON.
        let text = "[{\"update_id\": 1, \"text\": \"a\nb\"}, {\"update_id\": 2, \"text\": \"\\x, ]}\"}, 3 ]";
        assert!(serde_json::from_str::<serde_json::Value>(text).is_err());
        let parts = elements(text).unwrap();
        assert_eq!(parts.len(), 3);
        assert_eq!(integer(member(parts[0], "update_id").unwrap()), Some(1));
        assert_eq!(member(parts[1], "text"), Some("\"\\x, ]}\""));
        assert_eq!(parts[2], "3");
    }

    #[test]
    fn reads_nested_members_as_written() {
        let update = r#"{"update_id": 7, "message_reaction": {"chat": {"id": -100, "type": "supergroup"}, "message_id": 3}}"#;
        let members = members(update).unwrap();
        assert_eq!(members.iter().map(|(k, _)| *k).collect::<Vec<_>>(), ["update_id", "message_reaction"]);
        let chat = member(member(update, "message_reaction").unwrap(), "chat").unwrap();
        assert_eq!(integer(member(chat, "id").unwrap()), Some(-100));
        assert_eq!(plain_string(member(chat, "type").unwrap()), Some("supergroup"));
        assert_eq!(plain_string(r#""a\"b""#), None);
    }

    #[test]
    fn finds_the_result_of_a_successful_response_only() {
        let body = r#"{"ok":true,"result":[{"update_id":1},{"update_id":2}]}"#;
        assert_eq!(ok_result(body).unwrap().len(), 2);
        assert_eq!(ok_result(r#"{"ok":true,"result":[]}"#), Some(vec![]));
        assert_eq!(ok_result(r#"{"ok":false,"result":[1]}"#), None);
        assert_eq!(ok_result("<html>502 Bad Gateway</html>"), None);
        assert_eq!(ok_result(r#"{"ok":true,"result":[{"update_id":1}"#), None, "not closed");
    }
}
