//! The Debian package's parts, checked without installing it (`scripts/package-check`
//! installs, runs, reloads and purges the built package as root): the packaged config
//! checks, the systemd unit verifies with systemd's own analyzer and its sandboxing
//! rates well, the unit reloads with SIGHUP and waits longer than the node's stop, and
//! `--version` names the version and the commit. The container image (`scripts/image`,
//! holding this build's swin-node) runs with podman against the host's Redis: it
//! decides, reloads on SIGHUP, and stops on SIGTERM with its last push; its shipped
//! config does not start without its tokens and refuses an unauthenticated client; and
//! what it spools on a volume while its store is away, a new container on that volume
//! pushes. The Kubernetes manifests validate and agree with each other and the node.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn node() -> Command {
    Command::new(env!("CARGO_BIN_EXE_swin-node"))
}

#[test]
fn version_names_the_version_and_the_commit() {
    let out = node().arg("--version").output().expect("run");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let want = format!("swin-node {} (commit ", env!("CARGO_PKG_VERSION"));
    let commit = text
        .trim()
        .strip_prefix(&want)
        .and_then(|c| c.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{text:?}"));
    // a build from a checkout knows its commit
    assert_eq!(commit.len(), 12, "{text:?}");
    assert!(commit.chars().all(|c| c.is_ascii_hexdigit()), "{text:?}");
}

/// The variables the shipped configs read their tokens from (`token_env`), and a
/// token for each.
const TOKENS: [(&str, &str); 3] = [
    ("SWIN_TOKEN_APP", "app-0123456789abcdef0123456789abcdef"),
    ("SWIN_TOKEN_OPS", "ops-0123456789abcdef0123456789abcdef"),
    ("SWIN_TOKEN_METRICS", "metrics-0123456789abcdef0123456789ab"),
];

/// `swin-node check-config` passes the file at `path`, the tokens in the environment.
fn assert_config_checks(path: &Path) {
    let out = node()
        .args(["check-config", "--config"])
        .arg(path)
        .envs(TOKENS)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_packaged_config_checks() {
    assert_config_checks(&repo("deploy/debian/swin.toml"));
    assert_config_checks(&repo("deploy/container/swin.toml"));
}

/// The `[auth]` tokens of a shipped config: each read from the environment (a secret),
/// none written in the file; the variables they name.
fn token_variables(config: &str) -> Vec<String> {
    let toml: toml::Value = config.parse().expect("toml");
    let tokens = toml["auth"]["tokens"].as_array().expect("[[auth.tokens]]");
    assert!(!tokens.is_empty());
    tokens
        .iter()
        .map(|t| {
            assert!(t.get("sha256").is_none(), "{t}: a token from a secret");
            t["token_env"].as_str().expect("token_env").to_owned()
        })
        .collect()
}

/// A config that listens beyond loopback carries `[auth]`, its tokens from the
/// environment: without them the node does not start, and says which is missing.
#[test]
fn the_shipped_configs_listening_beyond_loopback_need_their_tokens() {
    let container = repo("deploy/container/swin.toml");
    let text = std::fs::read_to_string(&container).expect("read");
    let vars = token_variables(&text);
    assert_eq!(vars, ["SWIN_TOKEN_APP", "SWIN_TOKEN_OPS"]);
    let out = node()
        .args(["check-config", "--config"])
        .arg(&container)
        .env_remove("SWIN_TOKEN_APP")
        .env_remove("SWIN_TOKEN_OPS")
        .output()
        .expect("run");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("auth.tokens[0].token_env") && said.contains("\"SWIN_TOKEN_APP\" is not set"),
        "{said}"
    );
    // the example Secret's placeholders are refused, naming the variable
    let out = node()
        .args(["check-config", "--config"])
        .arg(&container)
        .envs(TOKENS)
        .env("SWIN_TOKEN_OPS", "replace-me")
        .output()
        .expect("run");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("\"SWIN_TOKEN_OPS\" is 10 bytes"), "{said}");
}

