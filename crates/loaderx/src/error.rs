//! The engine's error type.
//!
//! Storage failures carry the integer codes that loaderx 2.0.0 exposes as
//! `ZrecordError.code`, so the Python binding can map every variant without a
//! table of its own. Argument, schema, index and lifecycle errors have no
//! code: they become `ValueError`, `loaderx.zrecord.SchemaError` (a
//! `ValueError`), `IndexError` and `RuntimeError` in Python.
//!
//! The enum is `#[non_exhaustive]`: code outside this crate that matches on
//! it keeps a wildcard arm, so a new variant is not a breaking change.

use std::path::PathBuf;

use crate::mixture::MixtureError;
use crate::pass::PassError;
use crate::sampler::SamplerError;

/// Result alias used throughout the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An allocation the request needed could not be made (code -1).
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// An operating-system I/O call failed (code -2).
    #[error("file I/O failed while {context}: {source}")]
    Io {
        /// What the engine was doing.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Object storage failed or refused a request, after any retries; the
    /// message names the URL and what the server said (code -2, as I/O).
    #[error("object storage: {0}")]
    Remote(String),
    /// A record is larger than the format allows (code -4).
    #[error("record too large: {0}")]
    RecordTooLarge(String),
    /// The store cannot grow any further: record count or data offset would overflow (code -5).
    #[error("store is full: {0}")]
    StoreFull(String),
    /// A destination buffer does not have the size the request needs (code -6).
    #[error("buffer too small: {0}")]
    BufferTooSmall(String),
    /// A stored record failed to decode or has the wrong size (code -7).
    #[error("stored record failed to decode: {0}")]
    Corrupt(String),
    /// The store's files do not follow the format (code -8).
    #[error("invalid or unsupported zrecord store format: {0}")]
    InvalidFormat(String),
    /// zstd's dictionary trainer failed (code -9).
    #[error("zstd dictionary training failed (too few or too small samples): {0}")]
    DictTraining(String),
    /// A store already exists where one was to be created (code -12).
    #[error("store already exists: {0}")]
    AlreadyExists(String),
    /// Another handle holds a conflicting lock on the store (code -13).
    #[error("store is busy (already open by another native handle or process): {0}")]
    Busy(String),
    /// No store at the given path.
    #[error("native store not found: no store at {}: {reason}", path.display())]
    NotFound {
        /// The path that was opened.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// The stored schema is not exactly the one the store kind expects (a
    /// store of the other kind, or other fields); Python's `SchemaError`.
    #[error("{0}")]
    Schema(String),
    /// A caller passed an invalid argument.
    #[error("{0}")]
    InvalidArgument(String),
    /// A record index is outside `0..len`.
    #[error("{0}")]
    IndexOutOfRange(String),
    /// The handle is in the wrong state for the call (closed, writer vs reader).
    #[error("{0}")]
    State(String),
}

impl Error {
    /// The loaderx 2.0.0 `ZrecordError` code of a storage error, `None` for
    /// argument, index, schema, lifecycle and not-found errors.
    pub fn code(&self) -> Option<i32> {
        Some(match self {
            Error::OutOfMemory(_) => -1,
            Error::Io { .. } | Error::Remote(_) => -2,
            Error::RecordTooLarge(_) => -4,
            Error::StoreFull(_) => -5,
            Error::BufferTooSmall(_) => -6,
            Error::Corrupt(_) => -7,
            Error::InvalidFormat(_) => -8,
            Error::DictTraining(_) => -9,
            Error::AlreadyExists(_) => -12,
            Error::Busy(_) => -13,
            Error::NotFound { .. }
            | Error::Schema(_)
            | Error::InvalidArgument(_)
            | Error::IndexOutOfRange(_)
            | Error::State(_) => return None,
        })
    }

    /// Wraps an OS error with what the engine was doing.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// A sampler that cannot be built from its arguments is an invalid argument.
impl From<SamplerError> for Error {
    fn from(e: SamplerError) -> Self {
        Error::InvalidArgument(e.to_string())
    }
}

/// A finite pass that cannot be built from its arguments is an invalid argument.
impl From<PassError> for Error {
    fn from(e: PassError) -> Self {
        Error::InvalidArgument(e.to_string())
    }
}

/// A mixture that cannot be built from its arguments is an invalid argument.
impl From<MixtureError> for Error {
    fn from(e: MixtureError) -> Self {
        Error::InvalidArgument(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_loaderx_2() {
        assert_eq!(Error::OutOfMemory(String::new()).code(), Some(-1));
        assert_eq!(Error::io("x", std::io::Error::other("y")).code(), Some(-2));
        assert_eq!(Error::Remote(String::new()).code(), Some(-2));
        assert_eq!(Error::RecordTooLarge(String::new()).code(), Some(-4));
        assert_eq!(Error::StoreFull(String::new()).code(), Some(-5));
        assert_eq!(Error::BufferTooSmall(String::new()).code(), Some(-6));
        assert_eq!(Error::Corrupt(String::new()).code(), Some(-7));
        assert_eq!(Error::InvalidFormat(String::new()).code(), Some(-8));
        assert_eq!(Error::DictTraining(String::new()).code(), Some(-9));
        assert_eq!(Error::AlreadyExists(String::new()).code(), Some(-12));
        assert_eq!(Error::Busy(String::new()).code(), Some(-13));
        assert_eq!(Error::InvalidArgument(String::new()).code(), None);
        assert_eq!(Error::Schema(String::new()).code(), None);
    }

    #[test]
    fn sampler_errors_are_invalid_arguments() {
        let err = Error::from(SamplerError::ZeroBatchSize);
        assert!(matches!(&err, Error::InvalidArgument(m) if m == "batch_size must be at least 1"));
        assert_eq!(err.code(), None);
    }
}
