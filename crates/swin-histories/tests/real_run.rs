//! One short real run: three nodes on Redis, synchronous, replies lost after the store
//! applied them, 10 s; it must come out clean. The node binary is
//! `SWIN_TEST_NODE_BINARY`, else the workspace's release build, else its debug build.

use std::path::PathBuf;

use swin_histories::nemesis::Fault;
use swin_histories::run::{run, Options};
use swin_histories::setup::{Mode, StoreKind};

fn node_binary() -> String {
    if let Ok(b) = std::env::var("SWIN_TEST_NODE_BINARY") {
        return b;
    }
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target");
    ["release", "debug"]
        .iter()
        .map(|p| target.join(p).join("swin-node"))
        .find(|p| p.exists())
        .expect("a swin-node build: cargo build --release -p swin-node (or SWIN_TEST_NODE_BINARY)")
        .display()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_seconds_of_lost_replies_on_redis_are_clean() {
    let out = tempfile::tempdir().expect("dir");
    let options = Options {
        store: StoreKind::Redis,
        mode: Mode::Sync,
        faults: vec![Fault::LostReply],
        seconds: 10,
        seed: 7,
        nodes: 3,
        clients: 4,
        node_binary: node_binary(),
        out: out.path().to_owned(),
    };
    assert!(run(&options).await, "violations: see the lines above");
}
