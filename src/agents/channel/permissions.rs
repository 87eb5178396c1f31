//! The plugin's half of the permission relay (DESIGN.md §15).
//!
//! A plugin whose agent has `[agents.NAME.permissions]` declares the experimental
//! capability `claude/channel/permission`. Claude Code then sends it each tool-use
//! approval it would ask at the terminal as `notifications/claude/channel/permission_request`
//! (`request_id`, `tool_name`, `description`, `input_preview`); the plugin relays it to the
//! daemon (`POST permissions`). A verdict comes back on the session stream and is handed to
//! Claude Code as `notifications/claude/channel/permission` (`request_id`, `behavior`). The
//! terminal keeps asking meanwhile, and whichever answers first wins there.

use std::time::Duration;

use rmcp::model::CustomNotification;
use serde_json::{Value, json};

use crate::agents::api::client::{ClientError, DaemonClient};
use crate::agents::api::wire::{DeliveredVerdict, PermissionRequest};

/// The experimental capability that tells Claude Code this channel relays approvals.
pub const PERMISSION_CAPABILITY: &str = "claude/channel/permission";

/// What Claude Code sends when a tool call needs approval.
pub const PERMISSION_REQUEST_METHOD: &str = "notifications/claude/channel/permission_request";

/// What the plugin sends back with a verdict.
pub const PERMISSION_VERDICT_METHOD: &str = "notifications/claude/channel/permission";

/// How long a request waits for the daemon to be reachable before the plugin gives up on
/// relaying it (the terminal still asks).
const RELAY_DEADLINE: Duration = Duration::from_secs(60);

/// Pause between two tries while the daemon is away.
const RELAY_RETRY_DELAY: Duration = Duration::from_millis(500);

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

/// Relays one request to the daemon. Asking again after a broken connection is safe: the
/// daemon records a plugin's request once and posts its prompt once.
pub(super) async fn relay(daemon: DaemonClient, request: PermissionRequest) {
    let deadline = tokio::time::Instant::now() + RELAY_DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            tracing::error!(request_id = %request.request_id, "the daemon could not be reached within {RELAY_DEADLINE:?}: this permission request is not relayed; it is answered at the terminal");
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
            Err(ClientError::Refused { error, .. })
                if error.code != crate::agents::api::wire::ErrorCode::SessionConflict =>
            {
                tracing::warn!(request_id = %request.request_id, "the daemon refused the permission request: {}", error.message);
                return;
            }
            Err(error) => {
                tracing::warn!(request_id = %request.request_id, "relaying a permission request failed ({error}); trying again");
            }
        }
        tokio::time::sleep(RELAY_RETRY_DELAY.min(left)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_claude_codes_params() {
        let params = json!({"request_id": "abcde", "tool_name": "Bash", "description": "run ls", "input_preview": "{}"});
        let request = read_request(Some(&params)).unwrap();
        assert_eq!((request.request_id.as_str(), request.tool_name.as_str()), ("abcde", "Bash"));
        assert!(read_request(None).is_err());
        assert!(read_request(Some(&json!({"request_id": "abcde"}))).is_err());
    }

    #[test]
    fn a_verdict_is_the_request_id_and_the_behavior() {
        let verdict = DeliveredVerdict { request_id: "abcde".into(), behavior: "deny".into() };
        let notification = verdict_notification(&verdict);
        assert_eq!(notification.method, PERMISSION_VERDICT_METHOD);
        assert_eq!(notification.params, Some(json!({"request_id": "abcde", "behavior": "deny"})));
    }
}
