-- Limits set at run time per key; see the PostgreSQL migration of the same name.
CREATE TABLE IF NOT EXISTS swin_key_limits (
    namespace  TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    limits     TEXT    NOT NULL, -- JSON
    expires_at INTEGER,          -- Unix milliseconds; NULL: never
    set_by     TEXT    NOT NULL,
    set_at     INTEGER NOT NULL, -- Unix milliseconds
    PRIMARY KEY (namespace, key)
);

CREATE INDEX IF NOT EXISTS swin_key_limits_expiry ON swin_key_limits (expires_at)
    WHERE expires_at IS NOT NULL;

CREATE TABLE IF NOT EXISTS swin_key_limit_log (
    namespace  TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    key        TEXT    NOT NULL,
    changed_at INTEGER NOT NULL, -- Unix milliseconds
    PRIMARY KEY (namespace, version)
);

CREATE INDEX IF NOT EXISTS swin_key_limit_log_age ON swin_key_limit_log (changed_at);

CREATE TABLE IF NOT EXISTS swin_key_limit_versions (
    namespace      TEXT    PRIMARY KEY,
    version        INTEGER NOT NULL,
    purged_through INTEGER NOT NULL DEFAULT 0
);
