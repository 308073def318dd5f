-- What the proxies of Envoy's rate limit quota service ask for; see the PostgreSQL
-- migration of the same name.
CREATE TABLE IF NOT EXISTS swin_demands (
    namespace  TEXT    NOT NULL,
    bucket     TEXT    NOT NULL,
    node       TEXT    NOT NULL,
    demands    TEXT    NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, bucket, node)
);

CREATE INDEX IF NOT EXISTS swin_demands_expiry ON swin_demands (expires_at);
