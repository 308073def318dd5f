-- A window's count stays below 2^53, where a double stops counting every integer: each
-- node refuses a hit that would take its view there, and the store refuses a push that
-- would take the sum of every node's there (the row is isolated and reported, see
-- isolate_rejected). NOT VALID: rows written before are not checked, new writes are.
ALTER TABLE swin_counters
    ADD CONSTRAINT swin_counters_count_bound CHECK (count < 9007199254740992) NOT VALID;
