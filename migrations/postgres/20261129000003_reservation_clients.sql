-- The client each open reservation is counted for (a short id its node names it by;
-- '' for none), so that a namespace's open reservations and each client's are capped
-- (`reservations_max_open`, `reservations_max_open_per_client`): an opening counts the
-- client's open rows through this index.
ALTER TABLE swin_cost_reservations ADD COLUMN IF NOT EXISTS client TEXT NOT NULL DEFAULT '';

CREATE INDEX IF NOT EXISTS swin_cost_reservations_client
    ON swin_cost_reservations (namespace, client, expires_at) WHERE ended IS NULL;
