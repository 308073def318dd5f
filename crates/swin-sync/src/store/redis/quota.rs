//! Strict admission on Redis: holds and grants, each run by its script on its item's
//! hash (see `hold.lua`, `grant.lua`), the share they may take passed in.

use super::calls::Eval;
use super::{parse, parse_ns, RedisStore};
use crate::store::{Grant, Granted, Held, Hold, QuotaStore};
use crate::StoreError;

impl QuotaStore for RedisStore {
    async fn hold(
        &self,
        namespace: &str,
        holder: &crate::Holder,
        holds: &[Hold],
    ) -> Result<Vec<Held>, StoreError> {
        let holder = holder.as_str();
        let hashes: Vec<String> = holds
            .iter()
            .map(|h| self.hash_key(namespace, &h.key, h.window_size))
            .collect();
        let share = swin_core::HOLD_SHARE.to_string();
        // holds carry no seq record (they are idempotent): on one server, any slots
        let states: Vec<(String, String, String)> = self
            .each_on_its_hash(
                &self.scripts.hold,
                &[holder, &share],
                &hashes,
                "hold",
                |i, inv| {
                    let h = &holds[i];
                    let size = i64::from(h.window_size);
                    let r = h.request;
                    inv.arg(h.window_start)
                        .arg(h.window_start - size)
                        .arg(h.window_start - 2 * size)
                        .arg(3 * size)
                        .arg(r.limit)
                        .arg(r.weight)
                        .arg(r.need)
                        .arg(r.want);
                },
            )
            .await?;
        states
            .into_iter()
            .map(|(current, previous, held)| {
                Ok(Held {
                    state: swin_core::HoldState {
                        current: parse(&current)?,
                        previous: parse(&previous)?,
                        held: parse(&held)?,
                    },
                })
            })
            .collect()
    }

    async fn grant(
        &self,
        namespace: &str,
        holder: &crate::Holder,
        grants: &[Grant],
    ) -> Result<Vec<Granted>, StoreError> {
        let holder = holder.as_str();
        let hashes: Vec<String> = grants
            .iter()
            .map(|r| self.bucket_key(namespace, &r.key))
            .collect();
        let share = swin_core::HOLD_SHARE.to_string();
        // grant requests are idempotent by their numbers: on one server, any slots
        let answers: Vec<(i64, String)> = self
            .each_on_its_hash(
                &self.scripts.grant,
                &[holder, &share],
                &hashes,
                "grant",
                |i, inv| {
                    let r = grants[i].request;
                    inv.arg(r.seq)
                        .arg(r.now_ns)
                        .arg(r.now_ns.saturating_add(r.horizon_ns.max(0)))
                        .arg(r.emission_ns)
                        .arg(r.burst)
                        .arg(r.need)
                        .arg(r.want);
                },
            )
            .await?;
        answers
            .into_iter()
            .map(|(granted, tat)| {
                let tat_ns = if tat.is_empty() {
                    None
                } else {
                    Some(parse_ns(&tat)?)
                };
                Ok(Granted { granted, tat_ns })
            })
            .collect()
    }
}

impl RedisStore {
    /// Strict admission's calls: `script` on each item's hash (`hashes[i]`), the
    /// `head` first in every call (the holder, the share), then each item's key and the arguments `args` adds;
    /// answers the script's reply for each item, in item order. The items carry no seq
    /// record (a repeated call leaves the same state), so on one server a call may
    /// cover any slots.
    async fn each_on_its_hash<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        head: &[&str],
        hashes: &[String],
        what: &str,
        args: impl Fn(usize, &mut Eval),
    ) -> Result<Vec<T>, StoreError> {
        let names: Vec<&str> = hashes.iter().map(String::as_str).collect();
        let calls = self.calls_for(&names, false);
        let mut sends = Vec::with_capacity(calls.len());
        for call in &calls {
            let mut inv = Eval::default();
            for a in head {
                inv.arg(*a);
            }
            for &i in call {
                inv.key(&hashes[i]);
                args(i, &mut inv);
            }
            sends.push(inv.call(script, true));
        }
        let replies: Vec<Vec<T>> = self.replies(sends).await?;
        let mut out: Vec<Option<T>> = std::iter::repeat_with(|| None).take(hashes.len()).collect();
        for (call, answers) in calls.iter().zip(replies) {
            if answers.len() != call.len() {
                return Err(StoreError::Protocol(format!(
                    "{what} script answered {} items of {}",
                    answers.len(),
                    call.len()
                )));
            }
            for (&i, answer) in call.iter().zip(answers) {
                out[i] = Some(answer);
            }
        }
        out.into_iter()
            .map(|a| {
                a.ok_or_else(|| StoreError::Protocol(format!("{what} script skipped an item")))
            })
            .collect()
    }
}
