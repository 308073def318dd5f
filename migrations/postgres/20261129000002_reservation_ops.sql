-- Every change of a reservation can be applied again without changing anything more:
-- `ops` keeps the operation ids of its latest extends (`<16 hex>;` each), and `ended`
-- the commit that ended it (`<op>:<cost>`; NULL while it is open). An ended row stays
-- for a while, so that a commit retried after a lost answer learns what the first did.
ALTER TABLE swin_cost_reservations ADD COLUMN IF NOT EXISTS ops TEXT NOT NULL DEFAULT '';
ALTER TABLE swin_cost_reservations ADD COLUMN IF NOT EXISTS ended TEXT;
