//! `call_agent` calls waiting for their answer. The answer reaches the plugin like any
//! envelope, on the session stream; the forwarder hands a `handoff_answer` to the call that
//! waits for it instead of pushing it as a notification. Should nobody wait for it any more
//! (the call timed out or was cancelled at that very moment), it is pushed as usual: an
//! answer is never dropped. A change to the task (the user's correction, `/new`, `/cancel`)
//! that retires the handoff ends the wait too: no answer will be delivered, and the agent
//! must act on the change, which the call hands it as its result.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{Mutex, MutexGuard, oneshot};

use crate::agents::api::wire::DeliveredEnvelope;

/// Keyed by handoff id.
type Waiters = HashMap<String, oneshot::Sender<DeliveredEnvelope>>;

#[derive(Clone, Default)]
pub(super) struct WaitingCalls {
    waiters: Arc<Mutex<Waiters>>,
}

/// Held while a call hands its instruction over, so an answer that comes back at once
/// cannot be routed before the call is registered to receive it.
pub(super) struct Registration<'a> {
    waiters: MutexGuard<'a, Waiters>,
}

impl Registration<'_> {
    pub(super) fn register(mut self, handoff_id: &str) -> oneshot::Receiver<DeliveredEnvelope> {
        let (tx, rx) = oneshot::channel();
        self.waiters.insert(handoff_id.to_owned(), tx);
        rx
    }
}

impl WaitingCalls {
    pub(super) async fn begin(&self) -> Registration<'_> {
        Registration { waiters: self.waiters.lock().await }
    }

    /// Hands an answer to the call waiting for it; gives it back when none does.
    pub(super) async fn deliver(&self, envelope: DeliveredEnvelope) -> Option<DeliveredEnvelope> {
        let Some(handoff_id) = envelope.extra.get("handoff_id") else { return Some(envelope) };
        let waiter = self.waiters.lock().await.remove(handoff_id);
        match waiter {
            Some(waiter) => waiter.send(envelope).err(),
            None => Some(envelope),
        }
    }

    /// The calls waiting on the handoffs a change of their task retired (a revision
    /// envelope's `superseded_handoffs`) stop waiting: each gets that envelope instead of
    /// an answer. The envelope itself is still pushed, as the change the agent acts on.
    pub(super) async fn retire(&self, change: &DeliveredEnvelope) {
        let Some(retired) = change.extra.get("superseded_handoffs") else { return };
        let mut waiters = self.waiters.lock().await;
        for handoff_id in retired.split(',').map(str::trim).filter(|id| !id.is_empty()) {
            if let Some(waiter) = waiters.remove(handoff_id) {
                // A call that gave up at this moment needs nothing: the change is pushed.
                let _ = waiter.send(change.clone());
            }
        }
    }

    /// The call stops waiting. True when it was still registered (no answer is on its way
    /// to it); false when the answer was already handed over and must be taken.
    pub(super) async fn give_up(&self, handoff_id: &str) -> bool {
        self.waiters.lock().await.remove(handoff_id).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(handoff_id: &str) -> DeliveredEnvelope {
        DeliveredEnvelope {
            trace_id: "env_aaaaaaaaaa".into(),
            kind: "handoff_answer".into(),
            extra: [("handoff_id".to_owned(), handoff_id.to_owned())].into(),
            content: "done".into(),
            chat_id: 0,
            thread_id: None,
            chat_type: String::new(),
            chat_title: None,
            message_id: 0,
            user: String::new(),
            user_id: 0,
            ts: String::new(),
            route: String::new(),
            redelivered: false,
            edited: false,
        }
    }

    #[tokio::test]
    async fn an_answer_goes_to_its_waiting_call_and_only_to_it() {
        let calls = WaitingCalls::default();
        let rx = calls.begin().await.register("hof_a");
        assert!(calls.deliver(answer("hof_b")).await.is_some(), "nobody waits for hof_b");
        assert!(calls.deliver(answer("hof_a")).await.is_none());
        assert_eq!(rx.await.unwrap().content, "done");
        // Once taken, a second copy (a redelivery) is pushed as usual.
        assert!(calls.deliver(answer("hof_a")).await.is_some());
    }

    #[tokio::test]
    async fn a_change_that_retires_handoffs_ends_the_calls_waiting_on_them() {
        let calls = WaitingCalls::default();
        let a = calls.begin().await.register("hof_a");
        let b = calls.begin().await.register("hof_b");
        let c = calls.begin().await.register("hof_c");
        let mut change = answer("hof_x");
        change.kind = "revision".into();
        change.extra = [("superseded_handoffs".to_owned(), "hof_a, hof_c".to_owned())].into();
        calls.retire(&change).await;
        assert_eq!(a.await.unwrap().kind, "revision");
        assert_eq!(c.await.unwrap().kind, "revision");
        // hof_b still stands: its answer reaches its call.
        assert!(calls.deliver(answer("hof_b")).await.is_none());
        assert_eq!(b.await.unwrap().kind, "handoff_answer");
    }

    #[tokio::test]
    async fn a_call_that_gave_up_lets_the_answer_through() {
        let calls = WaitingCalls::default();
        let rx = calls.begin().await.register("hof_a");
        assert!(calls.give_up("hof_a").await);
        drop(rx);
        assert!(calls.deliver(answer("hof_a")).await.is_some());
    }

    #[tokio::test]
    async fn an_answer_handed_over_as_the_call_gives_up_is_still_taken() {
        let calls = WaitingCalls::default();
        let rx = calls.begin().await.register("hof_a");
        assert!(calls.deliver(answer("hof_a")).await.is_none());
        assert!(!calls.give_up("hof_a").await, "already handed over");
        assert_eq!(rx.await.unwrap().content, "done");
    }

    #[tokio::test]
    async fn an_answer_whose_call_is_gone_is_given_back() {
        let calls = WaitingCalls::default();
        drop(calls.begin().await.register("hof_a"));
        assert!(calls.deliver(answer("hof_a")).await.is_some());
    }
}
