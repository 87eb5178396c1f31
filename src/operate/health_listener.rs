//! `api.health_listen`: the operator's routes (`/healthz`, `/readyz`, `/metrics`) on an
//! address of this process's own, bound before the ledger is taken and answered for the
//! process's whole life, whatever its role.
//!
//! The local API binds only once the daemon runs, and a standby replica never binds it (the
//! leader's address is the one plugins reach). A supervisor that probes every replica
//! (Kubernetes' liveness and readiness probes, a load balancer's health check) needs an
//! answer from each: here a standby is alive (`/healthz` 200) and not ready (`/readyz` 503,
//! `standing_by`), and once elected, the same address and the same connection answer as
//! the local API's operator routes do.

use std::net::SocketAddr;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::agents::api::server::{self, Operations};
use crate::operate::health::{self, IntakeMode};
use crate::operate::metrics::{READY, STANDING_BY};

/// Logged once the address is bound, with it as `health`: see
/// [`crate::app::reported_health_address`].
pub const HEALTH_LISTENING_MESSAGE: &str = "health routes listening";

/// What the routes answer for.
#[derive(Clone)]
enum Role {
    /// Not running the daemon yet: standing by (a replica's name) or starting.
    Waiting { replica: Option<String>, intake: IntakeMode },
    /// Running it: the local API's operator routes.
    Serving(Operations),
}

/// The bound address, answering until the process's shutdown.
pub struct HealthListener {
    local_addr: SocketAddr,
    role: watch::Sender<Role>,
}

impl HealthListener {
    /// Binds `address` and answers there until `shutdown`. `replica` names this process on
    /// PostgreSQL, where it stands by until elected.
    pub async fn bind(
        address: SocketAddr,
        replica: Option<String>,
        intake: IntakeMode,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Self> {
        let tcp = TcpListener::bind(address)
            .await
            .with_context(|| format!("binding the health routes to {address} (api.health_listen)"))?;
        let local_addr = tcp.local_addr()?;
        let (role, watched) = watch::channel(Role::Waiting { replica, intake });
        let router = Router::new()
            .route("/healthz", get(server::healthz))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics_text))
            .with_state(watched);
        tokio::spawn(crate::serve::serve(tcp, router, crate::serve::Connections::Bounded, shutdown));
        tracing::info!(health = %local_addr, "{HEALTH_LISTENING_MESSAGE}");
        Ok(Self { local_addr, role })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The daemon runs: from now on the routes answer as the local API's do.
    pub fn serve(&self, operations: Operations) {
        self.role.send_replace(Role::Serving(operations));
    }
}

async fn readyz(State(role): State<watch::Receiver<Role>>) -> Response {
    let role = role.borrow().clone();
    match role {
        Role::Waiting { replica, intake } => {
            server::readiness_answer(health::not_running_yet(replica.as_deref(), intake))
        }
        Role::Serving(operations) => server::readyz(operations).await,
    }
}

async fn metrics_text(State(role): State<watch::Receiver<Role>>) -> Response {
    let role = role.borrow().clone();
    match role {
        Role::Waiting { replica, .. } => {
            let text = waiting_metrics(replica.as_deref());
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
        }
        Role::Serving(operations) => server::metrics_text(operations).await,
    }
}

/// What a process that does not run the daemon yet has to say to Prometheus: that it is not
/// ready, and whether it stands by. (The daemon's recorder is installed once it runs, with
/// everything it counts.)
fn waiting_metrics(replica: Option<&str>) -> String {
    let labels = match replica {
        Some(name) => format!("{{replica=\"{}\"}}", name.replace('\\', "\\\\").replace('"', "\\\"")),
        None => String::new(),
    };
    let mut text = format!(
        "# HELP {READY} 1 when /readyz answers 200, else 0.\n# TYPE {READY} gauge\n{READY}{labels} 0\n"
    );
    if replica.is_some() {
        text.push_str(&format!(
            "# HELP {STANDING_BY} 1 while this replica stands by, 0 once it leads.\n\
             # TYPE {STANDING_BY} gauge\n{STANDING_BY}{labels} 1\n"
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_says_it_is_not_ready_and_stands_by_under_its_name() {
        let text = waiting_metrics(Some("second"));
        let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
        let value = |name: &str| {
            let sample = parsed.samples.iter().find(|s| s.metric == name).expect(name);
            assert_eq!(sample.labels.get("replica"), Some("second"), "{text}");
            match sample.value {
                prometheus_parse::Value::Gauge(value) => value,
                ref other => panic!("{name} is a gauge: {other:?}"),
            }
        };
        assert_eq!(value("switchboard_ready"), 0.0);
        assert_eq!(value("switchboard_standing_by"), 1.0);
        let quoted = waiting_metrics(Some("b\"2"));
        assert!(quoted.contains(r#"switchboard_ready{replica="b\"2"} 0"#), "a quote is escaped: {quoted}");
    }

    #[test]
    fn a_daemon_still_starting_is_not_ready_and_stands_by_for_nobody() {
        let text = waiting_metrics(None);
        assert!(text.contains("switchboard_ready 0"), "{text}");
        assert!(!text.contains("standing_by"), "{text}");
    }
}
