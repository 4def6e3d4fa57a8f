//! # loaderx
//!
//! The engine behind the `loaderx` Python package, usable directly from Rust:
//!
//! * [`store`]: Zrecord, an append-only-then-immutable record store on disk,
//!   byte-compatible with loaderx 2.0.0. [`store::DenseWriter`] /
//!   [`store::DenseReader`] hold fixed-shape records, [`store::RaggedWriter`] /
//!   [`store::RaggedReader`] records of any shape. One codec per store
//!   ([`Codec`]): raw, zstd, or zstd with a trained dictionary ([`dict`]).
//! * [`sampler`]: index batches (sequential, IID, cyclic), each a pure
//!   function of `(seed, step)`.
//! * [`mixture`]: weighted mixtures of several sources, each batch slot a
//!   pure function of `(seed, step, slot)`.
//! * [`pass`]: finite passes (evaluation), every record exactly once per
//!   epoch, the last batch padded and masked.
//! * [`loader`]: a step-ordered batch pipeline over equal-length sources or
//!   a mixture of them, endless or a finite pass, with prefetch, exact
//!   resume and sharding across processes.
//! * [`shape`]: fixed-shape batches from Ragged records (padding, and
//!   packing into rows of `max_tokens` for variable-length attention).
//!
//! Batched gathers and appends fan out over one process-wide thread pool
//! ([`pool`]). A store can also be a set of shards read as one
//! ([`store::manifest`]), and live in object storage ([`remote`]).
//!
//! The format is documented in [`mod@format`]; errors in [`Error`].

#![warn(missing_docs)]

#[cfg(target_endian = "big")]
compile_error!("the Zrecord format is little-endian; big-endian hosts are not supported");

pub mod buffers;
mod codec;
pub mod dict;
pub mod error;
pub mod format;
mod io;
pub mod lent;
pub mod loader;
pub mod mixture;
pub mod pass;
pub mod pool;
pub mod remote;
pub mod sampler;
pub mod schema;
pub mod shape;
pub mod store;

pub use codec::{default_level, level_range, resolve_level, ZSTD_DICT_LEVEL, ZSTD_LEVEL};
pub use error::{Error, Result};
pub use format::Codec;
pub use schema::{DType, Kind, Schema};
