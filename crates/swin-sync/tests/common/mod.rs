//! What the store suites share: a faulty wrapper around a test's store, and one test per
//! store for each scenario. The stores themselves are [`swin_testkit::TestStore`]s.

#![allow(dead_code)]

use std::sync::Arc;

use swin_sync::store::FaultyStore;
use swin_sync::Store;

pub fn faulty(store: &Store) -> (Store, Arc<FaultyStore>) {
    let f = Arc::new(FaultyStore::new(store.clone()));
    (Store::Faulty(f.clone()), f)
}

/// Generates one `#[tokio::test]` per store for each scenario `async fn name(&TestStore)`.
#[macro_export]
macro_rules! for_all_stores {
    ($($name:ident),* $(,)?) => {
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { let s = swin_testkit::TestStore::postgres().await; super::$name(&s).await; } )* }
        mod redis { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { let s = swin_testkit::TestStore::redis(); super::$name(&s).await; } )* }
        mod redis_cluster { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { let s = swin_testkit::TestStore::redis_cluster(); super::$name(&s).await; } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { let s = swin_testkit::TestStore::sqlite().await; super::$name(&s).await; } )* }
    };
}
