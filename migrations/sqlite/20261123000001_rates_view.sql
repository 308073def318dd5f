-- swin_rates without unixepoch('subsec'), which needs SQLite 3.42: the sqlite3 an
-- operator inspects with (Debian 12 ships 3.40) read no rows through it. julianday()
-- has millisecond precision on every SQLite version.
DROP VIEW IF EXISTS swin_rates;

CREATE VIEW swin_rates AS
SELECT namespace, key, window_size, current_start AS window_start,
       sum(CASE WHEN window_start = current_start THEN count ELSE 0 END) AS current,
       sum(CASE WHEN window_start < current_start THEN count ELSE 0 END) AS previous,
       sum(CASE WHEN window_start = current_start THEN count ELSE 0 END)
         + sum(CASE WHEN window_start < current_start THEN count ELSE 0 END)
           * (window_size - (now_ms / 1000.0 - current_start)) / window_size AS rate
FROM (
    SELECT c.*, (CAST(t.now_ms AS INTEGER) / 1000 / c.window_size) * c.window_size AS current_start,
           t.now_ms AS now_ms
    FROM swin_counters c,
         (SELECT round((julianday('now') - 2440587.5) * 86400000.0) AS now_ms) t
)
WHERE window_start >= current_start - window_size AND window_start <= current_start
GROUP BY namespace, key, window_size, current_start;
