-- Webhook deliveries a standby took (DESIGN.md §16, issue 24). Every replica listens on
-- `telegram.webhook.listen`, behind the user's load balancer; only the leader takes an
-- update in (sessions, rooms, permissions and sends are all the leader's). A standby
-- commits the update here before it answers Telegram's request 200, and NOTIFYs
-- `switchboard_relayed_updates`; the leader takes each one in through the same intake as
-- its own deliveries (deduplicated on the update's id and digest there), then deletes it.
-- A repeated delivery to a standby is one row.

CREATE TABLE relayed_updates (
    bot_id      BIGINT      NOT NULL,
    update_id   BIGINT      NOT NULL,
    raw         TEXT        NOT NULL,                    -- the update's JSON, as Telegram sent it
    relayed_by  TEXT        NOT NULL,                    -- the replica that took the delivery
    relayed_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (bot_id, update_id)
);
