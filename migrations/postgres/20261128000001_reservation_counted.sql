-- Where a reservation's total was counted: `<unix ms>:<amount>;` per take (the reserve's,
-- each extend's), so that a commit gives back the unused part from the windows it was
-- counted in. A row written before this column reads as counted at times unknown.
ALTER TABLE swin_cost_reservations ADD COLUMN IF NOT EXISTS counted TEXT NOT NULL DEFAULT '';
