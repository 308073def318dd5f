-- The client each open reservation is counted for; see the PostgreSQL migration of the same name.
ALTER TABLE swin_cost_reservations ADD COLUMN client TEXT NOT NULL DEFAULT '';

CREATE INDEX IF NOT EXISTS swin_cost_reservations_client
    ON swin_cost_reservations (namespace, client, expires_at) WHERE ended IS NULL;
