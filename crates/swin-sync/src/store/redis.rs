//! Redis store.
//!
//! Layout: one hash per (namespace, key, window size):
//!
//! ```text
//! swin:{<len(namespace)>:<namespace>:<key>}:<window_size>
//!     <window_start>  -> count        (a double, written with %.17g)
//!     n:<node_id>     -> last push seq applied from that node
//! ```
//!
//! The hash tag `{…}` covers namespace and key, so a namespace's keys spread over every
//! Redis Cluster slot instead of piling onto one hash (Kong keeps one hash per window and
//! namespace). The length prefix keeps `("a:b", "c")` and `("a", "b:c")` apart. A push
//! refreshes the hash's TTL to three windows and drops the window before the previous
//! one, so a key nobody pushes expires by itself.
//!
//! A push groups the batch's hashes by cluster slot (CRC16 of the hash tag, as Redis
//! computes it) and sends one script call per group of at most 64 hashes of one slot, so a
//! script never crosses slots and its overhead is shared by several keys.
//!
//! GCRA buckets (namespaces with `algorithm = "gcra"`) are one hash per key beside them:
//!
//! ```text
//! swin:{<len(namespace)>:<namespace>:<key>}:gcra
//!     tat             -> theoretical arrival time, Unix nanoseconds (integer)
//!     n:<node_id>     -> last push seq applied from that node
//! ```
//!
//! advanced by a script as `tat = max(tat, now) + advance` (HINCRBY, so the 64-bit
//! integer is exact; Lua's numbers are doubles), expiring an hour after the bucket is
//! full again.
//!
//! Exactly-once: each script call adds its diffs only when the batch's sequence number is
//! above the node's last one recorded in the group's first hash (`n:<node_id>`), and
//! records it in the same atomic step. The engine retries a failed batch unchanged, so the
//! groups (a pure function of the sorted batch) come out the same: groups the first
//! attempt reached skip it, the others apply it.

use redis::aio::ConnectionManager;
use redis::Script;
use swin_core::{CompactString, Tat, Total};

use super::{normalize, normalize_advances, Push, Pushed, Rejected, TatPush, WindowKey};
use crate::StoreError;

const PUSH_LUA: &str = r#"
-- KEYS: hashes of one cluster slot; KEYS[1] also holds the node's last applied seq.
-- ARGV: node field, seq (-1: no dedupe), then per key: ttl, stale window field, n, and
-- n pairs (window_start, diff). Returns per pushed window, in order, its new count, or
-- '!' and the reason when the window is refused (its stored count is not a number, or
-- the sum would not be finite): such a window is skipped, the others are applied.
-- Everything is read and checked before the first write, so a call that fails applies
-- nothing (Redis does not roll a script back).
local function finite(x) return x ~= nil and x == x and x ~= math.huge and x ~= -math.huge end
local seq = tonumber(ARGV[2])
if not finite(seq) then return redis.error_reply('swin push: seq is not a number') end
local a = 3
for k = 1, #KEYS do
  local n = tonumber(ARGV[a + 2])
  if not (finite(tonumber(ARGV[a])) and finite(n)) then
    return redis.error_reply('swin push: malformed arguments')
  end
  a = a + 3 + 2 * n
end
if a - 1 ~= #ARGV then return redis.error_reply('swin push: argument count') end
local apply = true
if seq >= 0 then
  local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1')
  apply = seq > last