/// The unit as systemd reads it: `systemd-analyze verify` (with the node's path made
/// this build's, the packaged one not being installed here) and the sandboxing's
/// exposure by `systemd-analyze security` (0 is the safest, 10 none).
#[test]
fn the_unit_verifies_and_is_sandboxed() {
    let unit = std::fs::read_to_string(repo("deploy/debian/swin-node.service")).expect("unit");
    for line in [
        "ExecStart=/usr/bin/swin-node --config /etc/swin/swin.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "User=swin",
        "StateDirectory=swin",
    ] {
        assert!(unit.lines().any(|l| l == line), "{line} in the unit");
    }
    // longer than the node's default shutdown_grace of 10 s, with room for the spool
    let stop: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .and_then(|v| v.parse().ok())
        .expect("TimeoutStopSec");
    assert!(stop > 10 + 5, "TimeoutStopSec={stop}");

    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin-node.service");
    std::fs::write(
        &path,
        unit.replace("/usr/bin/swin-node", env!("CARGO_BIN_EXE_swin-node")),
    )
    .expect("write");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian's systemd package)");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true"])
        .arg(&path)
        .output()
        .expect("systemd-analyze");
    let text = String::from_utf8_lossy(&out.stdout);
    let exposure: f64 = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(exposure <= 2.0, "exposure {exposure}:\n{text}");
}

/// `podman` with the settings `scripts/image` writes for this machine.
fn podman(args: &[&str]) -> std::process::Output {
    let out = Command::new(repo("scripts/image"))
        .arg("--env")
        .output()
        .expect("scripts/image --env");
    let env = String::from_utf8_lossy(&out.stdout).into_owned();
    let vars = env.lines().filter_map(|l| {
        let (k, v) = l.strip_prefix("export ")?.split_once('=')?;
        Some((k.to_owned(), v.to_owned()))
    });
    Command::new("podman")
        .envs(vars)
        .args(args)
        .output()
        .expect("podman (scripts/image installs it)")
}

fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// An image of the test's own (removed at the end), and a container of it.
struct Image(String);

impl Drop for Image {
    fn drop(&mut self) {
        podman(&["rm", "--force", "--ignore", &self.0]);
        podman(&["rmi", "--force", &self.0]);
    }
}

/// A podman volume of the test's own, removed at the end (after the containers using
/// it: declare it before them).
struct Volume(String);

impl Drop for Volume {
    fn drop(&mut self) {
        podman(&["volume", "rm", "--force", &self.0]);
    }
}

/// The image `scripts/image` builds with this build's swin-node, tagged for the test
/// `name`: its guard and its tag.
fn build_image(name: &str) -> (Image, String) {
    let tag = format!("localhost/{name}:test");
    let built = Command::new(repo("scripts/image"))
        .arg(&tag)
        .env("SWIN_IMAGE_BINARY", env!("CARGO_BIN_EXE_swin-node"))
        .output()
        .expect("scripts/image");
    let image = Image(tag.clone());
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    (image, tag)
}

/// `--env VAR=token` for each of [`TOKENS`].
fn token_args() -> Vec<String> {
    TOKENS
        .iter()
        .flat_map(|(k, v)| ["--env".to_owned(), format!("{k}={v}")])
        .collect()
}

