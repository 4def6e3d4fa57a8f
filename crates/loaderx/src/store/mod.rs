//! Dense and Ragged stores: typed handles over one physical engine.
//!
//! [`StoreWriter`] and [`StoreReader`] know the file format and codecs but
//! nothing of shapes; [`DenseWriter`]/[`DenseReader`] and
//! [`RaggedWriter`]/[`RaggedReader`] add the geometry of each contract.
//!
//! ```
//! use loaderx::store::{DenseReader, DenseWriter, RaggedReader, RaggedRecord, RaggedWriter};
//! use loaderx::{Codec, DType};
//!
//! let dir = std::env::temp_dir().join(format!("loaderx-doc-{}", std::process::id()));
//! let _ = std::fs::remove_dir_all(&dir);
//!
//! // Four records of two little-endian u16 each.
//! let mut w = DenseWriter::create(dir.join("pairs"), DType::parse("<u2")?, &[2], Codec::Zstd, None)?;
//! let values: Vec<u8> = (0u16..8).flat_map(|v| v.to_le_bytes()).collect();
//! w.append(&values)?;
//! w.close()?;
//!
//! let r = DenseReader::open(dir.join("pairs"))?;
//! let mut out = vec![0u8; 2 * r.record_width()];
//! r.gather_into(&[3, 0], &mut out)?;
//! assert_eq!(out, [6, 0, 7, 0, 0, 0, 1, 0]);
//!
//! let mut w = RaggedWriter::create(dir.join("tokens"), DType::parse("|u1")?, Codec::Raw, None)?;
//! w.append(&[
//!     RaggedRecord { shape: &[3], payload: &[1, 2, 3] },
//!     RaggedRecord { shape: &[1, 1], payload: &[9] },
//! ])?;
//! w.close()?;
//! let r = RaggedReader::open(dir.join("tokens"))?;
//! let batch = r.gather(&[1, 0])?;
//! assert_eq!((batch.shape(0), batch.payload(0)), (&[1u64, 1][..], &[9u8][..]));
//! assert_eq!((batch.shape(1), batch.payload(1)), (&[3u64][..], &[1u8, 2, 3][..]));
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), loaderx::Error>(())
//! ```

mod batch;
mod dataset;
mod fetch;
mod geometry;
mod layout;
pub mod manifest;
mod reader;
mod segment;
mod writer;

use std::path::Path;

pub use batch::{PackedBatch, RaggedBatch};
pub use dataset::{
    commit_set, upload, write_shard, DatasetWriter, Sharding, WriteOptions, STAGING_ENV,
};
pub use fetch::request_count;
pub use geometry::{parse_ragged, RaggedRecord, MAX_NDIM};
pub use layout::{Layout, RaggedPrefix};
pub use reader::{
    Checksums, DataAccess, ReadOptions, StoreReader, MAP_RECORD_BYTES, MAX_DICT_BYTES,
};
pub use writer::{CreateOptions, StoreWriter};

use crate::error::Result;
use crate::format::Codec;
use crate::schema::{DType, Kind, Schema};

/// Writer of a store of fixed-shape records.
#[derive(Debug)]
pub struct DenseWriter {
    inner: StoreWriter,
    width: usize,
}

impl DenseWriter {
    /// Creates a Dense store of `dtype` records shaped `item_shape`.
    pub fn create(
        dir: impl AsRef<Path>,
        dtype: DType,
        item_shape: &[u64],
        codec: Codec,
        dict: Option<Vec<u8>>,
    ) -> Result<Self> {
        let schema = Schema::dense(dtype, item_shape.to_vec())?;
        let width = schema.record_width().expect("dense") as usize;
        let inner = StoreWriter::create(dir, schema, CreateOptions::new(codec, dict))?;
        Ok(DenseWriter { inner, width })
    }

    /// Bytes per record.
    pub fn record_width(&self) -> usize {
        self.width
    }

