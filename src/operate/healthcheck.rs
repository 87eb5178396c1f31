//! `switchboard healthcheck`: asks a running daemon's `GET /readyz` and exits 0 only when it
//! is ready. The runtime image has no curl, and the binary is already there; a container's
//! `HEALTHCHECK` runs it with the daemon's own configuration and environment.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use anyhow::Context;

use crate::operate::health::Readiness;

/// A readiness check answers in well under a second (one small ledger write); beyond this
/// the daemon counts as not ready.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The address to ask for a daemon listening on `listen`: an unspecified address (0.0.0.0,
/// `[::]`) listens on loopback too, and loopback is where the check runs.
pub fn address_to_ask(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), listen.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), listen.port()),
        _ => listen,
    }
}

/// Asks `/readyz` at `address`: Ok when ready (its answer printed), an error naming every
/// reason when not.
pub async fn check(address: SocketAddr) -> anyhow::Result<()> {
    let client = reqwest::Client::builder().no_proxy().timeout(TIMEOUT).build()?;
    let url = format!("http://{address}/readyz");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unspecified_listen_address_is_asked_on_loopback() {
        let ask = |listen: &str| address_to_ask(listen.parse().unwrap()).to_string();
        assert_eq!(ask("0.0.0.0:7797"), "127.0.0.1:7797");
        assert_eq!(ask("[::]:7797"), "[::1]:7797");
        assert_eq!(ask("127.0.0.1:7797"), "127.0.0.1:7797");
        assert_eq!(ask("10.0.0.5:80"), "10.0.0.5:80");
    }
}