/// What a container said, on both streams.
fn logs(container: &str) -> String {
    let out = podman(&["logs", container]);
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// `hits` hits on `key` of `namespace`: how many were allowed (200) and denied (429).
async fn hits(base: &str, namespace: &str, key: &str, hits: u32) -> (u32, u32) {
    let client = reqwest::Client::new();
    let (mut allowed, mut denied) = (0, 0);
    for _ in 0..hits {
        let status = client
            .post(format!("{base}/v1/namespaces/{namespace}/keys/{key}/hit"))
            .json(&serde_json::json!({}))
            .send()
            .await
            .expect("hit")
            .status();
        match status.as_u16() {
            200 => allowed += 1,
            429 => denied += 1,
            s => panic!("hit {namespace}/{key}: {s}"),
        }
    }
    (allowed, denied)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_decides_reloads_and_stops_with_its_last_push() {
    use swin_testkit::cluster::ClusterStore;
    use swin_testkit::TestStore;

    let name = swin_testkit::unique("swin-image-test");
    let (image, tag) = build_image(&name);
    // what the image holds: a non-root user, its config, nothing else to start
    let user = podman_ok(&["image", "inspect", "--format", "{{.Config.User}}", &tag]);
    assert_eq!(user, "10001:10001");
    let mut run = vec!["run", "--rm", "--network", "host"];
    let tokens = token_args();
    run.extend(tokens.iter().map(String::as_str));
    run.extend([
        tag.as_str(),
        "check-config",
        "--config",
        "/etc/swin/swin.toml",
    ]);
    let out = podman(&run);
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("ok"), "{said}");

    // the test's config, mounted over the image's, readable by its user
    let backend = TestStore::redis();
    let dir = tempfile::tempdir().expect("dir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let config = dir.path().join("swin.toml");
    let api = backend.config(0.1) + "limits = [{ window_size = 3600, limit = 100 }]\n";
    std::fs::write(&config, &api).expect("config");
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let port = swin_testkit::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mount = format!("{}:/etc/swin:ro", dir.path().display());
    let container = format!("{name}-node");
    let _running = Image(container.clone());
    podman_ok(&[
        "run",
        "--detach",
        "--name",
        &container,
        "--network",
        "host",
        "--volume",
        &mount,
        &tag,
        "--config",
        "/etc/swin/swin.toml",
        "--listen",
        &listen,
    ]);
    swin_testkit::wait_for_port(port, std::time::Duration::from_secs(30));
    let base = format!("http://{listen}");
    let health = reqwest::get(format!("{base}/healthz"))
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);

    // decides against the host's Redis: 100 of 130 allowed
    assert_eq!(hits(&base, "api", "shared", 130).await, (100, 30));

    // SIGHUP: a namespace added from the file, the counts kept
    let second = "\n[[namespaces]]\nname = \"second\"\nwindow_sizes = [3600]\nsync_rate = 0.1\nstore = \"main\"\nlimits = [{ window_size = 3600, limit = 10 }]\n";
    std::fs::write(&config, api.clone() + second).expect("config");
    podman_ok(&["kill", "--signal", "HUP", &container]);
    swin_testkit::wait_until(std::time::Duration::from_secs(15), "the reload", || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let out = podman(&["logs", &container]);
        String::from_utf8_lossy(&out.stderr).contains("config reloaded")
            || String::from_utf8_lossy(&out.stdout).contains("config reloaded")
    })
    .await;
    assert_eq!(hits(&base, "second", "k", 15).await, (10, 5));
    assert_eq!(
        hits(&base, "api", "shared", 1).await,
        (0, 1),
        "the count kept"
    );

    // SIGTERM (podman stop) right after the last hits: all of them in the store
    assert_eq!(hits(&base, "api", "last", 33).await, (33, 0));
    podman_ok(&["stop", "--time", "30", &container]);
    let code = podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", &container]);
    assert_eq!(
        code,
        "0",
        "{}",
        String::from_utf8_lossy(&podman(&["logs", &container]).stderr)
    );
    let api = backend.totals("api").await;
    assert_eq!(api.get("shared").copied(), Some(100.0));
    assert_eq!(api.get("last").copied(), Some(33.0));
    assert_eq!(backend.totals("second").await.get("k").copied(), Some(10.0));
    drop(image);
}

/// A redis-server of the test's own on a free port (one it can stop and start again,
/// its data kept), its files in `dir`.
struct OwnRedis {
    server: Option<swin_testkit::ChildGuard>,
    port: u16,
    dir: tempfile::TempDir,
}

