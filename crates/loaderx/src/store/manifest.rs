//! The manifest of a store set: `manifest.json` at the set's root.
//!
//! A store set is a folder (or object-storage prefix) of ordinary stores
//! (shards) of one kind, dtype, item shape and codec, read as one store whose
//! record `i` is record `i - start(s)` of shard `s`. The manifest lists the
//! shards in order with their record counts and sizes; it is written after
//! every shard is committed (a rename locally, one PUT in object storage), so
//! a set either has a manifest naming only complete shards or does not open.
//! Each shard stays a plain store that loaderx 2.0.0 can open.
//!
//! ```json
//! {
//!   "format": "loaderx.store-set",
//!   "version": 1,
//!   "kind": "dense",
//!   "dtype": "<f4",
//!   "item_shape": [3, 32, 32],
//!   "codec": "zstd",
//!   "records": 2500,
//!   "shards": [
//!     {"path": "shard-000000", "records": 1000, "data_bytes": 4119237, "meta_bytes": 20096},
//!     {"path": "shard-000001", "records": 1000, "data_bytes": 4118810, "meta_bytes": 20096},
//!     {"path": "shard-000002", "records": 500, "data_bytes": 2059455, "meta_bytes": 12096}
//!   ]
//! }
//! ```

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::{Codec, LOC_SIZE, PAGE_SIZE};
use crate::schema::{DType, Kind, Schema};

/// File name of a set's manifest.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The `format` value of every manifest.
pub const MANIFEST_FORMAT: &str = "loaderx.store-set";
/// The manifest version this engine writes and reads.
pub const MANIFEST_VERSION: u32 = 1;
/// Largest manifest accepted (about 100,000 shards).
pub const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// One shard as the manifest lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardEntry {
    /// Folder of the shard, relative to the set's root (`/`-separated).
    pub path: String,
    /// Records in the shard.
    pub records: u64,
    /// Committed payload bytes (`data.zr`'s committed end).
    pub data_bytes: u64,
    /// Bytes of `meta.zr` (page and record table).
    pub meta_bytes: u64,
}

impl ShardEntry {
    /// The entry of a committed shard at `path` holding `records` records in
    /// `data_bytes` payload bytes.
    pub fn new(path: impl Into<String>, records: u64, data_bytes: u64) -> ShardEntry {
        ShardEntry {
            path: path.into(),
            records,
            data_bytes,
            meta_bytes: PAGE_SIZE + records * LOC_SIZE as u64,
        }
    }
}

/// A parsed, validated manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`MANIFEST_FORMAT`].
    pub format: String,
    /// [`MANIFEST_VERSION`].
    pub version: u32,
    /// `"dense"` or `"ragged"`.
    pub kind: String,
    /// NumPy dtype string, as stores record it.
    pub dtype: String,
    /// Dense record shape; absent for Ragged sets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_shape: Option<Vec<u64>>,
    /// Codec name of every shard.
    pub codec: String,
    /// Total records, the sum over shards.
    pub records: u64,
    /// The shards, in record order.
    pub shards: Vec<ShardEntry>,
}

impl Manifest {
    /// A manifest for shards of `schema` and `codec`.
    pub fn new(schema: &Schema, codec: Codec, shards: Vec<ShardEntry>) -> Manifest {
        let (kind, item_shape) = match schema {
            Schema::Dense { item_shape, .. } => ("dense", Some(item_shape.clone())),
            Schema::Ragged { .. } => ("ragged", None),
        };
        Manifest {
            format: MANIFEST_FORMAT.into(),
            version: MANIFEST_VERSION,
            kind: kind.into(),
            dtype: schema.dtype().descr().to_owned(),
            item_shape,
            codec: codec.name().into(),
            records: shards.iter().map(|s| s.records).sum(),
            shards,
        }
    }

    /// Serialises the manifest (pretty-printed: it is read by people too).
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("a manifest always serialises");
        out.push(b'\n');
        out
    }

    /// Parses and validates a manifest read from `where_`.
    pub fn parse(bytes: &[u8], where_: &str) -> Result<Manifest> {
        let bad = |msg: String| Error::InvalidFormat(format!("{where_}/{MANIFEST_FILE}: {msg}"));
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| bad(format!("{e}")))?;
        if m.format != MANIFEST_FORMAT {
            return Err(bad(format!(
                "format is {:?}, expected {MANIFEST_FORMAT:?}",
                m.format
            )));
        }
        if m.version != MANIFEST_VERSION {
            return Err(bad(format!(
                "version {} is not one this loaderx reads ({MANIFEST_VERSION}); upgrade loaderx",
                m.version
            )));
        }
        match (m.kind.as_str(), &m.item_shape) {
            ("dense", Some(_)) | ("ragged", None) => {}
            ("dense", None) => return Err(bad("a dense set needs item_shape".into())),
            ("ragged", Some(_)) => return Err(bad("a ragged set has no item_shape".into())),
            (other, _) => {
                return Err(bad(format!(
                    "kind is {other:?}, expected \"dense\" or \"ragged\""
                )))
            }
        }
        DType::parse(&m.dtype).map_err(|e| bad(format!("dtype: {e}")))?;
        Codec::from_name(&m.codec).map_err(|e| bad(format!("codec: {e}")))?;
        if m.shards.is_empty() {
            return Err(bad("it lists no shards".into()));
        }
        let mut seen = HashSet::new();
        let mut total: u64 = 0;
        for s in &m.shards {
            check_shard_path(&s.path).map_err(|why| bad(format!("shard {:?}: {why}", s.path)))?;
            if !seen.insert(s.path.as_str()) {
                return Err(bad(format!("shard {:?} is listed twice", s.path)));
            }
            total = total
                .checked_add(s.records)
                .ok_or_else(|| bad("record counts overflow".into()))?;
        }
        if total != m.records {
            return Err(bad(format!(
                "records is {} but the shards hold {total}",
                m.records
            )));
        }
        Ok(m)
    }

    /// The store kind the manifest declares.
    pub fn kind(&self) -> Kind {
        if self.kind == "dense" {
            Kind::Dense
        } else {
            Kind::Ragged
        }
    }

    /// The schema every shard must have.
    pub fn schema(&self) -> Result<Schema> {
        let dtype = DType::parse(&self.dtype)?;
        match &self.item_shape {
            Some(shape) => Schema::dense(dtype, shape.clone()),
            None => Ok(Schema::ragged(dtype)),
        }
    }

    /// The codec every shard must have.
    pub fn codec(&self) -> Codec {
        Codec::from_name(&self.codec).expect("validated by parse")
    }
}

