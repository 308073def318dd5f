//! The Debian package's parts, checked without installing it (`scripts/package-check`
//! installs, runs, reloads and purges the built package as root): the packaged config
//! checks, the systemd unit verifies with systemd's own analyzer and its sandboxing
//! rates well, the unit reloads with SIGHUP and waits longer than the node's stop, and
//! `--version` names the version and the commit. The container image (`scripts/image`,
//! holding this build's swin-node) runs with podman against the host's Redis: it
//! decides, reloads on SIGHUP, and stops on SIGTERM with its last push.

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

/// `swin-node check-config` passes the file at `path`.
fn assert_config_checks(path: &Path) {
    let out = node()
        .args(["check-config", "--config"])
        .arg(path)
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
    // what the image holds: a non-root user, its config, nothing else to start
    let user = podman_ok(&["image", "inspect", "--format", "{{.Config.User}}", &tag]);
    assert_eq!(user, "10001:10001");
    let out = podman(&[
        "run",
        "--rm",
        "--network",
        "host",
        &tag,
        "check-config",
        "--config",
        "/etc/swin/swin.toml",
    ]);
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
/// Envoy's clusters name what the node and the Service serve.
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
    let bad = dir.path().join("deployment.yaml");
    let text = std::fs::read_to_string(repo("deploy/kubernetes/deployment.yaml")).expect("read");
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

    let deployment = of_kind(&docs, "Deployment", "swin");
    let pod = &deployment["spec"]["template"]["spec"];
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
    assert_eq!(
        container["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
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
    // the spool's directory is writable (a volume) under the read-only root
    let mounts = container["volumeMounts"].as_sequence().expect("mounts");
    assert!(mounts
        .iter()
        .any(|m| m["mountPath"].as_str() == toml["data_dir"].as_str()));

    // the Service serves both doors, and Envoy's clusters point at it
    let service = of_kind(&docs, "Service", "swin");
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
    let pdb = of_kind(&docs, "PodDisruptionBudget", "swin");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
}
