//! The counting side of the Redis store ([`CounterStore`]): pushes of windows and buckets
//! by script, reads, a namespace's load, purges and resets, over the key layout of
//! `mod.rs`.

use super::*;

impl CounterStore for RedisStore {
    fn kind(&self) -> StoreKind {
        if self.servers.is_cluster() {
            StoreKind::RedisCluster
        } else {
            StoreKind::Redis
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            pipelines: true,
            expires_by_itself: true,
        }
    }

    /// Nothing to apply: hashes need no schema.
    async fn migrate(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Nothing to delete: every hash expires by itself (see the module header).
    async fn purge(&self, _now: UnixMs) -> Result<u64, StoreError> {
        Ok(0)
    }

    async fn push(&self, namespace: &str, push: Push<'_>) -> Result<Pushed, StoreError> {
        let diffs = normalize(push.diffs);
        let hashes = self.runs_by_hash(namespace, &diffs);
        if hashes.is_empty() {
            return Ok(Pushed::default());
        }
        let names: Vec<&str> = hashes.iter().map(|(k, _)| k.as_str()).collect();
        // a push with a seq is deduplicated per hash (push.lua), so a retry may group
        // its hashes otherwise: on one server, 64 hashes of any slots go in one call
        // (with one script call per hash, a sync's pushes took 2.5 times as long)
        let calls = self.calls_for(&names, false);
        let node_field = format!("n:{}", push.node_id);
        let seq = push.seq.map_or(-1i64, |s| s as i64);
        let mut sends = Vec::with_capacity(calls.len());
        for call in &calls {
            let mut inv = Eval::default();
            inv.arg(&node_field).arg(seq).arg(swin_core::MAX_COUNT);
            for &h in call {
                let (key, range) = &hashes[h];
                let first = &diffs[range.start];
                let size = i64::from(first.window_size);
                let newest = diffs[range.clone()]
                    .iter()
                    .map(|x| x.window_start)
                    .max()
                    .unwrap_or(first.window_start);
                inv.key(key);
                inv.arg(3 * size).arg(newest - 2 * size).arg(range.len());
                for x in &diffs[range.clone()] {
                    inv.arg(x.window_start).arg(x.value);
                }
            }
            sends.push(inv.call(&self.scripts.push, true));
        }
        let replies: Vec<Vec<String>> = self.replies(sends).await?;
        pushed_of(&calls, &hashes, &diffs, replies)
    }

    async fn push_tats(&self, namespace: &str, push: TatPush<'_>) -> Result<Vec<Tat>, StoreError> {
        self.push_bucket_tats(namespace, push).await
    }

    async fn read_tats(
        &self,
        namespace: &str,
        keys: &[CompactString],
    ) -> Result<Vec<Tat>, StoreError> {
        self.read_bucket_tats(namespace, keys).await
    }

    async fn load_tats(&self, namespace: &str, now_ns: i64) -> Result<Vec<Tat>, StoreError> {
        self.load_bucket_tats(namespace, now_ns).await
    }

    /// Empties the key's hashes, one per window size and its bucket, but for their push
    /// records.
    async fn reset(
        &self,
        namespace: &str,
        key: &str,
        window_sizes: &[u32],
    ) -> Result<(), StoreError> {
        // one hash tag: every key of the call is in one cluster slot
        let mut inv = Eval::default();
        inv.key(&self.bucket_key(namespace, key));
        for s in window_sizes {
            inv.key(&self.hash_key(namespace, key, *s));
        }
        let _: Vec<i64> = self
            .replies(vec![inv.call(&self.scripts.reset, true)])
            .await?;
        Ok(())
    }

    async fn read(&self, namespace: &str, keys: &[WindowKey]) -> Result<Vec<Total>, StoreError> {
        // one HMGET per hash: a key's windows of one size (its current and previous,
        // side by side in what the engine asks) in one command, not one each
        let runs = runs_of_hashes(keys);
        let calls = runs
            .iter()
            .map(|run| {
                let w = &keys[run.start];
                let h = self.hash_key(namespace, &w.key, w.window_size);
                let mut cmd = redis::cmd("HMGET");
                cmd.arg(&h);
                for w in &keys[run.clone()] {
                    cmd.arg(w.window_start);
                }
                Call::on(&h, cmd, false)
            })
            .collect();
        let replies = self.run(calls).await?;
        let mut totals = Vec::with_capacity(keys.len());
        for (run, reply) in runs.into_iter().zip(replies) {
            let counts: Vec<Option<String>> = redis::from_owned_redis_value(reply)?;
            for (w, c) in keys[run].iter().zip(counts) {
                if let Some(c) = c {
                    totals.push(Total {
                        key: w.key.clone(),
                        window_size: w.window_size,
                        window_start: w.window_start,
                        count: parse(&c)?,
                    });
                }
            }
        }
        Ok(totals)
    }

    /// Warm-up scans for the namespace's hashes: Redis keeps no per-namespace index
    /// (it would be one hot key per namespace), so this walks the keyspace once, at start.
    async fn load_namespace(
        &self,
        namespace: &str,
        windows: &[(u32, i64)],
    ) -> Result<Vec<Total>, StoreError> {
        let head = format!("{}:{{{}:{}:", self.prefix, namespace.len(), namespace);
        let pattern = format!("{}*", glob_escape(&head));
        let mut hashes = Vec::new();
        for hash in self.scan(&pattern).await? {
            let Some((key, size)) = parse_hash_key(&hash, &head) else {
                continue;
            };
            let Some(&(_, oldest)) = windows.iter().find(|(s, _)| *s == size) else {
                continue;
            };
            let mut cmd = redis::cmd("HGETALL");
            cmd.arg(&hash);
            hashes.push((Call::on(&hash, cmd, false), key.to_owned(), size, oldest));
        }
        let mut out = Vec::new();
        while !hashes.is_empty() {
            let rest = hashes.split_off(hashes.len().min(CALLS_PER_RUN));
            let (calls, found): (Vec<Call>, Vec<_>) = hashes
                .into_iter()
                .map(|(c, key, size, oldest)| (c, (key, size, oldest)))
                .unzip();
            hashes = rest;
            let replies: Vec<Vec<(String, String)>> = self.replies(calls).await?;
            for ((key, size, oldest), fields) in found.into_iter().zip(replies) {
                Self::live_windows(&key, size, oldest, fields, &mut out)?;
            }
        }
        Ok(out)
    }

    /// PING to every server holding keys (each primary of a cluster).
    async fn ping(&self) -> Result<Option<UnixMs>, StoreError> {
        // every primary answers; the first one's clock is the store's
        let mut first = None;
        for server in self.servers.primaries().await? {
            let mut conn = server.conn().await?;
            let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
            first.get_or_insert(UnixMs(secs * 1_000 + micros / 1_000));
        }
        Ok(first)
    }
}

impl RedisStore {
    /// One run of `diffs` per hash, with the hash's key (`normalize` sorts by key, size,
    /// start, so a hash's windows are next to each other).
    fn runs_by_hash(
        &self,
        namespace: &str,
        diffs: &[swin_core::Diff],
    ) -> Vec<(String, std::ops::Range<usize>)> {
        let mut hashes = Vec::new();
        let mut i = 0;
        while i < diffs.len() {
            let d = &diffs[i];
            let mut j = i + 1;
            while j < diffs.len() && diffs[j].key == d.key && diffs[j].window_size == d.window_size
            {
                j += 1;
            }
            hashes.push((self.hash_key(namespace, &d.key, d.window_size), i..j));
            i = j;
        }
        hashes
    }
}

/// What the push script answered, call by call: each window's total, or why the store
/// rejected it (`!reason`).
fn pushed_of(
    calls: &[Vec<usize>],
    hashes: &[(String, std::ops::Range<usize>)],
    diffs: &[swin_core::Diff],
    replies: Vec<Vec<String>>,
) -> Result<Pushed, StoreError> {
    let mut out = Pushed {
        totals: Vec::with_capacity(diffs.len()),
        rejected: Vec::new(),
    };
    for (call, counts) in calls.iter().zip(replies) {
        let windows: Vec<&swin_core::Diff> = call
            .iter()
            .flat_map(|&h| &diffs[hashes[h].1.clone()])
            .collect();
        if counts.len() != windows.len() {
            return Err(StoreError::Protocol(format!(
                "push script returned {} counts for {} windows",
                counts.len(),
                windows.len()
            )));
        }
        for (d, c) in windows.into_iter().zip(counts) {
            if let Some(reason) = c.strip_prefix('!') {
                out.rejected.push(Rejected {
                    diff: d.clone(),
                    reason: format!("redis: {reason}"),
                });
                continue;
            }
            out.totals.push(Total {
                key: d.key.clone(),
                window_size: d.window_size,
                window_start: d.window_start,
                count: parse(&c)?,
            });
        }
    }
    Ok(out)
}

/// The runs of `keys` side by side in one hash (one key, one window size).
fn runs_of_hashes(keys: &[WindowKey]) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, w) in keys.iter().enumerate() {
        match runs.last_mut() {
            Some(r) if keys[r.start].window_size == w.window_size && keys[r.start].key == w.key => {
                r.end = i + 1
            }
            _ => runs.push(i..i + 1),
        }
    }
    runs
}
