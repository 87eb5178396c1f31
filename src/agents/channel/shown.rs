//! Confirmations that envelopes were shown to the agent. An unnamed reply resolves only
//! among envelopes the session confirmed, so a confirmation must reach the daemon before
//! any tool call the agent makes after seeing the envelope. Rather than wait for each
//! confirmation before pushing its notification (a round trip on every inbound message),
//! the forwarder sends it alongside the push and every tool call first waits for the
//! confirmations still on their way: the agent cannot call a tool about a notification
//! before the notification was pushed, and by then its confirmation was started.

use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;

#[derive(Clone, Default)]
pub(super) struct Confirmations {
    in_flight: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Confirmations {
    /// Starts a confirmation; it runs on its own.
    pub(super) fn start(&self, confirmation: impl Future<Output = ()> + Send + 'static) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        in_flight.retain(|handle| !handle.is_finished());
        in_flight.push(tokio::spawn(confirmation));
    }

    /// Waits until every confirmation started so far has landed (or failed).
    pub(super) async fn settled(&self) {
        let started = std::mem::take(&mut *self.in_flight.lock().unwrap_or_else(|p| p.into_inner()));
        for handle in started {
            let _ = handle.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn settled_waits_for_every_confirmation_started_before_it() {
        let confirmations = Confirmations::default();
        let landed = Arc::new(AtomicUsize::new(0));
        for delay in [30, 10, 20] {
            let landed = Arc::clone(&landed);
            confirmations.start(async move {
                tokio::time::sleep(Duration::from_millis(delay)).await;
                landed.fetch_add(1, Ordering::SeqCst);
            });
        }
        confirmations.settled().await;
        assert_eq!(landed.load(Ordering::SeqCst), 3);
        // Nothing in flight: returns at once.
        tokio::time::timeout(Duration::from_millis(50), confirmations.settled()).await.unwrap();
    }
}
