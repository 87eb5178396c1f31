//! Webhook deliveries across replicas (PostgreSQL, DESIGN.md §16). Every replica listens
//! on `telegram.webhook.listen`, behind the user's load balancer, but only the leader takes
//! updates in: it holds the sessions, drives rooms and tasks, and sends. So a standby
//! commits each delivery for the leader ([`UpdateRelay`]) before it answers `200`, and the
//! leader takes the relayed updates in through its own intake ([`RelayedDeliveries`]), woken
//! by the commit's `NOTIFY` and, for any notification lost with a connection, by asking
//! every few seconds.

use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::ledger::{LedgerCongestion, LedgerError, PgLedger, RelayedUpdate};
use crate::telegram::intake::{Confirmation, UpdateIntake};
use crate::telegram::updates::RawUpdate;

/// How many relayed updates the leader takes in at once.
const BATCH: i64 = 100;

/// How often the leader asks for relayed updates without being told: a notification is
/// lost only with the connection that was to hear it.
const SWEEP: Duration = Duration::from_secs(5);

/// After a failed attempt to take relayed updates in (a busy ledger): the rows wait.
const RETRY: Duration = Duration::from_secs(1);

/// A standby's side: commits a webhook delivery for the leader.
#[derive(Clone)]
pub struct UpdateRelay {
    ledger: PgLedger,
    bot_id: i64,
    replica: String,
}

impl UpdateRelay {
    pub fn new(ledger: PgLedger, bot_id: i64, replica: String) -> Self {
        Self { ledger, bot_id, replica }
    }

    /// Commits `update` (one with an `update_id`) for the leader; true when it is new.
    pub async fn relay(&self, update: &RawUpdate, update_id: i64) -> Result<bool, LedgerError> {
        self.ledger.relay_update(self.bot_id, update_id, &update.text, &self.replica).await
    }
}

/// The leader's side: what standbys relayed, and the intake that takes it in.
pub struct RelayedDeliveries {
    pub ledger: PgLedger,
    pub bot_id: i64,
    pub intake: UpdateIntake,
}

impl RelayedDeliveries {
    /// Takes in what standbys relay, until `shutdown`. Fails (stopping the daemon) only
    /// when the ledger fails in a way that does not pass by itself.
    pub async fn take_in(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Self { ledger, bot_id, intake } = self;
        let mut told =
            ledger.listen_for_relayed().await.context("listening for relayed webhook deliveries")?;
        loop {
            match take_in_once(&ledger, bot_id, &intake).await {
                Ok(more) if more => continue,
                Ok(_) => {}
                Err(error) => match LedgerCongestion::of(&error) {
                    Some(congestion) => {
                        tracing::warn!(%error, "{congestion}: relayed webhook deliveries wait in the ledger");
                        tokio::select! {
                            () = tokio::time::sleep(RETRY) => continue,
                            () = shutdown.cancelled() => return Ok(()),
                        }
                    }
                    None => {
                        return Err(anyhow::Error::new(error).context("taking in relayed webhook deliveries"));
                    }
                },
            }
            tokio::select! {
                heard = told.recv() => {
                    if let Err(error) = heard {
                        // sqlx reconnects on the next `recv`; what came meanwhile is asked for.
                        tracing::debug!(%error, "the connection hearing relayed deliveries was lost");
                        tokio::time::sleep(RETRY).await;
                    }
                }
                () = tokio::time::sleep(SWEEP) => {}
                () = shutdown.cancelled() => return Ok(()),
            }
        }
    }
}

/// Takes one batch of relayed updates in, then forgets them; true when there may be more.
async fn take_in_once(ledger: &PgLedger, bot_id: i64, intake: &UpdateIntake) -> Result<bool, LedgerError> {
    let relayed = ledger.relayed_updates(bot_id, BATCH).await?;
    if relayed.is_empty() {
        return Ok(false);
    }
    let ids: Vec<i64> = relayed.iter().map(|relayed| relayed.update_id).collect();
    let updates = relayed.iter().map(|RelayedUpdate { raw, .. }| RawUpdate::new(raw)).collect();
    // A crash between the two leaves the rows: taken in again, they are stored already.
    let taken = intake.take(updates, Confirmation::Answer).await?;
    ledger.forget_relayed(bot_id, &ids).await?;
    tracing::debug!(
        relayed = ids.len(),
        new_envelopes = taken.new_envelopes,
        "took in webhook deliveries a standby relayed"
    );
    Ok(ids.len() as i64 == BATCH)
}
