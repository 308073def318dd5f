//! The spool: what a node could not push before it stopped, on local disk under
//! `data_dir`, so that the next start sends it. Each entry keeps the push identity and
//! sequence numbers its chunks were first sent with, so a chunk whose push in fact
//! reached the store (only the reply was lost) is not applied twice.
//!
//! A file is written whole to a temporary name, fsynced, renamed into place and the
//! directory fsynced: after a crash there is either the whole file or none. It is deleted
//! only once every entry in it is confirmed. An entry names its store by config name and
//! by a fingerprint of the store's kind, URL and prefix: a node whose config has no store
//! with that fingerprint leaves the file alone rather than send counts to the wrong
//! place (nodes of different clusters may share a working directory).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use swin_sync::Unconfirmed;

use crate::unresolved::Owed;

const VERSION: u32 = 1;
const PREFIX: &str = "spool-";

/// What one stop left for one store: written to `data_dir`, pushed at the next start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SpoolEntry {
    /// The store's name in the config.
    pub(crate) store: String,
    /// [`crate::config::StoreConfig::fingerprint`] of that store.
    pub(crate) store_fingerprint: String,
    /// The diffs, advances and changes the store did not confirm.
    pub(crate) unconfirmed: Unconfirmed,
    /// Commits whose outcome the store did not tell before the stop: the next start
    /// asks again under each one's operation id and settles it if it ended the
    /// reservation (once).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) commits: Vec<crate::unresolved::OwedCommit>,
    /// Extends whose outcome the store did not tell before the stop: the next start
    /// asks again under each one's operation id, and gives its hits back if the
    /// reservation was no longer open for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) extends: Vec<crate::unresolved::OwedExtend>,
    /// Undos of reserves that answered an error, not done before the stop: the next
    /// start gives their estimates back (unless given back already) and ends their
    /// records.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) undos: Vec<crate::unresolved::OwedUndo>,
    /// Keys' settlements of ended reservations the store refused before the stop: the
    /// next start settles them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) settles: Vec<crate::unresolved::OwedSettle>,
    /// Give-backs waiting for their takes to land at the stop: the next start gives
    /// them back as the takes land, while their windows are counted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) give_backs: Vec<crate::unresolved::OwedGiveBack>,
}

impl SpoolEntry {
    /// What it spools that the node owed (every kind but pushes), oldest kind first.
    pub(crate) fn owed(&self) -> Vec<Owed> {
        let owed = self.commits.iter().cloned().map(Owed::Commit);
        let owed = owed.chain(self.extends.iter().cloned().map(Owed::Extend));
        let owed = owed.chain(self.undos.iter().cloned().map(Owed::Undo));
        let owed = owed.chain(self.settles.iter().cloned().map(Owed::Settle));
        owed.chain(self.give_backs.iter().cloned().map(Owed::GiveBack))
            .collect()
    }

    /// Adds `owed` to what it spools: false when it is not a kind a spool keeps (a step
    /// under way: [`Owed::Other`]).
    pub(crate) fn spool(&mut self, owed: Owed) -> bool {
        match owed {
            Owed::Commit(c) => self.commits.push(c),
            Owed::Extend(x) => self.extends.push(x),
            Owed::Undo(u) => self.undos.push(u),
            Owed::Settle(s) => self.settles.push(s),
            Owed::GiveBack(g) => self.give_backs.push(g),
            Owed::Other(_) => return false,
        }
        true
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct SpoolFile {
    version: u32,
    entries: Vec<SpoolEntry>,
}

/// Write probes made by this process (each `prepare` names its own).
static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Makes `dir` ready to take a spool, at start rather than at the stop that needs it: a
/// directory (made when missing) that only this user may enter (0700, tightened when
/// wider), where this node can write, and whose spool files only this user may read
/// (0600: they hold keys — client addresses, API keys).
pub(crate) fn prepare(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::other("not a directory"));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    // one name per call: limiters of one process may start at once on one dir
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = dir.join(format!(".probe-{}-{n}", std::process::id()));
    let file = match private_file(&probe) {
        // no live process holds this name (this one's pid, its own count): a probe a
        // crash left behind, by an earlier process of the same pid — in a container,
        // every start is pid 1. Removed (a link is removed, not what it points to), and
        // made again
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&probe)?;
            private_file(&probe)
        }
        made => made,
    };
    file?.write_all(b"probe")?;
    std::fs::remove_file(&probe)?;
    for entry in std::fs::read_dir(dir)?.filter_map(Result::ok) {
        let is_spool = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(PREFIX));
        // the entry itself, not what a link points to: a link named like a spool file
        // must not make this node change the mode of a file elsewhere
        if is_spool && entry.file_type()?.is_file() {
            let path = entry.path();
            if std::fs::metadata(&path)?.permissions().mode() & 0o077 != 0 {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            }
        }
    }
    Ok(())
}

