//! The Redis store's calls: its scripts (kept in every server's cache, sent as
//! EVALSHA), a script invocation being built, and one command with the slot of its key.

use redis::{Cmd, Script};

/// The scripts every server keeps in its cache: pipelines send EVALSHA alone.
#[derive(Debug)]
pub(super) struct Scripts {
    pub(super) push: Script,
    pub(super) push_tats: Script,
    pub(super) reset: Script,
    pub(super) hold: Script,
    pub(super) grant: Script,
    pub(super) limit_put: Script,
    pub(super) limit_delete: Script,
    pub(super) limit_changes: Script,
    pub(super) lease_acquire: Script,
    pub(super) lease_change: Script,
    pub(super) lease_release_slots: Script,
    pub(super) idempotency_claim: Script,
    pub(super) idempotency_end: Script,
    pub(super) reservation: Script,
    /// Their sources, in that order, to load them.
    pub(super) sources: [&'static str; 14],
}

impl Scripts {
    /// The scripts, from their sources in the order of [`Scripts::sources`].
    pub(super) fn new(sources: [&'static str; 14]) -> Scripts {
        let [push, push_tats, reset, hold, grant, limit_put, limit_delete, limit_changes, lease_acquire, lease_change, lease_release_slots, idempotency_claim, idempotency_end, reservation] =
            sources.map(Script::new);
        Scripts {
            push,
            push_tats,
            reset,
            hold,
            grant,
            limit_put,
            limit_delete,
            limit_changes,
            lease_acquire,
            lease_change,
            lease_release_slots,
            idempotency_claim,
            idempotency_end,
            reservation,
            sources,
        }
    }
}

/// A script call being built: keys and arguments in any order, sent as EVALSHA.
#[derive(Debug, Default)]
pub(super) struct Eval {
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Eval {
    pub(super) fn key(&mut self, key: &str) -> &mut Self {
        self.keys.push(key.as_bytes().to_vec());
        self
    }

    pub(super) fn arg<T: redis::ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// The call, routed by its first key.
    pub(super) fn call(&self, script: &Script, write: bool) -> Call {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(self.keys.len());
        for k in &self.keys {
            cmd.arg(k.as_slice());
        }
        for a in &self.args {
            cmd.arg(a.as_slice());
        }
        Call {
            slot: self.keys.first().map_or(0, |k| super::keys::key_slot(k)),
            cmd,
            write,
        }
    }
}

/// One command of a store call, and the slot of the key it touches.
pub(super) struct Call {
    pub(super) slot: u16,
    pub(super) cmd: Cmd,
    /// Writes (a `WAIT` follows them when the store waits for replicas).
    pub(super) write: bool,
}

impl Call {
    /// A command on one key.
    pub(super) fn on(key: &str, cmd: Cmd, write: bool) -> Call {
        Call {
            slot: super::keys::key_slot(key.as_bytes()),
            cmd,
            write,
        }
    }
}
