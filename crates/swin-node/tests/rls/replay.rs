//! envoyproxy/ratelimit's own test cases, replayed against node processes: the rule shapes
//! of its config and integration tests (`replay/rules/`, one namespace per domain), their
//! requests and expected answers asked by Python's grpcio (`replay/replay.py`, each case
//! named after the Go test), a reload that adds a domain and one that removes it; and the
//! files it refuses to load (`replay/refused/`), refused by `swin-node check-config` with
//! the reason named.

use super::*;

const REPLAY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/rls/replay");

/// The rule files (each `<domain>.yaml`) but the one the reload adds.
fn rule_files(with_reload: bool) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(format!("{REPLAY}/rules"))
        .expect("rules")
        .map(|e| e.expect("entry").path())
        .filter(|p| with_reload || p.file_stem().is_some_and(|s| s != "reload"))
        .collect();
    files.sort();
    files
}

/// The node's config: a namespace per rule file, counting as `mode` says.
fn config(store: &TestStore, sync_rate: f64, mode: &str, with_reload: bool) -> String {
    let mut out = format!("store_timeout = 1\n{}\n", store.section());
    for f in rule_files(with_reload) {
        let domain = f.file_stem().and_then(|s| s.to_str()).expect("name");
        out.push_str(&format!(
            "[[namespaces]]\nname = \"{domain}\"\nsync_rate = {sync_rate}\nstore = \"main\"\n\
             descriptors_file = \"{}\"\ncount_denied = {}\nenvoy_dynamic_metadata = true\n",
            f.display(),
            mode == "count_denied"
        ));
    }
    out
}

/// Runs one phase of the replay; its summary line.
async fn replay(grpc_port: u16, phase: &str, mode: &str) -> String {
    let ran = swin_testkit::python(
        &format!("{REPLAY}/replay.py"),
        [format!("127.0.0.1:{grpc_port}").as_str(), phase, mode],
    );
    let said = ran.said();
    assert!(ran.ok, "{phase}, {mode}:\n{said}");
    eprintln!("{phase}, {mode}: {said}");
    said.lines()
        .find(|l| l.starts_with("lookups:"))
        .expect("a summary")
        .to_owned()
}

/// The whole replay on one node: the start, a reload that adds the `reload` domain, a
/// reload that removes it.
async fn the_replay_agrees(store: TestStore, sync_rate: f64, mode: &str) {
    let dir = tempfile::tempdir().expect("dir");
    let mut run = start_with(dir, &config(&store, sync_rate, mode, false)).await;
    let path = run._dir.path().join("swin.toml");
    let rewrite = |with_reload: bool| {
        std::fs::write(
            &path,
            format!(
                "grpc_listen = \"127.0.0.1:{}\"\n{}",
                run.grpc_port,
                config(&store, sync_rate, mode, with_reload)
            ),
        )
        .expect("config");
    };
    let first = replay(run.grpc_port, "start", mode).await;
    assert!(first.ends_with(", 0 differ"), "{first}");
    rewrite(true);
    run.node.signal("HUP");
    replay(run.grpc_port, "reloaded", mode).await;
    rewrite(false);
    run.node.signal("HUP");
    replay(run.grpc_port, "removed", mode).await;
    assert!(run.node.terminate());
}

/// envoyproxy/ratelimit's default counting (every hit, denied or not) on its own store
/// (Redis), every hit to the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoyproxy_ratelimit_tests_replayed_counting_denied_hits_on_redis() {
    the_replay_agrees(TestStore::redis(), 0.0, "count_denied").await;
}

/// swin's default (a request over the limit counts nothing), whose answers are
/// envoyproxy/ratelimit's with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, syncing to
/// PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoyproxy_ratelimit_tests_replayed_all_or_nothing_on_postgres() {
    the_replay_agrees(TestStore::postgres().await, 0.5, "all_or_nothing").await;
}

/// The files envoyproxy/ratelimit's config tests expect it to refuse are refused, each
/// with its reason: the first line of each file says which test and what the error names.
#[test]
fn files_envoyproxy_ratelimit_refuses_are_refused_with_their_reason() {
    let dir = tempfile::tempdir().expect("dir");
    let mut refused = 0;
    let mut files: Vec<_> = std::fs::read_dir(format!("{REPLAY}/refused"))
        .expect("refused")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("file");
        let reason = text
            .lines()
            .next()
            .and_then(|l| l.split("refused: ").nth(1))
            .expect("a first line naming the reason")
            .trim();
        // the file under the name the reason may mention
        let yaml = dir.path().join("refused.yaml");
        std::fs::write(&yaml, &text).expect("yaml");
        let config = dir.path().join("swin.toml");
        std::fs::write(
            &config,
            format!(
                "[[namespaces]]\nname = \"refused\"\nsync_rate = -1\ndescriptors_file = \"{}\"\n",
                yaml.display()
            ),
        )
        .expect("config");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_swin-node"))
            .arg("check-config")
            .arg(&config)
            .output()
            .expect("check-config");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{} loaded", f.display());
        assert!(
            err.contains(reason),
            "{}: the error does not name {reason:?}: {err}",
            f.display()
        );
        refused += 1;
    }
    eprintln!("files refused as envoyproxy/ratelimit refuses them: {refused}");
    assert_eq!(refused, files.len());
    assert!(refused >= 13);
}