impl OwnRedis {
    fn start() -> OwnRedis {
        let dir = tempfile::tempdir().expect("dir");
        let port = swin_testkit::free_port();
        let server = Some(swin_testkit::start_redis(port, dir.path()));
        OwnRedis { server, port, dir }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn stop(&mut self) {
        self.server.take().expect("running").kill();
    }

    fn restart(&mut self) {
        self.server = Some(swin_testkit::start_redis(self.port, self.dir.path()));
    }
}

/// The image with its own config: without its tokens it does not start and names the
/// variable; with them, a client without a token changes no limit and counts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_needs_its_tokens_and_refuses_a_client_without_one() {
    let name = swin_testkit::unique("swin-image-auth");
    let (_image, tag) = build_image(&name);
    let redis = OwnRedis::start();
    let store = format!("SWIN_STORE_MAIN_URL={}", redis.url());

    let out = podman(&["run", "--rm", "--network", "host", "--env", &store, &tag]);
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "started without tokens: {said}");
    assert!(
        said.contains("auth.tokens[0].token_env") && said.contains("\"SWIN_TOKEN_APP\" is not set"),
        "{said}"
    );

    let (port, grpc) = (swin_testkit::free_port(), swin_testkit::free_port());
    let listen = format!("SWIN_LISTEN=127.0.0.1:{port}");
    let grpc_listen = format!("SWIN_GRPC_LISTEN=127.0.0.1:{grpc}");
    let container = format!("{name}-node");
    let _running = Image(container.clone());
    let mut run = vec!["run", "--detach", "--name", &container, "--network", "host"];
    let tokens = token_args();
    run.extend(tokens.iter().map(String::as_str));
    run.extend([
        "--env",
        &store,
        "--env",
        &listen,
        "--env",
        &grpc_listen,
        &tag,
    ]);
    podman_ok(&run);
    swin_testkit::wait_for_port(port, std::time::Duration::from_secs(30));
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let limits = format!("{base}/v1/namespaces/api/keys/victim/limits");
    let change = serde_json::json!({"limits": [{"window_size": 60, "limit": 100000}]});
    let put = |token: Option<&str>| {
        let mut r = client.put(&limits).json(&change);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    let token = |var: &str| TOKENS.iter().find(|(k, _)| *k == var).expect("token").1;
    let status = |r: reqwest::Response| r.status().as_u16();
    assert_eq!(
        status(put(None).await.expect("put")),
        401,
        "{}",
        logs(&container)
    );
    assert_eq!(status(put(Some("not-a-token")).await.expect("put")), 401);
    assert_eq!(
        status(put(Some(token("SWIN_TOKEN_APP"))).await.expect("put")),
        403,
        "the app's token sets no limits"
    );
    assert_eq!(
        status(put(Some(token("SWIN_TOKEN_OPS"))).await.expect("put")),
        200
    );
    let hit = format!("{base}/v1/namespaces/api/keys/k/hit");
    let unauthenticated = client.post(&hit).json(&serde_json::json!({})).send();
    assert_eq!(status(unauthenticated.await.expect("hit")), 401);
    let hit = client
        .post(&hit)
        .bearer_auth(token("SWIN_TOKEN_APP"))
        .json(&serde_json::json!({}))
        .send();
    assert_eq!(status(hit.await.expect("hit")), 200);
    // the probes stay open
    let ready = client.get(format!("{base}/readyz?store=reached")).send();
    assert_eq!(status(ready.await.expect("readyz")), 200);
    podman_ok(&["stop", "--time", "30", &container]);
}

