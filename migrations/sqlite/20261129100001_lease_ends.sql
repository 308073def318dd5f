-- The end of each released lease; see the PostgreSQL migration of the same name.
CREATE TABLE IF NOT EXISTS swin_lease_ends (
    namespace  TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    lease      TEXT    NOT NULL,
    op         TEXT    NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, key, lease)
);

CREATE INDEX IF NOT EXISTS swin_lease_ends_expiry ON swin_lease_ends (expires_at);
