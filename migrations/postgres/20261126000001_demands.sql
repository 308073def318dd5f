-- What the proxies of Envoy's rate limit quota service ask for: per namespace and bucket,
-- one row per node, its proxies' demands (requests per the rule's unit, comma-separated)
-- until `expires_at` (Unix ms, the store's time). Every node reads every node's rows to
-- divide a bucket's limit; a lapsed row no longer counts, and the purge deletes it.
CREATE TABLE IF NOT EXISTS swin_demands (
    namespace  text   NOT NULL,
    bucket     text   NOT NULL,
    node       text   NOT NULL,
    demands    text   NOT NULL,
    expires_at bigint NOT NULL,
    PRIMARY KEY (namespace, bucket, node)
);

CREATE INDEX IF NOT EXISTS swin_demands_expiry ON swin_demands (expires_at);