/// What a container spools on a volume at a stop while its store is away, a new
/// container on that volume pushes when the store is back: the store's totals are
/// exactly the hits acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_on_a_volume_is_pushed_by_the_next_container() {
    use std::os::unix::fs::PermissionsExt;
    use swin_testkit::cluster::TestStore;

    let name = swin_testkit::unique("swin-image-spool");
    let (_image, tag) = build_image(&name);
    let mut redis = OwnRedis::start();
    let backend = TestStore::redis_at(&redis.url(), &swin_testkit::unique("swin-spool"));
    // nothing reaches the store before the stop: a sync a minute, and a stop that gives
    // up on the store after 1 s
    let config = format!(
        "store_timeout = 1\nshutdown_grace = 5\n{}\n[[namespaces]]\nname = \"api\"\n\
         window_sizes = [3600]\nsync_rate = 60\nstore = \"main\"\n\
         limits = [{{ window_size = 3600, limit = 1000 }}]\n",
        backend.section()
    );
    let dir = tempfile::tempdir().expect("dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = dir.path().join("swin.toml");
    std::fs::write(&path, config).expect("config");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let mount = format!("{}:/etc/swin:ro", dir.path().display());
    let volume = Volume(format!("{name}-data"));
    podman_ok(&["volume", "create", &volume.0]);
    let data = format!("{}:/var/lib/swin", volume.0);
    let port = swin_testkit::free_port();
    let listen = format!("127.0.0.1:{port}");
    let base = format!("http://{listen}");
    let run = |container: &str| {
        podman_ok(&[
            "run",
            "--detach",
            "--name",
            container,
            "--network",
            "host",
            "--volume",
            &mount,
            "--volume",
            &data,
            &tag,
            "--config",
            "/etc/swin/swin.toml",
            "--listen",
            &listen,
        ]);
        swin_testkit::wait_for_port(port, std::time::Duration::from_secs(30));
    };
    let stop = |container: &str| {
        podman_ok(&["stop", "--time", "30", container]);
        let code = podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", container]);
        assert_eq!(code, "0", "{}", logs(container));
    };

    let first = format!("{name}-first");
    let _first = Image(first.clone());
    run(&first);
    const N: u32 = 57;
    assert_eq!(
        hits(&base, "api", "spooled", N).await,
        (N, 0),
        "acknowledged"
    );
    redis.stop(); // the outage
    stop(&first); // a rollout: its last push fails, what it counted goes to the volume
    let said = logs(&first);
    assert!(said.contains("spool"), "{said}");
    // on the volume, under the image's data_dir, private to the node's user
    let mountpoint = podman_ok(&[
        "volume",
        "inspect",
        "--format",
        "{{.Mountpoint}}",
        &volume.0,
    ]);
    let spool_dir = Path::new(&mountpoint).join("spool");
    let spooled: Vec<_> = std::fs::read_dir(&spool_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", spool_dir.display()))
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("spool-"))
        .collect();
    assert_eq!(spooled.len(), 1, "{said}");

    redis.restart();
    assert_eq!(
        backend.totals("api").await.get("spooled"),
        None,
        "nothing reached the store before the stop"
    );
    let second = format!("{name}-second");
    let _second = Image(second.clone());
    run(&second); // a new container on the same volume: the spool goes out before it serves
                  // read until it shows (the container logs its replay confirmed before it is ready, but
                  // this read may race the readiness wait on a loaded machine); never more than N
    let mut stored = None;
    for _ in 0..100 {
        stored = backend.totals("api").await.get("spooled").copied();
        if stored.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(stored, Some(f64::from(N)), "{}", logs(&second));
    // and counts on from there, the spool gone
    assert_eq!(hits(&base, "api", "spooled", 1).await, (1, 0));
    stop(&second);
    assert_eq!(
        backend.totals("api").await.get("spooled").copied(),
        Some(f64::from(N + 1)),
        "exactly the acknowledged hits"
    );
    let left = std::fs::read_dir(&spool_dir)
        .expect("spool dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("spool-"))
        .count();
    assert_eq!(left, 0, "the spool was pushed and removed");
}

/// `deploy/kubernetes/*.yaml`, each document parsed.
fn manifests() -> Vec<(PathBuf, serde_yaml_ng::Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo("deploy/kubernetes"))
        .expect("deploy/kubernetes")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read");
            let doc = serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{p:?}: {e}"));
            (p, doc)
        })
        .collect()
}

fn of_kind<'a>(
    docs: &'a [(PathBuf, serde_yaml_ng::Value)],
    kind: &str,
    name: &str,
) -> &'a serde_yaml_ng::Value {
    docs.iter()
        .map(|(_, d)| d)
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("a {kind} named {name}"))
}

