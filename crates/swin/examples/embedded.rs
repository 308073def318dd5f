//! Two limiters in one process share one limit through one store, with no daemon: each
//! is what a replica of a service would run in-process. A SQLite file by default;
//! Redis when `SWIN_REDIS_URL` is set (under a key prefix of this run's own).
//!
//! The namespace is synchronous (`sync_rate = 0`: every hit goes to the store and is
//! decided on the cluster's count), so the two share the limit of 10 exactly: the first
//! limiter spends 6, the second 4, and the next hit on either is denied.
//!
//! ```text
//! cargo run -p swin --example embedded
//! SWIN_REDIS_URL=redis://127.0.0.1:6379 cargo run -p swin --example embedded
//! ```

use swin::config::Config;
use swin::Limiter;

fn config(dir: &std::path::Path, store: &str) -> anyhow::Result<Config> {
    let text = format!(
        r#"
data_dir = "{data}"
shutdown_grace = 3

{store}

[[namespaces]]
name = "api"
store = "main"
window_sizes = [3600]
sync_rate = 0
limits = [{{ window_size = 3600, limit = 10 }}]
"#,
        data = dir.join("spool").display(),
    );
    Ok(Config::from_toml(&text)?)
}

/// A SQLite file in `dir`, or the Redis at `SWIN_REDIS_URL` (its keys lapse with their
/// window, an hour).
fn store_section(dir: &std::path::Path) -> String {
    match std::env::var("SWIN_REDIS_URL") {
        Ok(url) => format!(
            "[stores.main]\nkind = \"redis\"\nurl = \"{url}\"\nprefix = \"swin-example-{}\"",
            std::process::id()
        ),
        Err(_) => format!(
            "[stores.main]\nkind = \"sqlite\"\nurl = \"sqlite://{}\"",
            dir.join("counts.db").display()
        ),
    }
}

/// What the two limiters decided.
#[derive(Debug, PartialEq, Eq)]
pub struct Shared {
    /// Hits allowed on the first limiter (of 6) and on the second (of 4).
    pub allowed: [u32; 2],
    /// Whether the next hit, on each limiter, was allowed.
    pub next: [bool; 2],
    /// Whether another key, with a limit of its own, was allowed.
    pub other_key: bool,
}

/// Runs two limiters on the store `store` (a `[stores.main]` section) and spends one
/// key's limit across both; both stop with a last push.
pub async fn share_a_limit(dir: &std::path::Path, store: &str) -> anyhow::Result<Shared> {
    // two replicas of a service, each with its own limiter, one store between them
    let a = Limiter::start(config(dir, store)?).await?;
    let b = Limiter::start(config(dir, store)?).await?;
    let mut allowed = [0u32; 2];
    for (i, limiter, spend) in [(0, &a, 6), (1, &b, 4)] {
        for _ in 0..spend {
            if limiter.hit("api", "customer:7", 1.0).await?.allowed() {
                allowed[i] += 1;
            }
        }
    }
    let next = [
        a.hit("api", "customer:7", 1.0).await?.allowed(),
        b.hit("api", "customer:7", 1.0).await?.allowed(),
    ];
    // another customer has a limit of its own
    let other_key = b.hit("api", "customer:8", 1.0).await?.allowed();
    a.stop().await?;
    b.stop().await?;
    Ok(Shared {
        allowed,
        next,
        other_key,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let shared = share_a_limit(dir.path(), &store_section(dir.path())).await?;
    println!(
        "first limiter: {} of 6 allowed; second: {} of 4; the next hit on each: {:?}; another key: {}",
        shared.allowed[0],
        shared.allowed[1],
        shared.next.map(|a| if a { "allowed" } else { "denied" }),
        if shared.other_key { "allowed" } else { "denied" },
    );
    anyhow::ensure!(
        shared.allowed == [6, 4] && shared.next == [false, false] && shared.other_key,
        "the two limiters did not share the limit"
    );
    println!("shared: 10 of 10 across both, none more");
    Ok(())
}
