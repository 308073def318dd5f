//! The Redis-protocol servers the store suites run against: Debian's Redis, Valkey 9 and
//! Redis 8 (the last two installed by `scripts/test` from PyPI, into a cache of its own).
//! Each has a shared server the tests write prefixed keys to, and a binary a test starts
//! servers of its own from (to stop and restart them).

use std::time::Duration;

use crate::{wait_for_port, ChildGuard};

/// Which Redis-protocol server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisServer {
    /// The distribution's redis-server (Redis 7 on Debian 12), on `PATH`.
    Redis,
    /// Valkey 9 (`SWIN_TEST_VALKEY_URL`, binary `SWIN_TEST_VALKEY_SERVER`).
    Valkey,
    /// Redis 8 (`SWIN_TEST_REDIS8_URL`, binary `SWIN_TEST_REDIS8_SERVER`).
    Redis8,
}

impl RedisServer {
    /// The name the store suites give it (`for_stores!`'s store names).
    pub fn name(self) -> &'static str {
        match self {
            RedisServer::Redis => "redis",
            RedisServer::Valkey => "valkey",
            RedisServer::Redis8 => "redis8",
        }
    }

    fn env_prefix(self) -> &'static str {
        match self {
            RedisServer::Redis => "SWIN_TEST_REDIS",
            RedisServer::Valkey => "SWIN_TEST_VALKEY",
            RedisServer::Redis8 => "SWIN_TEST_REDIS8",
        }
    }

    /// The shared server the tests may write prefixed keys to. Redis has a default (a
    /// local one on 6379); Valkey and Redis 8 have none: without the variable a test
    /// fails, it is never skipped.
    pub fn url(self) -> String {
        let var = format!("{}_URL", self.env_prefix());
        match (std::env::var(&var), self) {
            (Ok(url), _) => url,
            (Err(_), RedisServer::Redis) => "redis://127.0.0.1:6379".into(),
            (Err(_), _) => panic!("{var} is not set: scripts/test starts {self:?} and sets it"),
        }
    }

    /// The server binary a test starts servers of its own from.
    pub fn binary(self) -> String {
        let var = format!("{}_SERVER", self.env_prefix());
        match (std::env::var(&var), self) {
            (Ok(path), _) => path,
            (Err(_), RedisServer::Redis) => "redis-server".into(),
            (Err(_), _) => panic!("{var} is not set: scripts/test installs {self:?} and sets it"),
        }
    }

    /// Whether `info` (the server's `INFO server`) is this server's, with the major
    /// version the suites are meant for: Valkey reports `redis_version:7.2.4` beside its
    /// own `valkey_version`.
    pub fn is_this(self, info: &str) -> bool {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
                .map(str::to_owned)
        };
        let (redis, valkey) = (field("redis_version"), field("valkey_version"));
        match self {
            RedisServer::Redis => valkey.is_none() && redis.is_some(),
            RedisServer::Valkey => valkey.is_some_and(|v| v.starts_with("9.")),
            RedisServer::Redis8 => valkey.is_none() && redis.is_some_and(|v| v.starts_with("8.")),
        }
    }

    /// Panics unless the server at `url` is this one: a suite named for Valkey 9 never
    /// runs against another server by mistake.
    pub async fn check(self, url: &str) {
        let client = redis::Client::open(url).expect("redis url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("{self:?} at {url} does not answer: {e}"));
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .expect("INFO server");
        assert!(self.is_this(&info), "{url} is not {self:?}:\n{info}");
    }

    /// A server of the test's own on `port`, with an append-only file in `dir` so it
    /// keeps its data over a restart.
    pub fn start(self, port: u16, dir: &std::path::Path) -> ChildGuard {
        let binary = self.binary();
        let child = std::process::Command::new(&binary)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{binary} (scripts/test installs it): {e}"));
        let guard = ChildGuard(child);
        wait_for_port(port, Duration::from_secs(10));
        guard
    }
}

#[cfg(test)]
mod tests {
    use super::RedisServer;

    #[test]
    fn each_server_is_told_by_its_info() {
        let redis7 = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n";
        let valkey9 = "# Server\r\nredis_version:7.2.4\r\nvalkey_version:9.1.2\r\n";
        let redis8 = "# Server\r\nredis_version:8.2.3\r\nredis_mode:standalone\r\n";
        let valkey8 = "# Server\r\nredis_version:7.2.4\r\nvalkey_version:8.1.1\r\n";
        assert!(RedisServer::Redis.is_this(redis7));
        assert!(!RedisServer::Redis.is_this(valkey9));
        assert!(RedisServer::Valkey.is_this(valkey9));
        assert!(!RedisServer::Valkey.is_this(valkey8));
        assert!(!RedisServer::Valkey.is_this(redis8));
        assert!(RedisServer::Redis8.is_this(redis8));
        assert!(!RedisServer::Redis8.is_this(redis7));
        assert!(!RedisServer::Redis8.is_this(valkey9));
    }
}
