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

/// `len` random characters of [`ID_ALPHABET`]: the tail of every generated id.
pub fn random_suffix(len: usize) -> String {
    let mut rng = rand::rng();
    (0..len).map(|_| ID_ALPHABET[rng.random_range(0..ID_ALPHABET.len())] as char).collect()
}

/// What the tails of generated ids are made of: lowercase letters and digits, which a model
/// copies without mistakes.
const ID_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// An id the daemon generates: a prefix naming what it identifies, then `$len` characters
/// of [`ID_ALPHABET`]. `parse` accepts what a model or an operator typed: surrounding
/// whitespace is forgiven, anything else is not; deserializing parses.
macro_rules! generated_id {
    ($(#[$doc:meta])* $name:ident, $what:literal, $prefix:literal, $len:literal, $example:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn generate() -> Self {
                Self(format!("{}{}", $prefix, random_suffix($len)))
            }

            pub fn parse(raw: &str) -> Result<Self, String> {
                let raw = raw.trim();
                let valid = raw
                    .strip_prefix($prefix)
                    .is_some_and(|tail| tail.len() == $len && tail.bytes().all(|b| ID_ALPHABET.contains(&b)));
                if valid {
                    Ok(Self(raw.to_owned()))
                } else {
                    Err(format!("'{raw}' is not {} (they look like {})", $what, $example))
                }
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

        /// An id is read as its text wherever text is wanted (a log line, a message, a
        /// map key); only [`Self::parse`] and [`Self::generate`] make one.
        impl std::ops::Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let raw = String::deserialize(d)?;
                Self::parse(&raw).map_err(serde::de::Error::custom)
            }
        }

        /// Unit tests write ids as literals; a malformed one fails the test that wrote it.
        #[cfg(test)]
        impl From<&str> for $name {
            fn from(raw: &str) -> Self {
                Self::parse(raw).unwrap_or_else(|e| panic!("{e}"))
            }
        }
    };
}

generated_id!(
    /// The stable id of an envelope. Short enough for a model to copy without mistakes,
    /// long enough (36^10 ≈ 3.7e15) that collisions are a non-issue; the ledger's unique
    /// index catches the impossible case anyway.
    ///
    /// ```
    /// use switchboard::ids::TraceId;
    ///
    /// assert!(TraceId::parse(" env_k3x9q2m7ab\n").is_ok());
    /// assert!(TraceId::parse("k3x9q2m7ab").is_err());
    /// assert!(TraceId::parse("env_K3X9Q2M7AB").is_err());
    /// ```
    TraceId,
    "a trace id",
    "env_",
    10,
    "env_k3x9q2m7ab"
);
generated_id!(
    /// A handoff from one agent to another (DESIGN §9).
    HandoffId,
    "a handoff id",
    "hof_",
    10,
    "hof_k3x9q2m7ab"
);
generated_id!(
    /// A room's exchange: the cascade of turns one human message starts (DESIGN §10).
    CascadeId,
    "an exchange id",
    "cas_",
    10,
    "cas_k3x9q2m7ab"
);
generated_id!(
    /// A task: one conversation's objective and its revisions (DESIGN §11).
    TaskId,
    "a task id",
    "task_",
    8,
    "task_k3x9q2m7"
);
generated_id!(
    /// One send attempt: a part of a reply, a reaction, an edit (DESIGN §4).
    AttemptId,
    "an attempt id",
    "op_",
    10,
    "op_k3x9q2m7ab"
);

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
            REQUEST_SUFFIX_LEN.contains(&suffix.len()) && suffix.bytes().all(|b| ID_ALPHABET.contains(&b))
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
    fn every_generated_id_parses_back_as_its_own_kind_only() {
        fn parses_back<T: std::ops::Deref<Target = str> + PartialEq + fmt::Debug>(
            generate: fn() -> T,
            parse: fn(&str) -> Result<T, String>,
        ) -> String {
            let id = generate();
            assert_eq!(parse(&id).as_ref(), Ok(&id));
            for bad in
                [format!("{}X", &id[..id.len() - 1]), format!("{}a", &*id), id[..id.len() - 1].to_owned()]
            {
                assert!(parse(&bad).is_err(), "{bad} should be rejected");
            }
            id.to_string()
        }
        let samples = [
            parses_back(TraceId::generate, TraceId::parse),
            parses_back(HandoffId::generate, HandoffId::parse),
            parses_back(CascadeId::generate, CascadeId::parse),
            parses_back(TaskId::generate, TaskId::parse),
            parses_back(AttemptId::generate, AttemptId::parse),
        ];
        assert!(TaskId::parse(&samples[1]).is_err(), "a handoff id is not a task id");
        assert!(HandoffId::parse(&samples[0]).is_err(), "a trace id is not a handoff id");
        assert!(AttemptId::parse(&samples[2]).is_err(), "an exchange id is not an attempt id");
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