/// A new file only this user may read and write.
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// Writes `entries` to a new spool file in `dir` (created when missing, 0700) and makes
/// it durable before returning its path (0600).
pub(crate) fn write(dir: &Path, entries: &[SpoolEntry]) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let name = format!(
        "{PREFIX}{}-{}-{:08x}.json",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis()),
        std::process::id(),
        rand_u32(),
    );
    let path = dir.join(&name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let body = serde_json::to_vec(&SpoolFile {
        version: VERSION,
        entries: entries.to_vec(),
    })
    .map_err(std::io::Error::other)?;
    {
        let mut f = private_file(&tmp)?;
        f.write_all(&body)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(path)
}

/// The spool files in `dir` (not read), oldest first.
pub fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = listing
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(PREFIX) && n.ends_with(".json"))
        })
        .collect();
    paths.sort();
    paths
}

/// Every spool file in `dir`, oldest first, each with its entries or why it cannot be
/// read (such a file is left where it is).
pub(crate) fn read_all(dir: &Path) -> Vec<(PathBuf, Result<Vec<SpoolEntry>, String>)> {
    let paths = files(dir);
    paths
        .into_iter()
        .map(|p| {
            let regular = std::fs::symlink_metadata(&p).map(|m| m.file_type().is_file());
            if !regular.unwrap_or(false) {
                let why = "not a regular file (a link, a directory): a node writes its spool files itself";
                return (p, Err(why.to_owned()));
            }
            let read = std::fs::read(&p)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<SpoolFile>(&b).map_err(|e| e.to_string()))
                .and_then(|f| match f.version {
                    VERSION => Ok(f.entries),
                    v => Err(format!("spool version {v} is not {VERSION}")),
                });
            (p, read)
        })
        .collect()
}

