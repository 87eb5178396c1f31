//! What `switchboard healthcheck --config FILE` reads of the file: the `[api]` addresses
//! and the client certificate, with the same defaults and `SWITCHBOARD__API__…`
//! overrides as the daemon, and nothing else.
//!
//! Not [`Settings::load`](super::Settings::load): the probe asks a daemon that is already
//! running, whose configuration is the one it started with (and reloads applied), not the
//! file on disk. A mistake elsewhere in that file (a reload refused it, or it awaits a fix)
//! must not make a running daemon unhealthy, so every other table and key is ignored here.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::validate::config_crate_error;
use super::{ClientIdentity, ConfigError, DaemonUrl, ENV_PREFIX, ENV_SEPARATOR, with_environment};

/// Where a health check asks, and what it must show there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthProbe {
    /// `api.health_listen` (plain HTTP) when it is set, else the local API (`api.listen`,
    /// over TLS with `api.tls`).
    pub url: DaemonUrl,
    /// The address asks for a client certificate: the local API with
    /// `api.tls.client_ca` (`api.health_listen` never does).
    pub asks_for_a_certificate: bool,
    /// `api.client_cert` and `api.client_key`, when both are given.
    pub client_identity: Option<ClientIdentity>,
}

/// The file's tables as the probe reads them: `[api]` alone, the rest ignored.
#[derive(Debug, Default, Deserialize)]
struct ProbedFile {
    #[serde(default)]
    api: ProbedApi,
}

/// The keys of `[api]` the probe needs, with the daemon's defaults; others are ignored.
#[derive(Debug, Deserialize)]
struct ProbedApi {
    #[serde(default = "super::raw::default_listen")]
    listen: String,
    #[serde(default)]
    tls: Option<ProbedTls>,
    #[serde(default)]
    health_listen: Option<String>,
    #[serde(default)]
    client_cert: Option<String>,
    #[serde(default)]
    client_key: Option<String>,
}

impl Default for ProbedApi {
    fn default() -> Self {
        Self {
            listen: super::raw::default_listen(),
            tls: None,
            health_listen: None,
            client_cert: None,
            client_key: None,
        }
    }
}

#[derive(Debug, Deserialize)]
struct ProbedTls {
    #[serde(default)]
    client_ca: Option<String>,
}

impl HealthProbe {
    /// Reads `path` (and this process's `SWITCHBOARD__API__…` variables) for a health check.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_under(path, std::env::vars())
    }

    fn load_under(path: &Path, vars: impl Iterator<Item = (String, String)>) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(path, "(file)", format!("cannot read: {e}")))?;
        let file =
            config::Config::builder().add_source(config::File::from_str(&text, config::FileFormat::Toml));
        // Only `[api]`'s overrides: another one that would not read must not stop the probe.
        let prefix = format!("{ENV_PREFIX}{ENV_SEPARATOR}API{ENV_SEPARATOR}");
        let api_vars = vars.filter(|(name, _)| name.starts_with(&prefix));
        let probed: ProbedFile = with_environment(file, api_vars)
            .and_then(|builder| builder.build())
            .and_then(config::Config::try_deserialize)
            .map_err(|e| config_crate_error(path, &text, e))?;
        Self::of(path, probed.api)
    }

    fn of(path: &Path, api: ProbedApi) -> Result<Self, ConfigError> {
        let address = |key: &str, text: &str| {
            text.parse::<SocketAddr>().map_err(|_| {
                ConfigError::new(path, key, format!("'{text}' is not an address like 127.0.0.1:7797"))
            })
        };
        let listen = address("api.listen", &api.listen)?;
        let health_listen =
            api.health_listen.as_deref().map(|text| address("api.health_listen", text)).transpose()?;
        let url = match health_listen {
            Some(health) => DaemonUrl::beside(health, false),
            None => DaemonUrl::beside(listen, api.tls.is_some()),
        };
        let asks_for_a_certificate =
            health_listen.is_none() && api.tls.is_some_and(|tls| tls.client_ca.is_some());
        let client_identity = match (api.client_cert, api.client_key) {
            (Some(cert), Some(key)) if !cert.trim().is_empty() && !key.trim().is_empty() => {
                Some(ClientIdentity { cert: PathBuf::from(cert), key: PathBuf::from(key) })
            }
            _ => None,
        };
        Ok(Self { url, asks_for_a_certificate, client_identity })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(toml: &str, vars: &[(&str, &str)]) -> Result<HealthProbe, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("switchboard.toml");
        std::fs::write(&path, toml).unwrap();
        let vars = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        HealthProbe::load_under(&path, vars.into_iter())
    }

    #[test]
    fn a_mistake_outside_the_api_table_does_not_stop_the_probe() {
        let file = r#"
[telegram]
token_env = "TOKEN"
poll_timeout_secs = 900
no_such_key = true

[api]
listen = "127.0.0.1:7801"
some_future_key = 1

[[routes]]
name = "dm"
agent = "ghost"
"#;
        let vars = [("SWITCHBOARD__TELEGRAM__SEND_TIMEOUT_SECS", "not a number")];
        let probe = probe(file, &vars).unwrap();
        assert_eq!(probe.url.to_string(), "http://127.0.0.1:7801");
        assert!(!probe.asks_for_a_certificate);
    }

    #[test]
    fn the_daemons_defaults_and_api_overrides_apply() {
        assert_eq!(probe("", &[]).unwrap().url.to_string(), "http://127.0.0.1:7797");
        let overridden =
            probe("[api]\nlisten = \"127.0.0.1:7801\"\n", &[("SWITCHBOARD__API__LISTEN", "0.0.0.0:7802")]);
        assert_eq!(overridden.unwrap().url.to_string(), "http://127.0.0.1:7802", "asked on loopback");
        let health = "[api]\nhealth_listen = \"127.0.0.1:7798\"\ntls = { cert = \"c\", key = \"k\", client_ca = \"ca\" }\n";
        let health = probe(health, &[]).unwrap();
        assert_eq!(health.url.to_string(), "http://127.0.0.1:7798");
        assert!(!health.asks_for_a_certificate, "the health address never asks");
        let mutual = probe("[api]\ntls = { cert = \"c\", key = \"k\", client_ca = \"ca\" }\n", &[]).unwrap();
        assert_eq!(mutual.url.to_string(), "https://127.0.0.1:7797");
        assert!(mutual.asks_for_a_certificate);
    }

    #[test]
    fn an_address_it_cannot_read_is_refused_by_its_key() {
        let error = probe("[api]\nlisten = \"nowhere\"\n", &[]).unwrap_err();
        assert_eq!(error.key, "api.listen");
        assert!(probe("[api\n", &[]).is_err(), "a file that is not TOML has no address to read");
    }
}
