-- The operation ids of a reservation's changes; see the PostgreSQL migration of the same name.
ALTER TABLE swin_cost_reservations ADD COLUMN ops TEXT NOT NULL DEFAULT '';
ALTER TABLE swin_cost_reservations ADD COLUMN ended TEXT;
