//! What the store suites share: a faulty wrapper around a test's store. The stores
//! themselves are [`swin_testkit::TestStore`]s, one per test by
//! [`swin_testkit::for_stores!`].

#![allow(dead_code)]

use std::sync::Arc;

use swin_sync::store::FaultyStore;
use swin_sync::Store;

pub fn faulty(store: &Store) -> (Store, Arc<FaultyStore>) {
    let f = Arc::new(FaultyStore::new(store.clone()));
    (Store::Faulty(f.clone()), f)
}
