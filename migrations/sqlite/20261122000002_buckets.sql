-- GCRA buckets, as in PostgreSQL: tat_ns is the theoretical arrival time in Unix
-- nanoseconds; a row whose TAT has passed is a full bucket, the same as no row.
CREATE TABLE IF NOT EXISTS swin_buckets (
    namespace  TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    tat_ns     INTEGER NOT NULL,
    updated_at INTEGER NOT NULL DEFAULT (unixepoch()),
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS swin_buckets_tat ON swin_buckets (tat_ns);
