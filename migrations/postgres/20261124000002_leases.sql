-- Concurrency leases (namespaces with algorithm = "concurrency"): one row per lease in
-- flight, holding `count` slots of its key until `expires_at` (Unix ms). A lapsed row
-- no longer counts; acquires and the purge delete them.
CREATE TABLE IF NOT EXISTS swin_leases (
    namespace  text    NOT NULL,
    key        text    NOT NULL,
    lease      text    NOT NULL,
    count      integer NOT NULL,
    expires_at bigint  NOT NULL,
    PRIMARY KEY (namespace, key, lease)
);

CREATE INDEX IF NOT EXISTS swin_leases_expiry ON swin_leases (expires_at);
