//! A local-only namespace's idempotency records, kept on this node, under the stores'
//! claim and lapse rules.

use std::collections::HashMap;
use std::sync::Mutex;

use swin_core::UnixMs;

use super::MemoryStore;
use crate::store::{Claim, Claimed, Fingerprint, IdempotencyStore, Record};
use crate::StoreError;

/// One record held on this node.
#[derive(Debug)]
struct LocalRecord {
    fingerprint: Fingerprint,
    token: i64,
    held_until: UnixMs,
    expires_at: UnixMs,
    answer: Option<Box<[u8]>>,
    /// The client it is counted for (taken over, it stays theirs), if one was named.
    client: Option<Box<str>>,
}

impl LocalRecord {
    /// What a claim finds: `None` when lapsed or held no longer (the claim takes it).
    fn live(&self, now: UnixMs) -> Option<Record> {
        if self.expires_at <= now {
            return None;
        }
        match &self.answer {
            Some(a) => Some(Record::Answered {
                fingerprint: self.fingerprint,
                answer: a.to_vec(),
            }),
            None if self.held_until > now => Some(Record::InFlight {
                fingerprint: self.fingerprint,
            }),
            None => None,
        }
    }
}

/// What the table holds.
#[derive(Debug, Default)]
struct Table {
    records: HashMap<Box<str>, LocalRecord>,
    /// Records held per client (its share's count; lapsed ones until swept).
    clients: HashMap<Box<str>, u64>,
    /// No record lapses before this (lapsed ones are swept only once one may have).
    earliest_lapse: Option<UnixMs>,
}

impl Table {
    /// Drops the lapsed records, if one may have lapsed.
    fn sweep(&mut self, now: UnixMs) {
        if self.earliest_lapse.is_none_or(|e| e > now) {
            return;
        }
        let clients = &mut self.clients;
        self.records.retain(|_, r| {
            let live = r.expires_at > now;
            if !live {
                uncount(clients, r.client.as_deref());
            }
            live
        });
        self.earliest_lapse = self.records.values().map(|r| r.expires_at).min();
    }

    /// Whether a new record of `c`'s client would pass its share.
    fn client_full(&self, c: &Claim<'_>) -> bool {
        c.client
            .is_some_and(|s| self.clients.get(s.client).copied().unwrap_or(0) >= s.max_records)
    }

    fn lapses_by(&mut self, at: UnixMs) {
        self.earliest_lapse = Some(self.earliest_lapse.map_or(at, |e| e.min(at)));
    }
}

/// Takes a record off its client's count.
fn uncount(clients: &mut HashMap<Box<str>, u64>, client: Option<&str>) {
    let Some(client) = client else { return };
    if let Some(n) = clients.get_mut(client) {
        *n -= 1;
        if *n == 0 {
            clients.remove(client);
        }
    }
}

/// A local-only namespace's idempotency records, under one lock (only requests that
/// carry an idempotency key come here). A new record past the claim's `max_records`
/// first sweeps the lapsed ones (only when one may have lapsed: a full table refuses
/// without walking it).
#[derive(Debug, Default)]
pub(super) struct Records {
    table: Mutex<Table>,
}

/// Bytes a record takes besides its key and answer: the map's entry (key pointer and
/// length, the record itself) and the allocations' headers.
pub const RECORD_OVERHEAD_BYTES: usize = 128;

impl Records {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records held (live or not yet swept).
    pub fn count(&self) -> usize {
        self.table().records.len()
    }

    /// The bytes its records take, as [`RECORD_OVERHEAD_BYTES`] counts them, with their
    /// keys, answers and clients' ids.
    pub fn bytes(&self) -> usize {
        let t = self.table();
        let entries: usize = t
            .records
            .iter()
            .map(|(k, r)| {
                RECORD_OVERHEAD_BYTES
                    + k.len()
                    + r.answer.as_ref().map_or(0, |a| a.len())
                    + r.client.as_ref().map_or(0, |c| c.len())
            })
            .sum();
        entries + t.records.capacity() * std::mem::size_of::<(Box<str>, LocalRecord)>() / 8
    }

    fn claim(&self, c: &Claim<'_>) -> Claimed {
        let mut t = self.table();
        if let Some(r) = t.records.get_mut(c.key) {
            if let Some(found) = r.live(c.now) {
                return Claimed::Found(found);
            }
            // lapsed, or held no longer: taken over (counted already, for its client)
            let client = r.client.take();
            *r = LocalRecord {
                client,
                ..record(c)
            };
            t.lapses_by(c.expires_at);
            return Claimed::Mine;
        }
        if t.records.len() as u64 >= c.max_records || t.client_full(c) {
            t.sweep(c.now);
            if t.records.len() as u64 >= c.max_records {
                return Claimed::Full;
            }
            if t.client_full(c) {
                return Claimed::ClientFull;
            }
        }
        if let Some(s) = c.client {
            *t.clients.entry(s.client.into()).or_default() += 1;
        }
        t.records.insert(c.key.into(), record(c));
        t.lapses_by(c.expires_at);
        Claimed::Mine
    }

