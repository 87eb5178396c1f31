//! Agent sessions, kept for the audit trail (DESIGN §17 prunes them).

use chrono::{Duration, Utc};

use crate::ids::AgentName;
use crate::ledger::conformance::Backend;

/// A session is recorded when it opens and ends when it closes; retention removes only a
/// closed one, and never the newest.
pub(crate) async fn only_a_closed_session_that_is_not_the_newest_is_pruned<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let orch = AgentName::parse("orch").unwrap();
    for session in ["ses_1", "ses_2", "ses_3"] {
        ledger.session_opened(session, &orch, 0).await.unwrap();
    }
    let after_all = || Utc::now() + Duration::seconds(1);
    assert_eq!(ledger.prune(after_all(), true).await.unwrap().removed.agent_sessions, 0, "all open");

    ledger.session_closed("ses_1").await.unwrap();
    ledger.session_closed("ses_3").await.unwrap();
    // Closing again, or closing a session never opened, is harmless.
    ledger.session_closed("ses_1").await.unwrap();
    ledger.session_closed("ses_nonesuch").await.unwrap();
    assert_eq!(
        ledger.prune(Utc::now() - Duration::hours(1), false).await.unwrap().removed.agent_sessions,
        0,
        "closed after the cut-off"
    );
    assert_eq!(ledger.prune(after_all(), true).await.unwrap().removed.agent_sessions, 1);
    assert_eq!(ledger.prune(after_all(), false).await.unwrap().removed.agent_sessions, 1, "ses_1 alone");
    assert_eq!(ledger.prune(after_all(), false).await.unwrap().removed.agent_sessions, 0);
}