end
local out = {}
-- first pass: read and check; the plan says what each window does
local plan = {}
a = 3
for k = 1, #KEYS do
  local n = tonumber(ARGV[a + 2])
  a = a + 3
  for i = 1, n do
    local field, diff = ARGV[a], tonumber(ARGV[a + 1])
    local stored = redis.call('HGET', KEYS[k], field)
    local cur = tonumber(stored or '0')
    local step
    if not finite(cur) then
      step = {'refuse', '!stored count is not a finite number'}
    elseif not apply then
      step = {'read', stored or '0'}
    elseif not finite(diff) then
      step = {'refuse', '!diff is not a finite number'}
    elseif not finite(cur + diff) then
      step = {'refuse', '!the sum would not be finite'}
    elseif cur + diff < 0 then
      step = {'set', stored == false, '0'}
    else
      -- %.17g round-trips every double; HINCRBYFLOAT would keep 17 digits after the
      -- point only (2^-20 came back as 9.5367431641e-7)
      step = {'set', stored == false, string.format('%.17g', cur + diff)}
    end
    plan[#plan + 1] = step
    a = a + 2
  end
end
if not apply then
  for _, step in ipairs(plan) do out[#out + 1] = step[2] end
  return out
end
-- second pass: write
a = 3
local p = 0
for k = 1, #KEYS do
  local ttl, stale, n = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  a = a + 3
  local opened, wrote = false, false
  for i = 1, n do
    p = p + 1
    local step = plan[p]
    if step[1] == 'refuse' then
      out[#out + 1] = step[2]
    else
      -- a window that just appeared: the one before the previous may still be there
      if step[2] then opened = true end
      wrote = true
      redis.call('HSET', KEYS[k], ARGV[a], step[3])
      out[#out + 1] = step[3]
    end
    a = a + 2
  end
  if wrote then
    if opened then redis.call('HDEL', KEYS[k], stale) end
    redis.call('EXPIRE', KEYS[k], ttl)
  end
end
if seq >= 0 then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
return out
"#;

const PUSH_TATS_LUA: &str = r#"
-- KEYS: bucket hashes of one cluster slot; KEYS[1] also holds the node's last applied seq.
-- ARGV: node field, seq (-1: no dedupe), now (ns), then one advance (ns) per key.
-- Returns each bucket's TAT as a string, in order.
local seq = tonumber(ARGV[2])
local apply = true
if seq >= 0 then
  local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1')
  apply = seq > last
end
local now = ARGV[3]
local out = {}
for k = 1, #KEYS do
  if apply then
    local tat = redis.call('HGET', KEYS[k], 'tat')
    if (not tat) or tonumber(tat) < tonumber(now) then
      redis.call('HSET', KEYS[k], 'tat', now)
    end
    redis.call('HINCRBY', KEYS[k], 'tat', ARGV[3 + k])
    tat = redis.call('HGET', KEYS[k], 'tat')
    local ms = math.max(0, (tonumber(tat) - tonumber(now)) / 1e6)
    redis.call('PEXPIRE', KEYS[k], math.floor(ms) + 3600000)
    out[#out + 1] = tat
  else
    out[#out + 1] = redis.call('HGET', KEYS[k], 'tat') or now
  end
end
if apply and seq >= 0 then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
return out
"#;

/// A reset: every field of the key's hashes but the per-node push records (`n:…`), so a
/// retried push that was applied before the reset is still recognised and not applied
/// again. The hashes then expire as they would have.
const RESET_LUA: &str = r#"
for k = 1, #KEYS do
  for _, f in ipairs(redis.call('HKEYS', KEYS[k])) do
    if string.sub(f, 1, 2) ~= 'n:' then redis.call('HDEL', KEYS[k], f) end
  end
end
return 0
"#;

/// Hashes per script call: enough to share the call's overhead, small enough that one
/// call never blocks Redis for long.
const HASHES_PER_CALL: usize = 64;

#[derive(Clone)]
pub struct RedisStore {
    client: redis::Client,
    /// Connected on first use, so a node starts (degraded) while Redis is down; the
    /// manager reconnects by itself after that.
    conn: std::sync::Arc<tokio::sync::OnceCell<ConnectionManager>>,
    prefix: String,
    push_script: std::sync::Arc<Script>,
    push_tats_script: std::sync::Arc<Script>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// `prefix` starts every key (default `swin`); tests use their own. Only the URL is
    /// checked here: the connection is made on first use.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        Ok(RedisStore {
            client,
            conn: Default::default(),
            prefix: prefix.to_owned(),
            push_script: std::sync::Arc::new(Script::new(PUSH_LUA)),
            push_tats_script: std::sync::Arc::new(Script::new(PUSH_TATS_LUA)),
        })
    }

    /// The prefix every key of this store starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    async fn conn(&self) -> Result<ConnectionManager, StoreError> {
        let manager = self
            .conn
            .get_or_try_init(|| {
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(std::time::Duration::from_secs(2))
                    .set_response_timeout(std::time::Duration::from_secs(5))
                    .set_number_of_retries(1);
                ConnectionManager::new_with_config(self.client.clone(), config)
            })
            .await?;
        Ok(manager.clone())
    }

    fn hash_key(&self, namespace: &str, key: &str, window_size: u32) -> String {
        format!(
            "{}:{{{}:{}:{}}}:{}",
            self.prefix,
            namespace.len(),
            namespace,
            key,
            window_size
        )
    }

    pub(crate) async fn push(&self, namespace: &str, push: Push<'_>) -> Result<Pushed, StoreError> {
        let diffs = normalize(push.diffs);
        // One run of diffs per hash (normalize sorts by key, size, start).
        let mut hashes: Vec<(String, std::ops::Range<usize>)> = Vec::new();
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
        if hashes.is_empty() {
            return Ok(Pushed::default());
        }
        let names: Vec<&str> = hashes.iter().map(|(k, _)| k.as_str()).collect();
        let calls = slot_calls(&names);
        let node_field = format!("n:{}", push.node_id);
        let seq = push.seq.map_or(-1i64, |s| s as i64);
        let mut pipe = redis::pipe();
        for call in &calls {
            let mut inv = self.push_script.prepare_invoke();
            inv.arg(&node_field).arg(seq);
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
            pipe.invoke_script(&inv);
        }
        let mut conn = self.conn().await?;
        // Load the script once; EVALSHA in the pipeline then finds it.
        self.push_script
            .prepare_invoke()
            .load_async(&mut conn)
            .await?;
        let replies: Vec<Vec<String>> = pipe.query_async(&mut conn).await?;
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

    fn bucket_key(&self, namespace: &str, key: &str) -> String {
        format!(
            "{}:{{{}:{}:{}}}:gcra",
            self.prefix,
            namespace.len(),
            namespace,
            key
        )
    }

    pub(crate) async fn push_tats(
        &self,
        namespace: &str,
        push: TatPush<'_>,
    ) -> Result<Vec<Tat>, StoreError> {
        let advances = normalize_advances(push.advances);
        let hashes: Vec<String> = advances
            .iter()
            .map(|a| self.bucket_key(namespace, &a.key))
            .collect();
        let names: Vec<&str> = hashes.iter().map(String::as_str).collect();
        let calls = slot_calls(&names);
        let node_field = format!("n:{}", push.node_id);
        let seq = push.seq.map_or(-1i64, |s| s as i64);
        let mut pipe = redis::pipe();
        for call in &calls {
            let mut inv = self.push_tats_script.prepare_invoke();
            inv.arg(&node_field).arg(seq).arg(push.now_ns);
            for &i in call {
                inv.key(&hashes[i]);
            }
            for &i in call {
                inv.arg(advances[i].ns);
            }
            pipe.invoke_script(&inv);
        }
        let mut conn = self.conn().await?;
        self.push_tats_script
            .prepare_invoke()
            .load_async(&mut conn)
            .await?;
        let replies: Vec<Vec<String>> = pipe.query_async(&mut conn).await?;
        let mut out = Vec::with_capacity(advances.len());
        for (call, values) in calls.iter().zip(replies) {
            if values.len() != call.len() {
                return Err(StoreError::Protocol(format!(
                    "push_tats script returned {} values for {} buckets",
                    values.len(),
                    call.len()
                )));
            }
            for (&i, v) in call.iter().zip(values) {
                out.push(Tat {
                    key: advances[i].key.clone(),
                    tat_ns: parse_ns(&v)?,
                });
            }
        }
        Ok(out)
    }

    pub(crate) async fn read_tats(
        &self,
        namespace: &str,
        keys: &[CompactString],
    ) -> Result<Vec<Tat>, StoreError> {
        let mut pipe = redis::pipe();
        for k in keys {
            pipe.hget(self.bucket_key(namespace, k), "tat");
        }
        let mut conn = self.conn().await?;
        let replies: Vec<Option<String>> = pipe.query_async(&mut conn).await?;
        keys.iter()
            .zip(replies)
            .filter_map(|(k, r)| r.map(|v| (k, v)))
            .map(|(k, v)| {
                Ok(Tat {
                    key: k.clone(),
                    tat_ns: parse_ns(&v)?,
                })
            })
            .collect()
    }

    pub(crate) async fn load_tats(
        &self,
        namespace: &str,
        now_ns: i64,
    ) -> Result<Vec<Tat>, StoreError> {
        let head = format!("{}:{{{}:{}:", self.prefix, namespace.len(), namespace);
        let pattern = format!("{}*}}:gcra", glob_escape(&head));
        let hashes = self.scan(&pattern).await?;
        let mut conn = self.conn().await?;
        let mut out = Vec::new();
        for chunk in hashes.chunks(500) {
            let mut pipe = redis::pipe();
            for h in chunk {
                pipe.hget(h, "tat");
            }
            let replies: Vec<Option<String>> = pipe.query_async(&mut conn).await?;
            for (h, r) in chunk.iter().zip(replies) {
                let key = h.strip_prefix(&head).and_then(|r| r.strip_suffix("}:gcra"));
                if let (Some(key), Some(v)) = (key, r) {
                    let tat_ns = parse_ns(&v)?;
                    if tat_ns > now_ns {
                        out.push(Tat {
                            key: key.into(),
                            tat_ns,
                        });
                    }
                }
            }
        }
        Ok(out)
    }

    /// Empties the key's hashes, one per window size and its bucket, but for their push
    /// records.
    pub(crate) async fn reset(
        &self,
        namespace: &str,
        key: &str,
        window_sizes: &[u32],
    ) -> Result<(), StoreError> {
        // one hash tag: every key of the call is in one cluster slot
        let script = Script::new(RESET_LUA);
        let mut inv = script.prepare_invoke();
        inv.key(self.bucket_key(namespace, key));
        for s in window_sizes {
            inv.key(self.hash_key(namespace, key, *s));
        }
        let mut conn = self.conn().await?;
        let _: i64 = inv.invoke_async(&mut conn).await?;
        Ok(())
    }

    pub(crate) async fn read(
        &self,
        namespace: &str,
        keys: &[WindowKey],
    ) -> Result<Vec<Total>, StoreError> {
        let mut pipe = redis::pipe();
        for w in keys {
            pipe.hget(
                self.hash_key(namespace, &w.key, w.window_size),
                w.window_start,
            );
        }
        let mut conn = self.conn().await?;
        let replies: Vec<Option<String>> = pipe.query_async(&mut conn).await?;
        keys.iter()
            .zip(replies)
            .filter_map(|(w, r)| r.map(|c| (w, c)))
            .map(|(w, c)| {
                Ok(Total {
                    key: w.key.clone(),
                    window_size: w.window_size,
                    window_start: w.window_start,
                    count: parse(&c)?,
                })
            })
            .collect()
    }

    /// Warm-up scans for the namespace's hashes: Redis keeps no per-namespace index
    /// (it would be one hot key per namespace), so this walks the keyspace once, at start.
    pub(crate) async fn load_namespace(
        &self,
        namespace: &str,
        windows: &[(u32, i64)],
    ) -> Result<Vec<Total>, StoreError> {
        let head = format!("{}:{{{}:{}:", self.prefix, namespace.len(), namespace);
        let pattern = format!("{}*", glob_escape(&head));
        let mut conn = self.conn().await?;
        let mut out = Vec::new();
        for hash in self.scan(&pattern).await? {
            let Some((key, size)) = parse_hash_key(&hash, &head) else {
                continue;
            };
            let Some(&(_, oldest)) = windows.iter().find(|(s, _)| *s == size) else {
                continue;
            };
            let fields: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(&hash)
                .query_async(&mut conn)
                .await?;
            for (f, v) in fields {
                let Ok(start) = f.parse::<i64>() else {
                    continue;
                };
                if start >= oldest {
                    out.push(Total {
                        key: key.into(),
                        window_size: size,
                        window_start: start,
                        count: parse(&v)?,
                    });
                }
            }
        }
        Ok(out)
    }

    /// Every key matching `pattern`, walking the keyspace with SCAN (never KEYS).
    async fn scan(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        let mut conn = self.conn().await?;
        let mut cursor: u64 = 0;
        let mut keys = Vec::new();
        loop {
            let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            keys.extend(found);
            cursor = next;
            if cursor == 0 {
                return Ok(keys);
            }
        }
    }

    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
    }

    /// Deletes every key under this store's prefix (tests clean up with it).
    pub async fn delete_prefix(&self) -> Result<u64, StoreError> {
        let keys = self
            .scan(&format!("{}:*", glob_escape(&self.prefix)))
            .await?;
        let mut conn = self.conn().await?;
        let mut deleted = 0;
        for chunk in keys.chunks(500) {
            let n: u64 = redis::cmd("DEL").arg(chunk).query_async(&mut conn).await?;
            deleted += n;
        }
        Ok(deleted)
    }
}

/// The script calls for a batch of hashes: the hashes of each cluster slot (a script may
/// not cross slots), at most HASHES_PER_CALL per call. A pure function of the batch, so a
/// retried push makes the same calls and finds its seq records where it left them.
fn slot_calls(hashes: &[&str]) -> Vec<Vec<usize>> {
    let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
    for (i, h) in hashes.iter().enumerate() {
        by_slot.entry(key_slot(h.as_bytes())).or_default().push(i);
    }
    by_slot
        .values()
        .flat_map(|g| g.chunks(HASHES_PER_CALL).map(<[usize]>::to_vec))
        .collect()
}

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag — the part between
/// the first `{` and the next `}` when that part is not empty — or of the whole key.
fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % 16384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

fn parse(count: &str) -> Result<f64, StoreError> {
    count
        .parse::<f64>()
        .map_err(|_| StoreError::Protocol(format!("count {count:?} is not a number")))
}

fn parse_ns(v: &str) -> Result<i64, StoreError> {
    v.parse::<i64>()
        .map_err(|_| StoreError::Protocol(format!("TAT {v:?} is not an integer")))
}

/// `swin:{4:name:KEY}:60` → (`KEY`, 60), given the head `swin:{4:name:`.
fn parse_hash_key<'a>(hash: &'a str, head: &str) -> Option<(&'a str, u32)> {
    let rest = hash.strip_prefix(head)?;
    let (key, size) = rest.rsplit_once("}:")?;
    Some((key, size.parse().ok()?))
}

fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // vectors from the Redis Cluster specification and CLUSTER KEYSLOT
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        // an empty tag hashes the whole key
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    #[test]
    fn hash_keys_parse_back_even_with_braces_and_colons() {
        let head = "swin:{3:a:b:";
        assert_eq!(
            parse_hash_key("swin:{3:a:b:k}:x}:60", head),
            Some(("k}:x", 60))
        );
        assert_eq!(parse_hash_key("swin:{3:a:b:}:1", head), Some(("", 1)));
        assert_eq!(glob_escape("a*b[c]"), "a\\*b\\[c\\]");
    }
}
