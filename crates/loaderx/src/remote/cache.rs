//! An optional on-disk cache of remote objects, in fixed-size blocks.
//!
//! Blocks are files under `dir/<object key>/<block index>`, where the object
//! key is a hash of the object's URL, size and ETag as seen when its store
//! was opened: a replaced object (new ETag or size) never matches blocks of
//! the old one. Each object folder holds a `key` file with the unhashed key,
//! checked before use, so a hash collision is a miss, never wrong data.
//!
//! Several processes may share one cache: blocks are written to a temporary
//! file and renamed into place (a reader sees a whole block or none), a
//! block that vanishes between lookup and read is a miss, and eviction
//! (oldest blocks first, by modification time, which a hit refreshes) runs in
//! whichever process finds the cache over its limit. The limit is therefore
//! approximate by a few blocks per concurrently writing process.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use bytes::Bytes;

use crate::error::{Error, Result};

/// Environment variable naming the cache folder (storage option `cache_dir`).
pub const CACHE_DIR_ENV: &str = "LOADERX_CACHE_DIR";
/// Environment variable bounding the cache in bytes (storage option `cache_limit`).
pub const CACHE_LIMIT_ENV: &str = "LOADERX_CACHE_LIMIT";
/// Cache size when no limit is given: 10 GiB.
pub const DEFAULT_CACHE_LIMIT: u64 = 10 << 30;
/// Block size when none is given (storage option `cache_block_bytes`): 1 MiB.
pub const DEFAULT_CACHE_BLOCK: u64 = 1 << 20;

/// A block cache rooted at one folder.
#[derive(Debug)]
pub(crate) struct BlockCache {
    dir: PathBuf,
    limit: u64,
    block: u64,
    /// Bytes this process added since its last eviction scan.
    added: AtomicU64,
}

fn parse_bytes(key: &str, value: &str) -> Result<u64> {
    value.trim().parse::<u64>().map_err(|_| {
        Error::InvalidArgument(format!(
            "storage option {key:?} must be a number of bytes, got {value:?}"
        ))
    })
}

