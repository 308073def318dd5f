-- Strict admission of GCRA buckets: each holder's (a node's run's) last reservation per
-- bucket, its number and the units granted, so a repeated request is answered as the
-- first was. horizon_end_ns is when the holder stops spending the grant; the purge
-- deletes records long past it.
CREATE TABLE IF NOT EXISTS swin_reservations (
    namespace      text     NOT NULL,
    key            text     NOT NULL,
    holder         text     NOT NULL,
    seq            bigint   NOT NULL,
    granted        bigint   NOT NULL,
    horizon_end_ns bigint   NOT NULL,
    PRIMARY KEY (namespace, key, holder)
);

CREATE INDEX IF NOT EXISTS swin_reservations_horizon ON swin_reservations (horizon_end_ns);
