//! Operating the daemon (DESIGN.md §12): readiness, Prometheus metrics and configuration
//! reload on SIGHUP. The HTTP routes that expose health and metrics live with the rest of
//! the local API (`agents::api::server`); the demo is `crate::demo`.

pub mod health;
pub mod health_listener;
pub mod healthcheck;
pub mod metrics;
pub mod reload;
