//! Random histories (`swin-histories`, `scripts/histories`) against this build: three
//! nodes, a nemesis, every request recorded and each mode's promise checked after the
//! nodes stopped cleanly and drained — exactly once per key, strict admission within its
//! limit, leases within theirs, answers that keep their word, replays under an
//! `Idempotency-Key` answering the first answer. Short runs here; `scripts/histories`
//! runs longer ones and soaks.

use swin_histories::nemesis::Fault;
use swin_histories::run::Options;
use swin_histories::setup::{Mode, StoreKind};
use swin_histories::shrink::run_and_shrink;

async fn clean(store: StoreKind, mode: Mode, faults: Vec<Fault>, seed: u64) {
    let out = tempfile::tempdir().expect("dir");
    let options = Options {
        store,
        mode,
        faults,
        seconds: 10,
        seed,
        nodes: 3,
        clients: 4,
        node_binary: env!("CARGO_BIN_EXE_swin-node").to_owned(),
        out: out.path().to_owned(),
        shrink_runs: 0,
    };
    assert!(
        run_and_shrink(&options).await,
        "violations: see the lines above"
    );
}

/// Synchronous on Redis, store replies lost after the store applied them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_seconds_of_lost_replies_on_redis_are_clean() {
    clean(StoreKind::Redis, Mode::Sync, vec![Fault::LostReply], 7).await;
}

/// Strict admission on PostgreSQL, replies lost, connections cut, a node killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_seconds_of_strict_admission_under_faults_on_postgres_are_clean() {
    let faults = vec![Fault::LostReply, Fault::Cut, Fault::Kill];
    clean(StoreKind::Postgres, Mode::Strict, faults, 11).await;
}
