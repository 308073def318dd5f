//! The Debian package's parts, checked without installing it (`scripts/package-check`
//! installs, runs, reloads and purges the built package as root): the packaged config
//! checks, the systemd unit verifies with systemd's own analyzer and its sandboxing
//! rates well, the unit reloads with SIGHUP and waits longer than the node's stop, and
//! `--version` names the version and the commit.

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

#[test]
fn the_packaged_config_checks() {
    let out = node()
        .args(["check-config", "--config"])
        .arg(repo("deploy/debian/swin.toml"))
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
