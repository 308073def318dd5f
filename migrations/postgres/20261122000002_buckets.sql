-- GCRA buckets of every node (namespaces with algorithm = "gcra"): one row per key with
-- its theoretical arrival time. A row whose TAT has passed is a full bucket, the same as
-- no row; the purge deletes those. Nodes push TAT advances; the store applies them as
--   tat_ns = greatest(tat_ns, now) + sum(advances)
CREATE TABLE IF NOT EXISTS swin_buckets (
    namespace  text        NOT NULL,
    key        text        NOT NULL,
    tat_ns     bigint      NOT NULL,
    tat        timestamptz GENERATED ALWAYS AS (to_timestamp(tat_ns / 1e9)) STORED,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, key)
);

CREATE INDEX IF NOT EXISTS swin_buckets_tat ON swin_buckets (tat_ns);
