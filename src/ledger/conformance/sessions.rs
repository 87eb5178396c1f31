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
        ledger.session_opened(session, &orch, None, 0).await.unwrap();
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

/// Each agent's newest session names the plugin a starting daemon keeps the agent for; an
/// agent whose newest session named none is kept for nobody.
pub(crate) async fn the_newest_session_of_each_agent_names_its_plugin<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let orch = AgentName::parse("orch").unwrap();
    let worker = AgentName::parse("worker").unwrap();
    let helper = AgentName::parse("helper").unwrap();
    assert!(ledger.last_session_plugins().await.unwrap().is_empty());
    ledger.session_opened("ses_1", &orch, Some("plg_old"), 0).await.unwrap();
    ledger.session_closed("ses_1").await.unwrap();
    ledger.session_opened("ses_2", &worker, Some("plg_w"), 0).await.unwrap();
    ledger.session_opened("ses_3", &helper, Some("plg_h"), 0).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    ledger.session_opened("ses_4", &orch, Some("plg_new"), 1).await.unwrap();
    ledger.session_opened("ses_5", &helper, None, 0).await.unwrap();
    let mut last = ledger.last_session_plugins().await.unwrap();
    last.sort();
    assert_eq!(last, [("orch".to_owned(), "plg_new".to_owned()), ("worker".to_owned(), "plg_w".to_owned())]);
    // A plugin that said it is leaving is kept for by nobody.
    ledger.session_left("ses_2").await.unwrap();
    ledger.session_left("ses_nonesuch").await.unwrap();
    assert_eq!(ledger.last_session_plugins().await.unwrap(), [("orch".to_owned(), "plg_new".to_owned())]);
}
