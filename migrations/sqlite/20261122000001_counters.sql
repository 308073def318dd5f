-- The embedded store: the same tables and view as PostgreSQL. SQLite has no
-- timestamptz, so window_start is Unix seconds here.
CREATE TABLE IF NOT EXISTS swin_counters (
    namespace    TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    window_size  INTEGER NOT NULL CHECK (window_size > 0),
    window_start INTEGER NOT NULL,
    count        REAL    NOT NULL DEFAULT 0,
    updated_at   INTEGER NOT NULL DEFAULT (unixepoch()),
    PRIMARY KEY (namespace, key, window_size, window_start)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS swin_counters_window_start ON swin_counters (window_start);

CREATE TABLE IF NOT EXISTS swin_pushes (
    node_id   TEXT    NOT NULL,
    namespace TEXT    NOT NULL,
    seq       INTEGER NOT NULL,
    pushed_at INTEGER NOT NULL DEFAULT (unixepoch()),
    PRIMARY KEY (node_id, namespace, seq)
) WITHOUT ROWID;

CREATE VIEW IF NOT EXISTS swin_rates AS
SELECT namespace, key, window_size, current_start AS window_start,
       sum(CASE WHEN window_start = current_start THEN count ELSE 0 END) AS current,
       sum(CASE WHEN window_start < current_start THEN count ELSE 0 END) AS previous,
       sum(CASE WHEN window_start = current_start THEN count ELSE 0 END)
         + sum(CASE WHEN window_start < current_start THEN count ELSE 0 END)
           * (window_size - (now_ms / 1000.0 - current_start)) / window_size AS rate
FROM (
    SELECT c.*, (CAST(unixepoch('subsec') * 1000 AS INTEGER) / 1000 / c.window_size) * c.window_size AS current_start,
           unixepoch('subsec') * 1000 AS now_ms
    FROM swin_counters c
)
WHERE window_start >= current_start - window_size AND window_start <= current_start
GROUP BY namespace, key, window_size, current_start;
