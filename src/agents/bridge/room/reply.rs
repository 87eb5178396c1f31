//! A speaker's `reply` to its `room_turn` envelope (DESIGN.md §10): one reply per turn,
//! posted to the room as `<display name>: <text>` (in the reply's `format`), threaded to the human message that
//! started the exchange, through the ordinary reply path (attempts, unknown outcomes,
//! resumed cut-off replies and all).
//!
//! The reply is claimed on its turn before anything is sent, so a second reply is refused
//! even while the first is on its way. The turn ends when the post is confirmed (or its
//! outcome is unknown): the room driver sees the envelope leave `pending` and gives the
//! floor to the next speaker. A post Telegram provably refused gives the claim back, so the
//! speaker may reply again within its time, unless part of it was posted: then the claim
//! stands and takes only the same words again, which resume the reply (the room driver lets
//! what was posted stand once the turn's time runs out).

use futures::FutureExt;

use crate::agents::api::wire::RoomReply;
use crate::agents::bridge::reply::ReplyContent;
use crate::agents::bridge::{Bridge, RunningReply, ToolError};
use crate::ids::{AgentName, RequestId, RouteName};
use crate::ledger::{ClaimRefused, EnvelopeState, StoredEnvelope, TurnEnding};
use crate::rules::turns::TurnError;
use crate::telegram::format::ReplyFormat;
use crate::telegram::outbound::TELEGRAM_TEXT_LIMIT;

impl Bridge {
    /// Claims the turn's one reply and starts posting it; the caller awaits the result.
    /// Called under the agent's decision lock, so the room driver (which takes it before
    /// giving a dead claim back) never sees a claim whose delivery has not started yet.
    pub(in crate::agents::bridge) async fn room_reply(
        &self,
        agent: &AgentName,
        envelope: &StoredEnvelope,
        text: &str,
        format: ReplyFormat,
        request_id: RequestId,
    ) -> Result<RunningReply, ToolError> {
        let ledger = &self.inner.ledger;
        let text = text.trim();
        let Some((turn, cascade)) = ledger.turn_of_envelope(envelope.id).await? else {
            return Err(ToolError::Invalid(format!(
                "{} is a room turn the switchboard has no record of; nothing was posted. Ack it.",
                envelope.trace_id
            )));
        };
        let posted_as = RouteName::parse(&cascade.route)
            .ok()
            .and_then(|route| self.rooms().get(&route).map(|room| room.roster.label(agent).to_owned()))
            .unwrap_or_else(|| agent.to_string());
        // Posted under the speaker's name, in the format it wrote.
        let (parts, html) = format.parts_after(&format!("{posted_as}: "), text, TELEGRAM_TEXT_LIMIT);
        let max = self.limits().max_reply_parts;
        if parts.len() > max {
            tracing::warn!(%agent, parts = parts.len(), max, "room reply refused: too long");
            return Err(ToolError::TooLong { parts: parts.len(), max });
        }
        let speaker = turn.speaker();
        // Planned (a read) before the claim, so that nothing is awaited between the claim
        // and the delivery that settles it: a failed read or a caller gone before the claim
        // leaves the turn free, and once the claim is made its delivery has started.
        let plan = self
            .plan(
                agent,
                envelope.clone(),
                None,
                request_id.clone(),
                ReplyContent { parts, html, files: Vec::new() },
            )
            .await?;
        let claimed = ledger.claim_room_reply(envelope.id, text, request_id.as_str()).await?;
        if let Err(refused) = claimed {
            tracing::warn!(%agent, trace_id = %envelope.trace_id, speaker, ?refused, "room reply refused: one reply per turn");
            return Err(turn_over(&envelope.trace_id, speaker, refused));
        }
        tracing::info!(%agent, cascade_id = %cascade.cascade_id, speaker, "room reply claimed its turn; posting");
        let running = self.start_delivery(agent, plan);

        // A refused post gives the turn back before the speaker hears of it, so its next
        // call (another reply, an ack) finds the turn as it is; the driver hears of every
        // outcome. Driven by a task of its own, so it happens however the caller fares.
        let bridge = self.clone();
        let turn_id = turn.id;
        let room = RoomReply { cascade_id: cascade.cascade_id.to_string(), speaker, posted_as };
        let observed: RunningReply = async move {
            let outcome = running.await;
            if let Err(ToolError::NotSent { .. }) = &outcome {
                match bridge.inner.ledger.release_room_reply(turn_id).await {
                    Ok(true) => tracing::info!(speaker, "room reply not posted: the speaker may reply again"),
                    Ok(false) => {}
                    // The driver gives a dead claim back by itself.
                    Err(e) => tracing::error!(error = %e, "could not give a room turn its reply back"),
                }
            }
            bridge.wake_rooms();
            outcome.map(|mut receipt| {
                receipt.room_turn = Some(room);
                receipt
            })
        }
        .boxed()
        .shared();
        self.inner.tasks.spawn(observed.clone());
        Ok(observed)
    }
}

/// What the speaker is told when its turn can take no reply.
fn turn_over(trace_id: &str, speaker: u32, refused: ClaimRefused) -> ToolError {
    let ended = match refused {
        ClaimRefused::NoTurn => {
            return ToolError::Invalid(format!("{trace_id} gives no room turn; nothing was posted"));
        }
        ClaimRefused::Ended(TurnEnding::Replied) | ClaimRefused::AlreadyReplied { .. } => "replied",
        ClaimRefused::Ended(TurnEnding::Passed) | ClaimRefused::NotPending(EnvelopeState::Acked) => "passed",
        ClaimRefused::Ended(TurnEnding::TimedOut) => "timed out",
        ClaimRefused::NotPending(state) => {
            return ToolError::TurnOver(format!(
                "{trace_id} is {state}: this room turn cannot take a reply now; nothing was posted"
            ));
        }
    };
    ToolError::TurnOver(TurnError::AlreadyEnded { speaker, ended }.to_string())
}
