//! The plugin's half of the permission relay (DESIGN.md §15).
//!
//! A plugin whose agent has `[agents.NAME.permissions]` declares the experimental
//! capability `claude/channel/permission`. Claude Code then sends it each tool-use
//! approval it would ask at the terminal as `notifications/claude/channel/permission_request`
//! (`request_id`, `tool_name`, `description`, `input_preview`); the plugin relays it to the
//! daemon (`POST permissions`). A verdict comes back on the session stream and is handed to
//! Claude Code as `notifications/claude/channel/permission` (`request_id`, `behavior`). The
//! terminal keeps asking meanwhile, and whichever answers first wins there.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::CustomNotification;
use serde_json::{Value, json};

use crate::agents::api::client::{ClientError, DaemonClient};
use crate::agents::api::wire::{DeliveredVerdict, ErrorCode, PermissionRequest};
use crate::agents::recent::RecentIds;
use crate::backoff::Backoff;

/// The experimental capability that tells Claude Code this channel relays approvals.
pub const PERMISSION_CAPABILITY: &str = "claude/channel/permission";

/// What Claude Code sends when a tool call needs approval.
pub const PERMISSION_REQUEST_METHOD: &str = "notifications/claude/channel/permission_request";

/// What the plugin sends back with a verdict.
pub const PERMISSION_VERDICT_METHOD: &str = "notifications/claude/channel/permission";

/// How long a request waits for the daemon to be reachable and to take it before the
/// plugin gives up on relaying it (the terminal still asks).
const RELAY_DEADLINE: Duration = Duration::from_secs(60);

/// Pause after the first try that failed, doubling with each further one up to the cap:
/// a daemon that fails at once (its ledger broken) is asked a dozen times in the deadline,
/// not a hundred, while one that was only busy for a moment is asked again soon.
const RELAY_RETRY_DELAY: Duration = Duration::from_millis(500);
const RELAY_RETRY_CAP: Duration = Duration::from_secs(5);

/// The request in a `permission_request` notification's params.
pub(super) fn read_request(params: Option<&Value>) -> Result<PermissionRequest, String> {
    let params = params.ok_or("no params")?;
    serde_json::from_value::<PermissionRequest>(params.clone()).map_err(|e| format!("unreadable params: {e}"))
}

/// The notification that hands a verdict to Claude Code.
pub(super) fn verdict_notification(verdict: &DeliveredVerdict) -> CustomNotification {
    let params = json!({ "request_id": verdict.request_id, "behavior": verdict.behavior });
    CustomNotification::new(PERMISSION_VERDICT_METHOD, Some(params))
}

/// How many handed verdicts a plugin remembers: far more than a session has waiting at
/// once, since the daemon writes again only what it has no confirmation of.
const REMEMBERED_VERDICTS: usize = 1024;

/// The verdicts this plugin process handed to Claude Code, the newest
/// [`REMEMBERED_VERDICTS`] of them.
#[derive(Clone, Default)]
pub(super) struct HandedVerdicts(Arc<Mutex<RecentIds<REMEMBERED_VERDICTS>>>);

impl HandedVerdicts {
    /// Whether `verdict` is to be handed to Claude Code: the first time it comes, not when
    /// the daemon writes it again because its confirmation did not reach it.
    pub(super) fn hand_over(&self, verdict: &DeliveredVerdict) -> bool {
        let mut handed = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        handed.insert(verdict_key(verdict))
    }
}

/// A verdict's identity: its request as the switchboard names it (a daemon before these
/// confirmations named only Claude Code's id).
fn verdict_key(verdict: &DeliveredVerdict) -> &str {
    if verdict.permission_id.is_empty() { &verdict.request_id } else { &verdict.permission_id }
}

/// Tells the daemon, off the stream's path, that the verdict was handed to Claude Code. A
/// confirmation that does not arrive costs only the verdict written again on the next
/// stream, which [`HandedVerdicts`] then confirms without handing it twice.
pub(super) fn confirm_handed(daemon: DaemonClient, verdict: DeliveredVerdict) {
    if verdict.permission_id.is_empty() {
        return;
    }
    tokio::spawn(async move {
        if let Err(error) = daemon.verdict_handed(&verdict.permission_id).await {
            tracing::debug!(permission_id = %verdict.permission_id, %error, "could not confirm a handed verdict; the daemon writes it again on the next stream");
        }
    });
}