    /// Appends whole records laid back to back in C order.
    pub fn append(&mut self, data: &[u8]) -> Result<()> {
        self.inner.append_dense(data)
    }

    /// Commits the store (see [`StoreWriter::close`]).
    pub fn close(&mut self) -> Result<()> {
        self.inner.close(false)
    }

    /// The untyped writer.
    pub fn inner(&self) -> &StoreWriter {
        &self.inner
    }

    /// The untyped writer, mutably (for `close(durable)`).
    pub fn inner_mut(&mut self) -> &mut StoreWriter {
        &mut self.inner
    }
}

/// Reader of a store of fixed-shape records.
#[derive(Debug)]
pub struct DenseReader {
    inner: StoreReader,
    width: usize,
}

impl DenseReader {
    /// Opens a committed Dense store.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let inner = StoreReader::open(dir, Kind::Dense)?;
        let width = inner.schema().record_width().expect("dense") as usize;
        Ok(DenseReader { inner, width })
    }

    /// Bytes per record.
    pub fn record_width(&self) -> usize {
        self.width
    }

    /// Record shape.
    pub fn item_shape(&self) -> &[u64] {
        match self.inner.schema() {
            Schema::Dense { item_shape, .. } => item_shape,
            Schema::Ragged { .. } => unreachable!("opened as Dense"),
        }
    }

    /// Number of records.
    pub fn len(&self) -> u64 {
        self.inner.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Decodes records `indices`, in order, into `out` (`indices.len() * record_width()` bytes).
    pub fn gather_into(&self, indices: &[u64], out: &mut [u8]) -> Result<()> {
        self.inner.gather_fixed(indices, self.width, out)
    }

    /// The untyped reader.
    pub fn inner(&self) -> &StoreReader {
        &self.inner
    }
}

/// Writer of a store of variable-shape records.
#[derive(Debug)]
pub struct RaggedWriter {
    inner: StoreWriter,
}

impl RaggedWriter {
    /// Creates a Ragged store of `dtype` records.
    pub fn create(
        dir: impl AsRef<Path>,
        dtype: DType,
        codec: Codec,
        dict: Option<Vec<u8>>,
    ) -> Result<Self> {
        let inner =
            StoreWriter::create(dir, Schema::ragged(dtype), CreateOptions::new(codec, dict))?;
        Ok(RaggedWriter { inner })
    }

    /// Appends records; nothing is written unless every record is valid.
    pub fn append(&mut self, records: &[RaggedRecord<'_>]) -> Result<()> {
        self.inner.append_ragged(records)
    }

    /// Commits the store (see [`StoreWriter::close`]).
    pub fn close(&mut self) -> Result<()> {
        self.inner.close(false)
    }

    /// The untyped writer.
    pub fn inner(&self) -> &StoreWriter {
        &self.inner
    }

    /// The untyped writer, mutably (for `close(durable)`).
    pub fn inner_mut(&mut self) -> &mut StoreWriter {
        &mut self.inner
    }
}

/// Reader of a store of variable-shape records.
#[derive(Debug)]
pub struct RaggedReader {
    inner: StoreReader,
}

impl RaggedReader {
    /// Opens a committed Ragged store.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Ok(RaggedReader {
            inner: StoreReader::open(dir, Kind::Ragged)?,
        })
    }

    /// Number of records.
    pub fn len(&self) -> u64 {
        self.inner.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Decodes records `indices` into one shared buffer, with their shapes.
    pub fn gather(&self, indices: &[u64]) -> Result<RaggedBatch> {
        self.inner.gather_ragged(indices)
    }

    /// Decodes records `indices` packed back to back (see [`PackedBatch`]);
    /// the records must share one rank.
    pub fn gather_packed(&self, indices: &[u64]) -> Result<PackedBatch> {
        self.gather(indices)?.into_packed()
    }

    /// The untyped reader.
    pub fn inner(&self) -> &StoreReader {
        &self.inner
    }
}
