-- Each client's share of a namespace's idempotency records (see
-- swin_sync::store::idempotency): the client a record is counted for (a short id its
-- node names it by; '' for a record claimed without one), and per namespace and client
-- the records it holds (lapsed ones until the purge deletes them), changed in the
-- transaction that adds or deletes a record.
ALTER TABLE swin_idempotency ADD COLUMN IF NOT EXISTS client text NOT NULL DEFAULT '';

CREATE TABLE IF NOT EXISTS swin_idempotency_client_counts (
    namespace text   NOT NULL,
    client    text   NOT NULL,
    records   bigint NOT NULL,
    PRIMARY KEY (namespace, client)
);
