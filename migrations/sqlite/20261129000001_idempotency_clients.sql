-- Each client's share of a namespace's idempotency records; see the PostgreSQL migration
-- of the same name.
ALTER TABLE swin_idempotency ADD COLUMN client TEXT NOT NULL DEFAULT '';

CREATE TABLE IF NOT EXISTS swin_idempotency_client_counts (
    namespace TEXT    NOT NULL,
    client    TEXT    NOT NULL,
    records   INTEGER NOT NULL,
    PRIMARY KEY (namespace, client)
);
