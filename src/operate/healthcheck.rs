//! `switchboard healthcheck`: asks a running daemon's `GET /readyz` and exits 0 only when it
//! is ready. The runtime image has no curl, and the binary is already there; a container's
//! `HEALTHCHECK` runs it with the daemon's own configuration and environment.

use std::time::Duration;

use anyhow::Context;

use crate::config::DaemonUrl;
use crate::operate::health::{Readiness, STANDING_BY_CODE};

/// A readiness check answers in well under a second (one small ledger write); beyond this
/// the daemon counts as not ready.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Asks `/readyz` at `address`: Ok when ready (its answer printed), an error naming every
/// reason when not. With `standby_is_healthy`, a replica that stands by and has no other
/// reason not to be ready passes too.
pub async fn check(
    daemon: &DaemonUrl,
    identity: Option<reqwest::Identity>,
    standby_is_healthy: bool,
) -> anyhow::Result<()> {
    let mut client = reqwest::Client::builder()
        .no_proxy()
        .timeout(TIMEOUT)
        // Over TLS the certificate names the daemon as plugins reach it, not as the loopback
        // address asked here. The check sends no credential and believes nothing but a
        // readiness report, so whose certificate answers does not matter to it.
        .danger_accept_invalid_certs(daemon.is_tls());
    // A daemon that requires client certificates (`api.tls.client_ca`) is shown this one.
    if let Some(identity) = identity {
        client = client.identity(identity);
    }
    let client = client.build()?;
    let url = format!("{daemon}/readyz");
    let response = client.get(&url).send().await.with_context(|| format!("no answer from {url}"))?;
    let status = response.status();
    let body = response.text().await.with_context(|| format!("reading the answer of {url}"))?;
    let readiness: Readiness = serde_json::from_str(&body).with_context(|| {
        format!("{url} answered HTTP {status} with something that is not a readiness report")
    })?;
    match verdict(status.is_success(), &readiness, standby_is_healthy) {
        Verdict::Ready => println!("ready ({url})"),
        Verdict::StandingBy => println!("standing by ({url}): another replica leads"),
        Verdict::NotReady => {
            let reasons: Vec<String> =
                readiness.reasons.iter().map(|r| format!("{}: {}", r.code, r.detail)).collect();
            anyhow::bail!("not ready (HTTP {status} from {url}): {}", reasons.join("; "))
        }
    }
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Ready,
    /// Healthy for a supervisor that runs replicas: waiting to be elected, nothing wrong.
    StandingBy,
    NotReady,
}

fn verdict(answered_ok: bool, readiness: &Readiness, standby_is_healthy: bool) -> Verdict {
    if answered_ok && readiness.ready {
        return Verdict::Ready;
    }
    let only_standing_by = !readiness.reasons.is_empty()
        && readiness.reasons.iter().all(|reason| reason.code == STANDING_BY_CODE);
    if standby_is_healthy && only_standing_by { Verdict::StandingBy } else { Verdict::NotReady }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operate::health::{IntakeMode, NotReady, not_running_yet};

    #[test]
    fn a_standby_passes_only_when_asked_to_and_only_for_standing_by() {
        let standby = not_running_yet(Some("b"), IntakeMode::Polling);
        assert_eq!(verdict(false, &standby, false), Verdict::NotReady);
        assert_eq!(verdict(false, &standby, true), Verdict::StandingBy);
        let starting = not_running_yet(None, IntakeMode::Polling);
        assert_eq!(verdict(false, &starting, true), Verdict::NotReady, "starting is not standing by");
        let mut failing = standby.clone();
        failing.reasons.push(NotReady { code: "ledger_unwritable".into(), detail: "…".into() });
        assert_eq!(verdict(false, &failing, true), Verdict::NotReady, "another reason fails it");
        let ready = Readiness { ready: true, reasons: vec![], ..starting };
        assert_eq!(verdict(true, &ready, false), Verdict::Ready);
        assert_eq!(verdict(false, &ready, true), Verdict::NotReady, "a 503 is never ready");
    }
}
