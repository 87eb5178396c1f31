//! Identifiers that can only hold valid values ("parse, don't validate").

use std::fmt;

use rand::Rng;
use serde::{Deserialize, Deserializer, Serialize};
use subtle::ConstantTimeEq;

/// Rejects names that would be awkward in logs, URLs and environment variable names.
fn parse_name(kind: &str, raw: &str) -> Result<String, String> {
    let valid_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if raw.is_empty() {
        return Err(format!("{kind} must not be empty"));
    }
    if raw.len() > MAX_NAME_LEN {
        return Err(format!("{kind} '{raw}' is longer than {MAX_NAME_LEN} characters"));
    }
    if !raw.chars().all(valid_char) {
        return Err(format!("{kind} '{raw}' may only contain ASCII letters, digits, '-' and '_'"));
    }
    Ok(raw.to_owned())
}

/// Long enough for any sensible name, short enough to read in a log line.
const MAX_NAME_LEN: usize = 64;

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn parse(raw: &str) -> Result<Self, String> {
                parse_name($kind, raw).map(Self)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let raw = String::deserialize(d)?;
                Self::parse(&raw).map_err(serde::de::Error::custom)
            }
        }
    };
}

name_type!(
    /// The name of an agent, as declared by an `[agents.NAME]` table.
    AgentName,
    "agent name"
);
name_type!(
    /// The name of a route, as declared by `[[routes]] name = …`.
    RouteName,
    "route name"
);

/// The stable id of an envelope: `env_` and ten lowercase letters or digits. Short enough
/// for a model to copy without mistakes, long enough (36^10 ≈ 3.7e15) that collisions are
/// a non-issue; the ledger's unique index catches the impossible case anyway.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct TraceId(String);

const TRACE_PREFIX: &str = "env_";
const TRACE_SUFFIX_LEN: usize = 10;
const TRACE_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// `len` random characters of [`TRACE_ALPHABET`]: the tail of every generated id.
pub fn random_suffix(len: usize) -> String {
    let mut rng = rand::rng();
    (0..len).map(|_| TRACE_ALPHABET[rng.random_range(0..TRACE_ALPHABET.len())] as char).collect()
}

impl TraceId {
    pub fn generate() -> Self {
        Self(format!("{TRACE_PREFIX}{}", random_suffix(TRACE_SUFFIX_LEN)))
    }

    /// Accepts what a model typed: surrounding whitespace is forgiven, anything else is not.
    ///
    /// ```
    /// use switchboard::ids::TraceId;
    ///
    /// assert!(TraceId::parse(" env_k3x9q2m7ab\n").is_ok());
    /// assert!(TraceId::parse("k3x9q2m7ab").is_err());
    /// assert!(TraceId::parse("env_K3X9Q2M7AB").is_err());
    /// ```
    pub fn parse(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        let suffix = raw
            .strip_prefix(TRACE_PREFIX)
            .ok_or_else(|| format!("'{raw}' is not a trace id (they look like env_k3x9q2m7ab)"))?;
        let valid = suffix.len() == TRACE_SUFFIX_LEN && suffix.bytes().all(|b| TRACE_ALPHABET.contains(&b));
        if !valid {
            return Err(format!("'{raw}' is not a trace id (they look like env_k3x9q2m7ab)"));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for TraceId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Self::parse(&raw).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

/// The id a channel plugin gives one `reply` request: `req_` and 8 to 32 lowercase letters
/// or digits. The daemon records it with the request's attempts, so a repeated request
/// returns the first one's outcome instead of sending again, and a plugin whose
/// connection broke can ask what became of it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct RequestId(String);

const REQUEST_PREFIX: &str = "req_";
const REQUEST_SUFFIX_LEN: std::ops::RangeInclusive<usize> = 8..=32;
/// What [`RequestId::generate`] uses: 36^16 ≈ 8e24 ids, so two plugins never collide.
const GENERATED_REQUEST_SUFFIX_LEN: usize = 16;

impl RequestId {
    pub fn generate() -> Self {
        Self(format!("{REQUEST_PREFIX}{}", random_suffix(GENERATED_REQUEST_SUFFIX_LEN)))
    }

    pub fn parse(raw: &str) -> Result<Self, String> {
        let valid = raw.strip_prefix(REQUEST_PREFIX).is_some_and(|suffix| {
            REQUEST_SUFFIX_LEN.contains(&suffix.len()) && suffix.bytes().all(|b| TRACE_ALPHABET.contains(&b))
        });
        if valid {
            Ok(Self(raw.to_owned()))
        } else {
            Err(format!("'{raw}' is not a request id (req_ and 8 to 32 lowercase letters or digits)"))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

impl<'de> Deserialize<'de> for RequestId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Self::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// A secret read from the environment. Its `Debug` never shows the value, so a secret
/// that ends up in a logged struct does not leak.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Compares in time independent of where the first difference is, so the local API
    /// does not leak a secret byte by byte through response times. Only the length may
    /// show, which tells an attacker nothing they can build on.
    pub fn matches(&self, candidate: &str) -> bool {
        self.0.as_bytes().ct_eq(candidate.as_bytes()).into()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_trace_ids_parse_back() {
        for _ in 0..100 {
            let id = TraceId::generate();
            assert_eq!(TraceId::parse(id.as_str()), Ok(id));
        }
    }

    #[test]
    fn trace_id_rejects_lookalikes() {
        for bad in
            ["", "env_", "env_short", "ENV_abcdefghij", "env_ABCDEFGHIJ", "env_abcdefghijk", "msg_abcdefghij"]
        {
            assert!(TraceId::parse(bad).is_err(), "{bad} should be rejected");
        }
        assert!(TraceId::parse("  env_abcdefghij\n").is_ok());
    }

    #[test]
    fn request_ids_parse_back_and_reject_lookalikes() {
        let id = RequestId::generate();
        assert_eq!(RequestId::parse(id.as_str()), Ok(id));
        for bad in
            ["", "req_", "req_short", "req_ABCDEFGHIJ", "env_abcdefghij", &format!("req_{}", "a".repeat(33))]
        {
            assert!(RequestId::parse(bad).is_err(), "{bad} should be rejected");
        }
        assert!(RequestId::parse("req_abcdefgh").is_ok());
    }

    #[test]
    fn names_reject_bad_characters() {
        assert!(AgentName::parse("worker-1_a").is_ok());
        assert!(AgentName::parse("").is_err());
        assert!(AgentName::parse("has space").is_err());
        assert!(RouteName::parse("ümlaut").is_err());
        assert!(RouteName::parse(&"x".repeat(65)).is_err());
    }

    #[test]
    fn names_honour_width_so_tables_line_up() {
        assert_eq!(format!("{:<8}|", RouteName::parse("dm").unwrap()), "dm      |");
        assert_eq!(format!("{:>6}", AgentName::parse("ops").unwrap()), "   ops");
    }

    #[test]
    fn secret_debug_is_redacted_and_matching_is_exact() {
        let s = Secret::new("hunter2".into());
        assert_eq!(format!("{s:?}"), "Secret(***)");
        assert!(s.matches("hunter2"));
        assert!(!s.matches("hunter3"));
        assert!(!s.matches("hunter22"));
        assert!(!s.matches("hunter"));
        assert!(!s.matches(""));
    }
}