/// Relays one request to the daemon. Asking again after a broken connection is safe: the
/// daemon records a plugin's request once and posts its prompt once.
pub(super) async fn relay(daemon: DaemonClient, request: PermissionRequest) {
    let deadline = tokio::time::Instant::now() + RELAY_DEADLINE;
    let mut pauses = Backoff::new(RELAY_RETRY_DELAY, RELAY_RETRY_CAP);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            tracing::error!(request_id = %request.request_id, "the daemon could not be reached, or kept failing, for {RELAY_DEADLINE:?}: this permission request is not relayed; it is answered at the terminal");
            return;
        }
        daemon.wait_for_session(left).await;
        match daemon.ask_permission(&request).await {
            Ok(receipt) if receipt.prompt == "not_sent" => {
                tracing::error!(
                    request_id = %request.request_id, permission_id = %receipt.permission_id,
                    "the daemon could not post the permission prompt ({}); answer it at the terminal",
                    receipt.detail.as_deref().unwrap_or("no detail")
                );
                return;
            }
            Ok(receipt) => {
                tracing::info!(request_id = %request.request_id, permission_id = %receipt.permission_id, prompt = %receipt.prompt, state = %receipt.state, "permission request relayed");
                return;
            }
            Err(error) if worth_asking_again(&error) => {
                tracing::warn!(request_id = %request.request_id, "relaying a permission request failed ({error}); trying again");
            }
            Err(error) => {
                tracing::warn!(request_id = %request.request_id, "the daemon refused the permission request: {error}");
                return;
            }
        }
        tokio::time::sleep(pauses.next_delay().min(left)).await;
    }
}

/// Whether asking again may relay a request that failed with `error`: the daemon was not
/// reached or did not answer, this session was not (yet) its live one, or it failed on
/// its side (its ledger busy, say), which it says by a 5xx. Asking again is safe: the
/// daemon records a plugin's request once. A refusal of the request itself (an agent
/// whose approvals are not relayed, a request it cannot read) would only come again.
fn worth_asking_again(error: &ClientError) -> bool {
    match error {
        ClientError::Refused { status, error } => {
            matches!(error.code, ErrorCode::SessionConflict | ErrorCode::Internal) || status.is_server_error()
        }
        ClientError::Unreachable { .. } | ClientError::NoAnswer { .. } | ClientError::Protocol { .. } => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::api::wire::ApiError;

    #[test]
    fn a_verdict_written_again_is_handed_over_once() {
        let handed = HandedVerdicts::default();
        let verdict = |id: &str| DeliveredVerdict {
            permission_id: id.into(),
            request_id: "abcde".into(),
            behavior: "allow".into(),
        };
        assert!(handed.hand_over(&verdict("prm_1")));
        assert!(!handed.hand_over(&verdict("prm_1")), "written again, before its confirmation arrived");
        assert!(handed.hand_over(&verdict("prm_2")), "another request, even with Claude Code's id reused");
        for n in 0..REMEMBERED_VERDICTS {
            assert!(handed.hand_over(&verdict(&format!("prm_x{n}"))));
        }
        assert!(handed.hand_over(&verdict("prm_1")), "the oldest is forgotten: the memory stays bounded");
    }

    #[test]
    fn a_request_reads_claude_codes_params() {
        let params = json!({"request_id": "abcde", "tool_name": "Bash", "description": "run ls", "input_preview": "{}"});
        let request = read_request(Some(&params)).unwrap();
        assert_eq!((request.request_id.as_str(), request.tool_name.as_str()), ("abcde", "Bash"));
        assert!(read_request(None).is_err());
        assert!(read_request(Some(&json!({"request_id": "abcde"}))).is_err());
    }

    #[test]
    fn a_daemon_that_failed_or_was_not_reached_is_asked_again_and_a_refusal_is_not() {
        use reqwest::StatusCode;
        let refused = |status, code| ClientError::Refused { status, error: ApiError::new(code, "no") };
        let address = || "127.0.0.1:1".to_owned();
        let detail = || "connection refused".to_owned();
        assert!(worth_asking_again(&ClientError::Unreachable { address: address(), detail: detail() }));
        assert!(worth_asking_again(&ClientError::NoAnswer { address: address(), detail: detail() }));
        // The daemon's ledger was busy: it answers 500 and says to try again in a moment.
        assert!(worth_asking_again(&refused(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal)));
        assert!(worth_asking_again(&refused(StatusCode::BAD_GATEWAY, ErrorCode::NotSent)));
        assert!(worth_asking_again(&refused(StatusCode::CONFLICT, ErrorCode::SessionConflict)));
        // Not relayed for this agent, or not a request it can read: the same again.
        assert!(!worth_asking_again(&refused(StatusCode::BAD_REQUEST, ErrorCode::BadRequest)));
        assert!(!worth_asking_again(&refused(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized)));
    }

    #[test]
    fn a_verdict_is_the_request_id_and_the_behavior() {
        let verdict = DeliveredVerdict {
            permission_id: "prm_1".into(),
            request_id: "abcde".into(),
            behavior: "deny".into(),
        };
        let notification = verdict_notification(&verdict);
        assert_eq!(notification.method, PERMISSION_VERDICT_METHOD);
        assert_eq!(notification.params, Some(json!({"request_id": "abcde", "behavior": "deny"})));
    }
}
