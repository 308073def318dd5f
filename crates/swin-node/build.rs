//! `swin-node --version` names the commit it was built from: `SWIN_COMMIT` when the
//! build sets it (a package built outside a checkout), else `git rev-parse` of the
//! checkout, else "unknown".

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=SWIN_COMMIT");
    let commit = std::env::var("SWIN_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=SWIN_COMMIT={commit}");
}

/// The checkout's commit (12 digits), rebuilt when HEAD or the branch it names moves.
fn git_commit() -> Option<String> {
    let git = |args: &[&str]| {
        let out = Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let dir = git(&["rev-parse", "--absolute-git-dir"])?;
    println!("cargo:rerun-if-changed={dir}/HEAD");
    if git(&["symbolic-ref", "-q", "HEAD"]).is_some() {
        // a worktree's HEAD is its own; its branches are in the common directory, loose
        // (a file under refs/heads, watched as the directory: a commit may create it) or
        // packed. A path watched that does not exist reruns this script on every build
        // (a fresh clone has no packed-refs), so only what exists is watched.
        let common = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"])
            .unwrap_or_else(|| dir.clone());
        let heads = std::path::Path::new(&common).join("refs/heads");
        let packed = std::path::Path::new(&common).join("packed-refs");
        for path in [heads, packed] {
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    git(&["rev-parse", "--short=12", "HEAD"])
}
