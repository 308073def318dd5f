-- Concurrency leases; see the PostgreSQL migration of the same name.
CREATE TABLE IF NOT EXISTS swin_leases (
    namespace  TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    lease      TEXT    NOT NULL,
    count      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, key, lease)
);

CREATE INDEX IF NOT EXISTS swin_leases_expiry ON swin_leases (expires_at);
