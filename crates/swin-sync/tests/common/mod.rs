//! Isolated stores for tests: a fresh PostgreSQL database, a Redis key prefix or a
//! SQLite file per test, removed again when the test ends (even when it fails).

#![allow(dead_code)]

use std::sync::Arc;

use swin_sync::store::{FaultyStore, PostgresStore, RedisStore, SqliteStore};
use swin_sync::Store;
use swin_testkit::TestDatabase;

/// A store for one test and whatever removes it afterwards.
pub struct TestStore {
    pub store: Store,
    pub url: String,
    _cleanup: Cleanup,
}

enum Cleanup {
    Postgres(TestDatabase),
    Redis(RedisStore),
    Sqlite(tempfile::TempDir),
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Cleanup::Redis(r) = self {
            let r = r.clone();
            // Drop cannot await: delete the test's keys on a runtime of its own.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async { r.delete_prefix().await })
            })
            .join();
        }
    }
}

pub async fn postgres() -> TestStore {
    let db = TestDatabase::create().await;
    let store = Store::Postgres(PostgresStore::new(&db.url, 8).expect("pool"));
    store.migrate().await.expect("migrate");
    TestStore {
        store,
        url: db.url.clone(),
        _cleanup: Cleanup::Postgres(db),
    }
}

pub async fn redis() -> TestStore {
    let url = swin_testkit::redis_url();
    let prefix = swin_testkit::unique("swin-test");
    let r =
        RedisStore::new(&url, &prefix).expect("connect to the test Redis (scripts/test starts it)");
    TestStore {
        store: Store::Redis(r.clone()),
        url,
        _cleanup: Cleanup::Redis(r),
    }
}

pub async fn sqlite() -> TestStore {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("swin.db").display());
    let store = Store::Sqlite(SqliteStore::connect(&url).await.expect("open sqlite"));
    store.migrate().await.expect("migrate");
    TestStore {
        store,
        url,
        _cleanup: Cleanup::Sqlite(dir),
    }
}

pub fn faulty(store: &Store) -> (Store, Arc<FaultyStore>) {
    let f = Arc::new(FaultyStore::new(store.clone()));
    (Store::Faulty(f.clone()), f)
}

/// Generates one `#[tokio::test]` per store for each scenario `async fn name(&TestStore)`.
#[macro_export]
macro_rules! for_all_stores {
    ($($name:ident),* $(,)?) => {
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { let s = $crate::common::postgres().await; super::$name(&s).await; } )* }
        mod redis { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { let s = $crate::common::redis().await; super::$name(&s).await; } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { let s = $crate::common::sqlite().await; super::$name(&s).await; } )* }
    };
}
