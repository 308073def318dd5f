-- Reservations of a cost; see the PostgreSQL migration of the same name.
CREATE TABLE IF NOT EXISTS swin_cost_reservations (
    namespace  TEXT    NOT NULL,
    id         TEXT    NOT NULL,
    keys       TEXT    NOT NULL,
    total      REAL    NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, id)
);

CREATE INDEX IF NOT EXISTS swin_cost_reservations_expiry
    ON swin_cost_reservations (namespace, expires_at);