    fn end(&self, key: &str, token: i64, answer: Option<&[u8]>, now: UnixMs) -> bool {
        let mut t = self.table();
        let Some(r) = t.records.get_mut(key) else {
            return false;
        };
        if r.token != token || r.answer.is_some() || r.expires_at <= now {
            return false;
        }
        match answer {
            Some(a) => r.answer = Some(a.into()),
            None => {
                if let Some(gone) = t.records.remove(key) {
                    uncount(&mut t.clients, gone.client.as_deref());
                }
            }
        }
        true
    }
}

fn record(c: &Claim<'_>) -> LocalRecord {
    LocalRecord {
        fingerprint: *c.fingerprint,
        token: c.token,
        held_until: c.held_until,
        expires_at: c.expires_at,
        answer: None,
        client: c.client.map(|s| s.client.into()),
    }
}

impl IdempotencyStore for MemoryStore {
    async fn claim_idempotency(
        &self,
        _namespace: &str,
        c: Claim<'_>,
    ) -> Result<Claimed, StoreError> {
        Ok(self.records.claim(&c))
    }

    async fn keep_answer(
        &self,
        _namespace: &str,
        key: &str,
        token: i64,
        answer: &[u8],
        now: UnixMs,
    ) -> Result<bool, StoreError> {
        Ok(self.records.end(key, token, Some(answer), now))
    }

    async fn release_claim(
        &self,
        _namespace: &str,
        key: &str,
        token: i64,
    ) -> Result<bool, StoreError> {
        Ok(self.records.end(key, token, None, UnixMs(i64::MIN)))
    }

    async fn idempotency_records(&self, _namespace: &str, now: UnixMs) -> Result<u64, StoreError> {
        let t = self.records.table();
        Ok(t.records.values().filter(|r| r.expires_at > now).count() as u64)
    }

    async fn purge_idempotency(&self, now: UnixMs) -> Result<u64, StoreError> {
        let mut t = self.records.table();
        let before = t.records.len();
        t.earliest_lapse = Some(now);
        t.sweep(now);
        Ok((before - t.records.len()) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ClientShare;

    fn claim<'a>(key: &'a str, f: &'a Fingerprint, token: i64, now: i64, max: u64) -> Claim<'a> {
        Claim {
            key,
            fingerprint: f,
            token,
            held_until: UnixMs(now + 100),
            expires_at: UnixMs(now + 1_000),
            now: UnixMs(now),
            max_records: max,
            client: None,
        }
    }

    #[test]
    fn a_record_is_claimed_once_answered_again_and_bounded() {
        let t = Records::default();
        let f = Fingerprint([7; 32]);
        assert_eq!(t.claim(&claim("a", &f, 1, 0, 2)), Claimed::Mine);
        assert_eq!(
            t.claim(&claim("a", &f, 2, 10, 2)),
            Claimed::Found(Record::InFlight { fingerprint: f })
        );
        assert!(!t.end("a", 2, Some(b"x"), UnixMs(10)), "not its claim");
        assert!(t.end("a", 1, Some(b"x"), UnixMs(10)));
        assert!(!t.end("a", 1, Some(b"y"), UnixMs(10)), "answered once");
        assert_eq!(
            t.claim(&claim("a", &f, 3, 20, 2)),
            Claimed::Found(Record::Answered {
                fingerprint: f,
                answer: b"x".to_vec()
            })
        );
        assert_eq!(t.claim(&claim("b", &f, 4, 20, 2)), Claimed::Mine);
        assert_eq!(t.claim(&claim("c", &f, 5, 20, 2)), Claimed::Full);
        // released: a retry runs again; b's claim held no longer: taken over
        assert!(t.end("b", 4, None, UnixMs(30)));
        assert_eq!(t.claim(&claim("c", &f, 6, 30, 2)), Claimed::Mine);
        assert_eq!(t.claim(&claim("c", &f, 7, 200, 2)), Claimed::Mine);
        // once a and c lapse, new keys fit again
        assert_eq!(t.claim(&claim("d", &f, 8, 1_100, 2)), Claimed::Mine);
        assert_eq!(t.count(), 2);
    }

    #[test]
    fn a_client_holds_its_share_and_others_still_claim() {
        let t = Records::default();
        let f = Fingerprint([7; 32]);
        let by = |key: &'static str, client: &'static str, token: i64, now: i64| Claim {
            client: Some(ClientShare {
                client,
                max_records: 2,
            }),
            ..claim(key, &f, token, now, 10)
        };
        assert_eq!(t.claim(&by("a", "x", 1, 0)), Claimed::Mine);
        assert_eq!(t.claim(&by("b", "x", 2, 0)), Claimed::Mine);
        assert_eq!(t.claim(&by("c", "x", 3, 0)), Claimed::ClientFull);
        assert_eq!(t.claim(&by("c", "y", 4, 0)), Claimed::Mine);
        // a release gives room back; a lapse too
        assert!(t.end("b", 2, None, UnixMs(0)));
        assert_eq!(t.claim(&by("d", "x", 5, 0)), Claimed::Mine);
        assert_eq!(t.claim(&by("e", "x", 6, 0)), Claimed::ClientFull);
        assert_eq!(t.claim(&by("e", "x", 7, 1_000)), Claimed::Mine);
        assert_eq!(t.table().clients.get("x"), Some(&1));
    }
}