impl BlockCache {
    /// The cache `options` (or the environment) ask for, if any.
    pub(crate) fn from_options(options: &BTreeMap<String, String>) -> Result<Option<BlockCache>> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let Some(dir) = options
            .get("cache_dir")
            .cloned()
            .or_else(|| env(CACHE_DIR_ENV))
        else {
            return Ok(None);
        };
        let limit = match options
            .get("cache_limit")
            .cloned()
            .or_else(|| env(CACHE_LIMIT_ENV))
        {
            Some(v) => parse_bytes("cache_limit", &v)?,
            None => DEFAULT_CACHE_LIMIT,
        };
        let block = match options.get("cache_block_bytes") {
            Some(v) => parse_bytes("cache_block_bytes", v)?.max(4096),
            None => DEFAULT_CACHE_BLOCK,
        };
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating the cache folder {}", dir.display()), e))?;
        Ok(Some(BlockCache {
            dir,
            limit,
            block,
            added: AtomicU64::new(0),
        }))
    }

    /// Block size in bytes.
    pub(crate) fn block(&self) -> u64 {
        self.block
    }

    /// The folder of one object version, created with its `key` file.
    pub(crate) fn object_dir(&self, key: &str) -> Result<PathBuf> {
        // FNV-1a: stable across builds (std's hasher is not promised to be),
        // and the `key` file guards against its collisions.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in key.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        let dir = self.dir.join(format!("{h:016x}"));
        let key_file = dir.join("key");
        match std::fs::read(&key_file) {
            Ok(found) if found == key.as_bytes() => return Ok(dir),
            Ok(_) => {
                return Err(Error::State(format!(
                    "cache folder {} belongs to another object",
                    dir.display()
                )))
            }
            Err(_) => {}
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        write_atomic(&key_file, key.as_bytes())?;
        Ok(dir)
    }

    /// Block `index` of the object at `dir`, if cached (a hit refreshes its age).
    pub(crate) fn get(&self, dir: &Path, index: u64) -> Option<Bytes> {
        let path = dir.join(index.to_string());
        let bytes = std::fs::read(&path).ok()?;
        if let Ok(f) = std::fs::File::options().write(true).open(&path) {
            let _ = f.set_modified(SystemTime::now());
        }
        Some(Bytes::from(bytes))
    }

    /// Stores block `index` of the object at `dir`; a failure to cache is
    /// not an error for the read that fetched it.
    pub(crate) fn put(&self, dir: &Path, index: u64, bytes: &[u8]) {
        if write_atomic(&dir.join(index.to_string()), bytes).is_err() {
            return;
        }
        let added = self.added.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        // Scan now and then, not on every block: a scan lists the whole cache.
        if added + bytes.len() as u64 >= (self.limit / 16).max(self.block) {
            self.added.store(0, Ordering::Relaxed);
            self.evict();
        }
    }

    /// Removes the oldest blocks until the cache is within 90% of its limit.
    pub(crate) fn evict(&self) {
        let mut blocks: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        let Ok(objects) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for object in objects.flatten() {
            let Ok(files) = std::fs::read_dir(object.path()) else {
                continue;
            };
            for file in files.flatten() {
                let name = file.file_name();
                if name == "key" || name.to_string_lossy().starts_with('.') {
                    continue;
                }
                if let Ok(meta) = file.metadata() {
                    let when = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    blocks.push((when, meta.len(), file.path()));
                }
            }
        }
        let mut total: u64 = blocks.iter().map(|b| b.1).sum();
        if total <= self.limit {
            return;
        }
        blocks.sort();
        let target = self.limit / 10 * 9;
        for (_, len, path) in blocks {
            if total <= target {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

/// Writes `bytes` to `path` through a temporary file in the same folder.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().expect("cache files live in a folder");
    let mut tmp = tempfile::Builder::new()
        .prefix(".part-")
        .tempfile_in(dir)
        .map_err(|e| Error::io(format!("caching into {}", dir.display()), e))?;
    tmp.write_all(bytes)
        .map_err(|e| Error::io(format!("caching into {}", dir.display()), e))?;
    tmp.persist(path)
        .map_err(|e| Error::io(format!("caching {}", path.display()), e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(dir: &Path, limit: u64) -> BlockCache {
        let options: BTreeMap<String, String> = [
            ("cache_dir", dir.to_str().unwrap()),
            ("cache_limit", &limit.to_string()),
            ("cache_block_bytes", "4096"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        BlockCache::from_options(&options).unwrap().unwrap()
    }

    #[test]
    fn blocks_round_trip_per_object_version() {
        let tmp = tempfile::tempdir().unwrap();
        let c = cache(tmp.path(), 1 << 20);
        let v1 = c.object_dir("s3://b/k/data.zr|100|\"e1\"").unwrap();
        let v2 = c.object_dir("s3://b/k/data.zr|100|\"e2\"").unwrap();
        assert_ne!(v1, v2);
        assert!(c.get(&v1, 0).is_none());
        c.put(&v1, 0, b"abc");
        assert_eq!(c.get(&v1, 0).unwrap(), Bytes::from_static(b"abc"));
        assert!(
            c.get(&v2, 0).is_none(),
            "another version never sees the block"
        );
        // The folder's key guards against a collision.
        std::fs::write(v1.join("key"), b"something else").unwrap();
        assert!(c.object_dir("s3://b/k/data.zr|100|\"e1\"").is_err());
    }

    #[test]
    fn eviction_removes_the_oldest_blocks_first() {
        let tmp = tempfile::tempdir().unwrap();
        let c = cache(tmp.path(), 10_000);
        let d = c.object_dir("x").unwrap();
        let old = SystemTime::now() - std::time::Duration::from_secs(100);
        for i in 0..4u64 {
            write_atomic(&d.join(i.to_string()), &[i as u8; 3000]).unwrap();
            let when = old + std::time::Duration::from_secs(i);
            std::fs::File::options()
                .write(true)
                .open(d.join(i.to_string()))
                .unwrap()
                .set_modified(when)
                .unwrap();
        }
        // A hit makes block 0 the newest.
        assert!(c.get(&d, 0).is_some());
        c.evict();
        let left: Vec<bool> = (0..4).map(|i| d.join(i.to_string()).exists()).collect();
        assert_eq!(left, [true, false, true, true]);
        let e = BlockCache::from_options(
            &[
                ("cache_dir".to_string(), tmp.path().display().to_string()),
                ("cache_limit".to_string(), "lots".to_string()),
            ]
            .into_iter()
            .collect(),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("\"cache_limit\" must be a number of bytes"),
            "{e}"
        );
    }
}
