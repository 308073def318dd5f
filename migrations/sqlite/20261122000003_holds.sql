-- Strict admission: the quota each holder (a node's run) has reserved in a window (see
-- the PostgreSQL migration). window_start is Unix seconds, as in swin_counters.
CREATE TABLE IF NOT EXISTS swin_holds (
    namespace    TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    window_size  INTEGER NOT NULL CHECK (window_size > 0),
    window_start INTEGER NOT NULL,
    holder       TEXT    NOT NULL,
    held         REAL    NOT NULL,
    updated_at   INTEGER NOT NULL DEFAULT (unixepoch()),
    PRIMARY KEY (namespace, key, window_size, window_start, holder)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS swin_holds_window_start ON swin_holds (window_start);