/// Why a spool entry cannot be replayed as it is, checked as a request would be: the
/// namespace is one of `namespaces` (those of this config on the entry's store), every
/// key is a key a request may count, every window a window (a size swin takes, a start
/// of such a window; the namespace may have changed its sizes since), every value
/// finite and below 2^53. A file is a node's own output, so a failed check means it was
/// damaged or edited: it is left alone.
pub(crate) fn check(entry: &SpoolEntry, namespaces: &[&str]) -> Result<(), String> {
    use swin_sync::Rows;
    let owed = entry.commits.iter().map(|c| ("commit", &c.namespace));
    let owed = owed.chain(entry.extends.iter().map(|x| ("extend", &x.namespace)));
    let owed = owed.chain(entry.undos.iter().map(|u| ("undo", &u.namespace)));
    let owed = owed.chain(entry.settles.iter().map(|s| ("settlement", &s.namespace)));
    let owed = owed.chain(entry.give_backs.iter().map(|g| ("give-back", &g.namespace)));
    for (what, namespace) in owed {
        if !namespaces.contains(&namespace.as_str()) {
            return Err(format!(
                "{what}'s namespace {namespace:?} is not one this config keeps on store {:?}",
                entry.store
            ));
        }
    }
    for u in &entry.undos {
        let key = u
            .keys
            .iter()
            .find_map(|k| crate::policy::input::check_key(k).err());
        if !swin_sync::store::is_op(&u.op) || !u.cost.is_finite() || u.cost < 0.0 || key.is_some() {
            return Err(format!(
                "an undo of reservation {:?} is not one a request could make",
                u.reservation
            ));
        }
    }
    for x in &entry.extends {
        let key = x
            .keys
            .iter()
            .find_map(|k| crate::policy::input::check_key(k).err());
        if swin_sync::store::extend_identity(&x.op).is_none()
            || !x.more.is_finite()
            || x.more < 0.0
            || key.is_some()
        {
            return Err(format!(
                "an extend of reservation {:?} is not one a request could make",
                x.reservation
            ));
        }
    }
    check_settlements(entry)?;
    let name = &entry.unconfirmed.namespace;
    if !namespaces.contains(&name.as_str()) {
        return Err(format!(
            "namespace {name:?} is not one this config keeps on store {:?}",
            entry.store
        ));
    };
    for chunk in &entry.unconfirmed.chunks {
        match &chunk.rows {
            Rows::Diffs(rows) => {
                for (key, size, start, value) in rows {
                    crate::policy::input::check_key(key).map_err(|e| format!("{name}: {e}"))?;
                    if swin_core::WindowSize::new(u64::from(*size)).is_err() {
                        return Err(format!("{name}: {size} is no window size"));
                    }
                    if start.rem_euclid(i64::from(*size)) != 0 {
                        return Err(format!(
                            "{name}: window start {start} is not a start of a {size} s window"
                        ));
                    }
                    swin_core::check_value(*value)
                        .map_err(|e| format!("{name}: key {key:?}: {e}"))?;
                }
            }
            Rows::Advances { advances, .. } => {
                for (key, _) in advances {
                    crate::policy::input::check_key(key).map_err(|e| format!("{name}: {e}"))?;
                }
            }
        }
    }
    Ok(())
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() as u32
}

