-- A window's count stays below 2^53, where a double stops counting every integer: each
-- node refuses a hit that would take its view there, and the store refuses a push that
-- would take the sum of every node's there (the row is isolated and reported, see
-- isolate_rejected). SQLite cannot add a CHECK to a table: triggers do it.
CREATE TRIGGER IF NOT EXISTS swin_counters_count_bound_insert
BEFORE INSERT ON swin_counters WHEN NEW.count >= 9007199254740992.0
BEGIN SELECT RAISE(ABORT, 'swin: a count would reach 2^53'); END;

CREATE TRIGGER IF NOT EXISTS swin_counters_count_bound_update
BEFORE UPDATE OF count ON swin_counters WHEN NEW.count >= 9007199254740992.0
BEGIN SELECT RAISE(ABORT, 'swin: a count would reach 2^53'); END;
