//! `switchboard healthcheck`: asks a running daemon's `GET /readyz` and exits 0 only when it
//! is ready. The runtime image has no curl, and the binary is already there; a container's
//! `HEALTHCHECK` runs it with the daemon's own configuration and environment.

use std::time::Duration;

use anyhow::Context;

use crate::config::DaemonUrl;
use crate::operate::health::Readiness;

/// A readiness check answers in well under a second (one small ledger write); beyond this
/// the daemon counts as not ready.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Asks `/readyz` at `address`: Ok when ready (its answer printed), an error naming every
/// reason when not.
pub async fn check(daemon: &DaemonUrl) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(TIMEOUT)
        // Over TLS the certificate names the daemon as plugins reach it, not as the loopback
        // address asked here. The check sends no credential and believes nothing but a
        // readiness report, so whose certificate answers does not matter to it.
        .danger_accept_invalid_certs(daemon.is_tls())
        .build()?;
    let url = format!("{daemon}/readyz");
    let response = client.get(&url).send().await.with_context(|| format!("no answer from {url}"))?;
    let status = response.status();
    let body = response.text().await.with_context(|| format!("reading the answer of {url}"))?;
    let readiness: Readiness = serde_json::from_str(&body).with_context(|| {
        format!("{url} answered HTTP {status} with something that is not a readiness report")
    })?;
    if status.is_success() && readiness.ready {
        println!("ready ({url})");
        return Ok(());
    }
    let reasons: Vec<String> =
        readiness.reasons.iter().map(|r| format!("{}: {}", r.code, r.detail)).collect();
    anyhow::bail!("not ready (HTTP {status} from {url}): {}", reasons.join("; "))
}