/// The settlements and give-backs of `entry` are ones a commit could owe: keys a request
/// could name, amounts that are counts.
fn check_settlements(entry: &SpoolEntry) -> Result<(), String> {
    let amount = |v: f64| v.is_finite() && (0.0..=swin_core::MAX_COUNT).contains(&v);
    for s in &entry.settles {
        let counted = s.counted.iter().all(|&(_, v)| amount(v));
        if crate::policy::input::check_key(&s.key).is_err()
            || !amount(s.estimate)
            || !amount(s.cost)
            || !counted
        {
            return Err(format!(
                "a settlement of reservation {:?} is not one a commit could owe",
                s.reservation
            ));
        }
    }
    for g in &entry.give_backs {
        if crate::policy::input::check_key(&g.key).is_err()
            || !g.short.iter().all(|&(_, v)| amount(v))
        {
            return Err(format!(
                "a give-back of reservation {:?} is not one a commit could owe",
                g.reservation
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe a crash left (a node that died between making it and removing it, whose
    /// next start has the same pid: a container's pid 1) does not stop the start.
    #[test]
    fn a_probe_a_crash_left_does_not_stop_a_start() {
        let dir = tempfile::tempdir().expect("dir");
        let next = PROBES.load(std::sync::atomic::Ordering::Relaxed);
        let left = |n: u64| {
            dir.path()
                .join(format!(".probe-{}-{n}", std::process::id()))
        };
        // the names the next calls of this process take (the test beside takes 800)
        for n in next..next + 2_000 {
            std::fs::write(left(n), "probe").expect("left");
        }
        prepare(dir.path()).expect("prepared over a probe left behind");
    }

    /// Limiters of one process starting at once on one `data_dir` each get it ready (its
    /// write probe was named by the process alone: the second found the first's file).
    #[test]
    fn limiters_of_one_process_prepare_one_dir_at_once() {
        let dir = tempfile::tempdir().expect("dir");
        std::thread::scope(|s| {
            let starts: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..200).try_for_each(|_| prepare(dir.path()))))
                .collect();
            for start in starts {
                start.join().expect("thread").expect("prepared");
            }
        });
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
    }

    /// A link or a directory named like a spool file is left as it is: its target's
    /// mode is not changed (a link to any file would have the node chmod it), and it is
    /// not read as a spool.
    #[test]
    fn what_is_named_like_a_spool_but_is_no_file_is_left_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let outside = tempfile::tempdir().expect("outside");
        let victim = outside.path().join("victim.txt");
        std::fs::write(&victim, "{}").expect("write");
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).expect("mode");
        let link = dir.path().join("spool-1-1-link.json");
        std::os::unix::fs::symlink(&victim, &link).expect("link");
        let sub = dir.path().join("spool-2-2-dir.json");
        std::fs::create_dir(&sub).expect("dir");
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755)).expect("mode");
        prepare(dir.path()).expect("prepare");
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&victim), 0o644, "a link's target keeps its mode");
        assert_eq!(mode(&sub), 0o755, "a directory keeps its mode");
        let read = read_all(dir.path());
        assert_eq!(read.len(), 2);
        assert!(read.iter().all(|(_, r)| r.is_err()), "{read:?}");
    }
    use swin_sync::{Chunk, Rows};

    #[test]
    fn entries_round_trip_through_a_file() {
        let dir = tempfile::tempdir().expect("dir");
        let entry = SpoolEntry {
            store: "main".into(),
            store_fingerprint: "abc".into(),
            unconfirmed: Unconfirmed {
                namespace: "api".into(),
                push_id: "1-ff.2".into(),
                chunks: vec![
                    Chunk {
                        seq: 3,
                        rows: Rows::Diffs(vec![("k\u{0}ey".into(), 60, 120, 2.5)]),
                        push_id: Some("1-ff.2~s".into()),
                    },
                    Chunk {
                        seq: 4,
                        rows: Rows::Advances {
                            now_ns: 7,
                            advances: vec![("g".into(), -5)],
                        },
                        push_id: None,
                    },
                ]
                .into(),
            },
            commits: vec![crate::unresolved::OwedCommit {
                namespace: "api".into(),
                reservation: "0123456789abcdef0123456789abcdef".into(),
                op: "00000000000000ff".into(),
                cost: 81.5,
            }],
            extends: vec![crate::unresolved::OwedExtend {
                namespace: "api".into(),
                reservation: "0123456789abcdef0123456789abcdef".into(),
                keys: vec!["k".into(), "user:7 ✓".into()],
                op: "00000000000000fe".into(),
                more: 12.25,
                at: 1_800_000_000_000,
            }],
            undos: vec![crate::unresolved::OwedUndo {
                namespace: "api".into(),
                reservation: "fedcba9876543210fedcba9876543210".into(),
                keys: vec!["k".into()],
                cost: 40.0,
                at: 1_800_000_000_000,
                lapse: 1_800_000_030_000,
                op: "00000000000000fd".into(),
                given_back: true,
            }],
            settles: vec![crate::unresolved::OwedSettle {
                namespace: "api".into(),
                reservation: "fedcba9876543210fedcba9876543211".into(),
                key: "k".into(),
                capped: true,
                estimate: 40.0,
                counted: vec![(1_800_000_000_000, 40.0)],
                cost: 12.5,
            }],
            give_backs: vec![crate::unresolved::OwedGiveBack {
                namespace: "api".into(),
                reservation: "fedcba9876543210fedcba9876543212".into(),
                key: "user:7 ✓".into(),
                short: vec![(1_800_000_000_000, 7.5)],
            }],
        };
        let path = write(dir.path(), std::slice::from_ref(&entry)).expect("write");
        std::fs::write(dir.path().join("spool-bad.json"), "{").expect("write");
        std::fs::write(dir.path().join("other.json"), "{}").expect("write");
        let read = read_all(dir.path());
        assert_eq!(read.len(), 2, "{read:?}");
        let ok: Vec<_> = read.iter().filter(|(_, r)| r.is_ok()).collect();
        assert_eq!(ok.len(), 1);
        assert_eq!(ok[0].0, path);
        assert_eq!(ok[0].1.as_ref().expect("entries"), &vec![entry]);
    }
}
