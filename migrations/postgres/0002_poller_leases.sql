-- Polling leadership (DESIGN.md §16, issue 24): exactly one replica polls a bot token.
--
-- The leader holds a session-level advisory lock on a dedicated connection (its key is
-- derived from the schema and the bot, see `ledger/postgres/leadership.rs`) and this row,
-- renewed every lease/3. `term` grows by one at each election. Every offset commit and
-- intake write of the poller names its term and takes this row FOR SHARE in its
-- transaction, and an election UPDATEs it: an election waits for the fenced writes in
-- flight, and no write of an older term passes after it.
--
-- `holder_pid` is the backend of the leader's dedicated connection, for the operator;
-- `expires_at` is on the server's clock. A standby that finds the lease expired while the
-- lock is still held (a paused or hung leader) terminates that backend and takes the lock.

CREATE TABLE poller_leases (
    bot_id      BIGINT      PRIMARY KEY,
    term        BIGINT      NOT NULL CHECK (term > 0),
    holder      TEXT        NOT NULL,                    -- the replica's id
    holder_pid  INTEGER     NOT NULL,                    -- pg_backend_pid() of its dedicated connection
    elected_at  TIMESTAMPTZ NOT NULL,
    renewed_at  TIMESTAMPTZ NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL
);
