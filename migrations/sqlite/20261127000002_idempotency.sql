-- Idempotency records; see the PostgreSQL migration of the same name.
CREATE TABLE IF NOT EXISTS swin_idempotency (
    namespace   TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    fingerprint BLOB    NOT NULL,
    token       INTEGER NOT NULL,
    held_until  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    answer      BLOB,
    PRIMARY KEY (namespace, key)
);

CREATE INDEX IF NOT EXISTS swin_idempotency_expiry ON swin_idempotency (expires_at);

CREATE TABLE IF NOT EXISTS swin_idempotency_counts (
    namespace TEXT    PRIMARY KEY,
    records   INTEGER NOT NULL
);
