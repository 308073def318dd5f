-- The end of each released lease, kept for two minutes (`expires_at`, Unix ms) with the
-- operation id of the release that ended it, so that a release sent again after its
-- answer was lost learns that the lease was released (and whether by itself) instead of
-- "not live". The purge deletes the rows a minute after they lapse.
CREATE TABLE IF NOT EXISTS swin_lease_ends (
    namespace  text   NOT NULL,
    key        text   NOT NULL,
    lease      text   NOT NULL,
    op         text   NOT NULL,
    expires_at bigint NOT NULL,
    PRIMARY KEY (namespace, key, lease)
);

CREATE INDEX IF NOT EXISTS swin_lease_ends_expiry ON swin_lease_ends (expires_at);
