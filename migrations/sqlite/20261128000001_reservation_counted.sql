-- Where a reservation's total was counted; see the PostgreSQL migration of the same name.
ALTER TABLE swin_cost_reservations ADD COLUMN counted TEXT NOT NULL DEFAULT '';
