-- Reservations of a cost (reserve, extend, commit): one row per open reservation, its
-- keys (a JSON array of strings), its total (the estimate and every extend since) and
-- its lapse (`expires_at`, Unix ms). A commit deletes its row (exactly once); an extend
-- raises `total` while the row is live; a lapsed row answers nothing and is deleted by
-- a later opening in its namespace.
CREATE TABLE IF NOT EXISTS swin_cost_reservations (
    namespace  text             NOT NULL,
    id         text             NOT NULL,
    keys       text             NOT NULL,
    total      double precision NOT NULL,
    expires_at bigint           NOT NULL,
    PRIMARY KEY (namespace, id)
);

CREATE INDEX IF NOT EXISTS swin_cost_reservations_expiry
    ON swin_cost_reservations (namespace, expires_at);
