-- Limits set at run time per key (PUT /v1/namespaces/{ns}/keys/{key}/limits), one row
-- per key: the limits as the API took them (JSON), when they lapse, who set them and
-- when. A lapsed row is the same as no row; the purge deletes those.
CREATE TABLE IF NOT EXISTS swin_key_limits (
    namespace  text   NOT NULL,
    key        text   NOT NULL,
    limits     jsonb  NOT NULL,
    expires_at bigint,          -- Unix milliseconds; NULL: never
    set_by     text   NOT NULL,
    set_at     bigint NOT NULL, -- Unix milliseconds
    PRIMARY KEY (namespace, key)
);

CREATE INDEX IF NOT EXISTS swin_key_limits_expiry ON swin_key_limits (expires_at)
    WHERE expires_at IS NOT NULL;

-- Every change of a key's limits, numbered per namespace: nodes read the keys changed
-- since the last number they saw. Kept a day.
CREATE TABLE IF NOT EXISTS swin_key_limit_log (
    namespace  text        NOT NULL,
    version    bigint      NOT NULL,
    key        text        NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, version)
);

CREATE INDEX IF NOT EXISTS swin_key_limit_log_age ON swin_key_limit_log (changed_at);

-- A namespace's last change number (its row is locked by each change, so numbers are
-- given in commit order) and the last number the purge removed from the log.
CREATE TABLE IF NOT EXISTS swin_key_limit_versions (
    namespace      text   PRIMARY KEY,
    version        bigint NOT NULL,
    purged_through bigint NOT NULL DEFAULT 0
);
