-- Counters of every node, summed: one row per (namespace, key, window size, window).
CREATE TABLE IF NOT EXISTS swin_counters (
    namespace    text             NOT NULL,
    key          text             NOT NULL,
    window_size  integer          NOT NULL CHECK (window_size > 0),
    window_start timestamptz      NOT NULL,
    count        double precision NOT NULL DEFAULT 0,
    updated_at   timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, key, window_size, window_start)
);

-- The purge looks for old windows across namespaces.
CREATE INDEX IF NOT EXISTS swin_counters_window_start ON swin_counters (window_start);

-- Pushes already applied, per node: a retried push whose first attempt committed
-- (reply lost to a timeout) finds its row here and is not applied twice.
CREATE TABLE IF NOT EXISTS swin_pushes (
    node_id   text        NOT NULL,
    namespace text        NOT NULL,
    seq       bigint      NOT NULL,
    pushed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node_id, namespace, seq)
);

-- Each key's sliding rate per window size at this instant, for operators:
--   SELECT * FROM swin_rates WHERE namespace = 'api' ORDER BY rate DESC LIMIT 10;
CREATE OR REPLACE VIEW swin_rates AS
SELECT c.namespace,
       c.key,
       c.window_size,
       w.current_start AS window_start,
       coalesce(sum(c.count) FILTER (WHERE c.window_start = w.current_start), 0) AS current,
       coalesce(sum(c.count) FILTER (WHERE c.window_start < w.current_start), 0) AS previous,
       coalesce(sum(c.count) FILTER (WHERE c.window_start = w.current_start), 0)
         + coalesce(sum(c.count) FILTER (WHERE c.window_start < w.current_start), 0) * w.weight AS rate
FROM swin_counters c
CROSS JOIN LATERAL (
    SELECT to_timestamp(floor(extract(epoch FROM now()) / c.window_size) * c.window_size) AS current_start,
           ((c.window_size - mod(extract(epoch FROM now())::numeric, c.window_size)) / c.window_size)::float8 AS weight
) w
WHERE c.window_start >= w.current_start - make_interval(secs => c.window_size)
  AND c.window_start <= w.current_start
GROUP BY c.namespace, c.key, c.window_size, w.current_start, w.weight;
