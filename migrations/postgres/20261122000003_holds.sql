-- Strict admission: the quota each holder (a node's run) has reserved in a window. Its
-- sum is part of the window's count in swin_counters; a holder gives back what it did
-- not use when the window ends, so the count is then what was admitted.
CREATE TABLE IF NOT EXISTS swin_holds (
    namespace    text             NOT NULL,
    key          text             NOT NULL,
    window_size  integer          NOT NULL CHECK (window_size > 0),
    window_start timestamptz      NOT NULL,
    holder       text             NOT NULL,
    held         double precision NOT NULL,
    updated_at   timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, key, window_size, window_start, holder)
);

CREATE INDEX IF NOT EXISTS swin_holds_window_start ON swin_holds (window_start);