/// A shard path must stay inside the set: relative, `/`-separated plain
/// names, no `.` or `..`, nothing a filesystem or a URL would reinterpret.
fn check_shard_path(path: &str) -> std::result::Result<(), &'static str> {
    if path.is_empty() || path.len() > 1024 {
        return Err("paths must be 1..=1024 bytes");
    }
    for part in path.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err("paths are relative, with no empty, '.' or '..' parts");
        }
        if part
            .chars()
            .any(|c| c.is_control() || matches!(c, '\\' | ':' | '?' | '#' | '%'))
        {
            return Err("paths hold no control characters, '\\', ':', '?', '#' or '%'");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let schema = Schema::dense(DType::parse("<u2").unwrap(), vec![3]).unwrap();
        Manifest::new(
            &schema,
            Codec::Zstd,
            vec![
                ShardEntry::new("shard-000000", 4, 40),
                ShardEntry::new("shard-000001", 2, 20),
            ],
        )
    }

    #[test]
    fn round_trips() {
        let m = sample();
        assert_eq!(m.records, 6);
        assert_eq!(m.shards[1].meta_bytes, 4096 + 32);
        let text = String::from_utf8(m.to_json()).unwrap();
        assert!(text.contains("\"format\": \"loaderx.store-set\""), "{text}");
        assert_eq!(Manifest::parse(text.as_bytes(), "x").unwrap(), m);
        assert_eq!(m.kind(), Kind::Dense);
        assert_eq!(m.codec(), Codec::Zstd);
    }

    type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;

    fn refused(edit: impl FnOnce(&mut serde_json::Value)) -> String {
        let mut v: serde_json::Value = serde_json::from_slice(&sample().to_json()).unwrap();
        edit(&mut v);
        let bytes = serde_json::to_vec(&v).unwrap();
        Manifest::parse(&bytes, "s3://b/set")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn malformed_manifests_are_refused() {
        let e = Manifest::parse(b"{not json", "d").unwrap_err();
        assert!(matches!(e, Error::InvalidFormat(_)), "{e}");
        assert!(e.to_string().contains("d/manifest.json"), "{e}");
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|v| v["format"] = "other".into()),
                "format is \"other\"",
            ),
            (
                Box::new(|v| v["version"] = 2.into()),
                "version 2 is not one",
            ),
            (
                Box::new(|v| v["kind"] = "table".into()),
                "kind is \"table\"",
            ),
            (
                Box::new(|v| v["kind"] = "ragged".into()),
                "a ragged set has no item_shape",
            ),
            (Box::new(|v| v["dtype"] = "<q9".into()), "dtype:"),
            (
                Box::new(|v| v["codec"] = "lz4".into()),
                "unknown codec \"lz4\"",
            ),
            (
                Box::new(|v| v["records"] = 7.into()),
                "records is 7 but the shards hold 6",
            ),
            (
                Box::new(|v| v["shards"] = serde_json::json!([])),
                "lists no shards",
            ),
            (
                Box::new(|v| v["shards"][1]["path"] = "shard-000000".into()),
                "listed twice",
            ),
            (
                Box::new(|v| v["shards"][0]["path"] = "../x".into()),
                "no empty, '.' or '..'",
            ),
            (
                Box::new(|v| v["shards"][0]["path"] = "/abs".into()),
                "no empty, '.' or '..'",
            ),
            (
                Box::new(|v| v["shards"][0]["path"] = "a\\b".into()),
                "control characters",
            ),
            (Box::new(|v| v["extra"] = 1.into()), "unknown field `extra`"),
        ];
        for (edit, expected) in cases {
            let msg = refused(edit);
            assert!(msg.contains(expected), "expected {expected:?} in {msg}");
            assert!(msg.contains("s3://b/set/manifest.json"), "{msg}");
        }
    }
}
