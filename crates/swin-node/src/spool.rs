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

const VERSION: u32 = 1;
const PREFIX: &str = "spool-";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpoolEntry {
    /// The store's name in the config.
    pub store: String,
    /// [`crate::config::StoreConfig::fingerprint`] of that store.
    pub store_fingerprint: String,
    pub unconfirmed: Unconfirmed,
}

#[derive(Debug, Serialize, Deserialize)]
struct SpoolFile {
    version: u32,
    entries: Vec<SpoolEntry>,
}

/// Writes `entries` to a new spool file in `dir` (created when missing) and makes it
/// durable before returning its path.
pub fn write(dir: &Path, entries: &[SpoolEntry]) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
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
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&body)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(path)
}

/// Every spool file in `dir`, oldest first, each with its entries or why it cannot be
/// read (such a file is left where it is).
pub fn read_all(dir: &Path) -> Vec<(PathBuf, Result<Vec<SpoolEntry>, String>)> {
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
        .into_iter()
        .map(|p| {
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

#[cfg(test)]
mod tests {
    use super::*;
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
                    },
                    Chunk {
                        seq: 4,
                        rows: Rows::Advances {
                            now_ns: 7,
                            advances: vec![("g".into(), -5)],
                        },
                    },
                ]
                .into(),
            },
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
