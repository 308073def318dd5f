//! A change whose every reply is lost, then a reload that retires its namespace's
//! version: what the node owed the store goes on being owed. A namespace rebuilt on the
//! same store takes it over; one removed (or moved to another store) leaves it to the
//! stop; either way the stop spools it (exit 0: nothing dropped) and the next start
//! settles it once, with the store's exact count.

use swin_testkit::cluster::TestStore;

use super::lost_replies::a_commit_unresolved_at_a_stop;
use super::support::{applied, increment, node_in};

/// A reload to the config `reload` makes of the running one, applied once the first
/// namespace listed shows `field` = `value`.
async fn reloaded(
    dir: &std::path::Path,
    first: &str,
    node: &swin_testkit::cluster::Node,
    reload: impl Fn(&str) -> String,
    field: &str,
    value: serde_json::Value,
) {
    std::fs::write(dir.join("swin.toml"), reload(first)).expect("write config");
    node.signal("HUP");
    applied(&reqwest::Client::new(), &node.base, field, value).await;
}

/// Rebuilt on the same store (a new `sync_rate`): the new version owes what the old one
/// did (it owed nothing: the stop spooled nothing, and the store kept the reservation's
/// total).
async fn a_commit_unresolved_across_a_rebuild_is_settled_once_by_the_next_start(store: &TestStore) {
    let reload = |first: &str| first.replacen("sync_rate = 0.2", "sync_rate = 0.3", 1);
    a_commit_unresolved_at_a_stop(
        store,
        async |dir, first, node| reloaded(dir, first, node, reload, "sync_rate", 0.3.into()).await,
        async |_, _| {},
    )
    .await;
}

/// Removed by the reload: the stop spools what it owed (it was named nowhere, and the
/// store kept the reservation's total) in a file of its own, which a start without the
/// namespace leaves as it is (it serves, and replays the other files: a file holding it
/// beside another namespace's pushes would be left whole), and a start with it replays.
async fn a_commit_unresolved_when_its_namespace_is_removed_is_settled_by_the_next_start(
    store: &TestStore,
) {
    let reload = |first: &str| {
        let start = first
            .find("\n[[namespaces]]\nname = \"periodic\"")
            .expect("periodic");
        let end = first
            .find("\n[[namespaces]]\nname = \"sync\"")
            .expect("sync");
        format!("{}{}", &first[..start], &first[end..])
    };
    let spooled = |dir: &std::path::Path| {
        std::fs::read_dir(dir.join("data")).map_or(0, |d| {
            d.flatten()
                .filter(|f| f.file_name().to_string_lossy().starts_with("spool-"))
                .count()
        })
    };
    a_commit_unresolved_at_a_stop(
        store,
        async |dir, first, node| reloaded(dir, first, node, reload, "name", "sync".into()).await,
        async |dir, first| {
            let mut node = node_in(dir, &reload(first));
            // a start without the namespace serves
            increment(&reqwest::Client::new(), &node.base, "sync", "other", 2).await;
            assert_eq!(
                spooled(dir),
                1,
                "the retired namespace's file is left as it is"
            );
            assert!(node.terminate());
        },
    )
    .await;
}

swin_testkit::for_stores!([postgres, redis] [
    a_commit_unresolved_across_a_rebuild_is_settled_once_by_the_next_start,
    a_commit_unresolved_when_its_namespace_is_removed_is_settled_by_the_next_start,
]);