/// `kubernetes-validate --strict` (the API's schemas, no cluster) on `files`.
fn validate(files: &[PathBuf]) -> std::process::Output {
    let validator = std::env::var("SWIN_KUBERNETES_VALIDATE")
        .expect("SWIN_KUBERNETES_VALIDATE (scripts/test installs kubernetes-validate)");
    Command::new(validator)
        .args(["--strict", "--no-warn"])
        .args(files)
        .output()
        .expect("kubernetes-validate")
}

/// Every manifest passes the Kubernetes API's schemas, strictly (an unknown field
/// fails: shown on a copy with one), and they agree with each other and with the node:
/// the ConfigMap's config checks, the pod outlasts `shutdown_grace`, probes, ports and
/// Envoy's clusters name what the node and the Service serve; the spool is on a claim
/// of each pod's own (a StatefulSet's `volumeClaimTemplates`); every token the config
/// reads comes from the Secret, and Envoy sends one.
#[test]
fn the_kubernetes_manifests_validate_and_agree() {
    let docs = manifests();
    let files: Vec<PathBuf> = docs.iter().map(|(p, _)| p.clone()).collect();
    let out = validate(&files);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // the validator fails on a field the API does not have
    let dir = tempfile::tempdir().expect("dir");
    let bad = dir.path().join("statefulset.yaml");
    let text = std::fs::read_to_string(repo("deploy/kubernetes/statefulset.yaml")).expect("read");
    std::fs::write(
        &bad,
        text.replacen("  replicas:", "  replicaz: 3\n  replicas:", 1),
    )
    .expect("write");
    let out = validate(&[bad]);
    assert!(!out.status.success(), "an unknown field passed");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("replicaz"),
        "{out:?}"
    );

    // the config the ConfigMap holds
    let config = of_kind(&docs, "ConfigMap", "swin")["data"]["swin.toml"]
        .as_str()
        .expect("swin.toml")
        .to_owned();
    let path = dir.path().join("swin.toml");
    std::fs::write(&path, &config).expect("write");
    assert_config_checks(&path);
    let toml: toml::Value = config.parse().expect("toml");
    let grace = toml["shutdown_grace"].as_integer().expect("shutdown_grace");
    let port = |key: &str| -> i64 {
        let listen = toml[key].as_str().expect(key);
        listen
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port")
    };

    let set = of_kind(&docs, "StatefulSet", "swin");
    let pod = &set["spec"]["template"]["spec"];
    let period = pod["terminationGracePeriodSeconds"]
        .as_i64()
        .expect("grace period");
    assert!(
        period > grace + 5,
        "terminationGracePeriodSeconds {period} vs shutdown_grace {grace}"
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    let container = &pod["containers"][0];
    assert_eq!(
        container["securityContext"]["readOnlyRootFilesystem"].as_bool(),
        Some(true)
    );
    // ready through a store outage once the store was reached (hostile::readiness)
    assert_eq!(
        container["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz?store=reached")
    );
    assert_eq!(
        container["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    assert!(container["resources"]["requests"]["cpu"].is_string());
    assert!(container["resources"]["limits"]["memory"].is_string());
    let container_port = |name: &str| {
        container["ports"]
            .as_sequence()
            .expect("ports")
            .iter()
            .find(|p| p["name"].as_str() == Some(name))
            .and_then(|p| p["containerPort"].as_i64())
            .unwrap_or_else(|| panic!("container port {name}"))
    };
    assert_eq!(container_port("http"), port("listen"));
    assert_eq!(container_port("grpc"), port("grpc_listen"));
    // the spool's directory is on a claim of the pod's own (it outlives the pod),
    // beneath the mount (the node makes it: a volume's root is not its user's), and the
    // image's SWIN_DATA_DIR, which overrides the file, is the same directory
    let env = |name: &str| {
        container["env"]
            .as_sequence()
            .expect("env")
            .iter()
            .find(|e| e["name"].as_str() == Some(name))
    };
    let data_dir = toml["data_dir"].as_str().expect("data_dir");
    assert!(env("SWIN_DATA_DIR").is_none(), "the image's SWIN_DATA_DIR");
    let containerfile =
        std::fs::read_to_string(repo("deploy/container/Containerfile")).expect("read");
    assert!(
        containerfile.contains(&format!("SWIN_DATA_DIR={data_dir} ")),
        "the image's SWIN_DATA_DIR is {data_dir}"
    );
    let claims = set["spec"]["volumeClaimTemplates"]
        .as_sequence()
        .expect("volumeClaimTemplates");
    let spool = container["volumeMounts"]
        .as_sequence()
        .expect("mounts")
        .iter()
        .find(|m| {
            let at = m["mountPath"].as_str().expect("mountPath");
            Path::new(data_dir).starts_with(at) && data_dir != at
        })
        .expect("a volume mounted above data_dir");
    let claim = claims
        .iter()
        .find(|c| c["metadata"]["name"] == spool["name"])
        .expect("the spool's volume is a claim template");
    assert_eq!(
        claim["spec"]["accessModes"][0].as_str(),
        Some("ReadWriteOnce")
    );
    assert!(pod["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .all(|v| v["name"] != spool["name"] && v.get("emptyDir").is_none()));
    assert_eq!(
        set["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"].as_str(),
        Some("Retain"),
        "a spool outlives a scale-down"
    );

    // every token the config reads is in the container's environment, from the Secret
    let secret = of_kind(&docs, "Secret", "swin-tokens");
    for var in token_variables(&config) {
        let from = &env(&var).unwrap_or_else(|| panic!("{var} in the container"))["valueFrom"]
            ["secretKeyRef"];
        assert_eq!(from["name"], secret["metadata"]["name"], "{var}");
        let key = from["key"].as_str().expect("key");
        assert!(
            secret["stringData"][key].is_string(),
            "{var}: {key} in the Secret"
        );
    }

    // the Service serves both doors, and Envoy's clusters point at it
    let service = of_kind(&docs, "Service", "swin");
    assert_eq!(set["spec"]["serviceName"], service["metadata"]["name"]);
    for (k, v) in service["spec"]["selector"].as_mapping().expect("selector") {
        assert_eq!(
            &set["spec"]["template"]["metadata"]["labels"][k], v,
            "{k:?}"
        );
    }
    let ports: Vec<(i64, &str)> = service["spec"]["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .map(|p| {
            (
                p["port"].as_i64().expect("port"),
                p["targetPort"].as_str().expect("target"),
            )
        })
        .collect();
    assert!(ports.contains(&(7070, "http")), "{ports:?}");
    let envoy: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        of_kind(&docs, "ConfigMap", "envoy-swin")["data"]["envoy.yaml"]
            .as_str()
            .expect("envoy.yaml"),
    )
    .expect("envoy.yaml");
    for cluster in ["swin_rls", "swin_rlqs"] {
        let c = envoy["static_resources"]["clusters"]
            .as_sequence()
            .expect("clusters")
            .iter()
            .find(|c| c["name"].as_str() == Some(cluster))
            .unwrap_or_else(|| panic!("cluster {cluster}"));
        let address = &c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            ["address"]["socket_address"];
        assert_eq!(
            address["address"].as_str(),
            service["metadata"]["name"].as_str()
        );
        let port = address["port_value"].as_i64().expect("port");
        assert!(
            ports.contains(&(port, "grpc")),
            "{cluster} on {port}: {ports:?}"
        );
    }
    // both of Envoy's calls carry a bearer token (swin's [auth] covers gRPC too)
    let bootstrap = of_kind(&docs, "ConfigMap", "envoy-swin")["data"]["envoy.yaml"]
        .as_str()
        .expect("envoy.yaml");
    assert_eq!(
        bootstrap
            .matches("- { key: authorization, value: \"Bearer ")
            .count(),
        2,
        "{bootstrap}"
    );
    let pdb = of_kind(&docs, "PodDisruptionBudget", "swin");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        set["spec"]["selector"]["matchLabels"]
    );
}
