-- Idempotency records (see swin_sync::store::idempotency): per namespace and record key
-- (route key and idempotency key), the fingerprint of the first request and, once it
-- answered, its answer. While `answer` is null the request is in flight, held by `token`
-- until `held_until` (Unix ms); the record lapses at `expires_at`. Claims insert, the
-- purge deletes lapsed rows.
CREATE TABLE IF NOT EXISTS swin_idempotency (
    namespace   text   NOT NULL,
    key         text   NOT NULL,
    fingerprint bytea  NOT NULL,
    token       bigint NOT NULL,
    held_until  bigint NOT NULL,
    expires_at  bigint NOT NULL,
    answer      bytea,
    PRIMARY KEY (namespace, key)
);

CREATE INDEX IF NOT EXISTS swin_idempotency_expiry ON swin_idempotency (expires_at);

-- Records per namespace (lapsed ones until the purge deletes them): what the cap,
-- `idempotency_max_keys`, counts. Changed in the transaction that adds or deletes a record.
CREATE TABLE IF NOT EXISTS swin_idempotency_counts (
    namespace text   PRIMARY KEY,
    records   bigint NOT NULL
);
