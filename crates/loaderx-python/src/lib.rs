//! The `loaderx._native` extension module: a thin PyO3 layer over the
//! `loaderx` engine crate. Every call that touches storage or compression,
//! and every loader wait, runs with the GIL released (sampler draws release
//! it only for large batches, where it pays for itself); Python-facing
//! checks and NumPy wrapping live in the `loaderx` Python package.

use pyo3::prelude::*;

mod args;
mod arrays;
mod dict;
mod errors;
mod loader;
mod sampler;
mod store;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(pool_threads, m)?)?;
    m.add_class::<arrays::BatchBuffer>()?;
    m.add_class::<arrays::LentMemory>()?;
    m.add_function(wrap_pyfunction!(cached_batch_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(batch_buffer_stats, m)?)?;
    m.add_function(wrap_pyfunction!(remote_stats, m)?)?;
    m.add_function(wrap_pyfunction!(level_range, m)?)?;
    store::register(m)?;
    dict::register(m)?;
    loader::register(m)?;
    sampler::register(m)?;
    Ok(())
}

/// Bytes held by the engine's cache of large batch buffers.
#[pyfunction]
fn cached_batch_bytes() -> usize {
    loaderx::buffers::cached_bytes()
}

/// `(reused, fresh)`: large batch buffers served from the cache and newly
/// allocated so far in this process.
#[pyfunction]
fn batch_buffer_stats() -> (u64, u64) {
    let s = loaderx::buffers::stats();
    (s.reused, s.fresh)
}

/// `(requests, bytes)`: object-storage read requests made and bytes
/// received so far in this process.
#[pyfunction]
fn remote_stats() -> (u64, u64) {
    let s = loaderx::remote::stats();
    (s.requests, s.bytes)
}

/// `(lowest, highest)`: the zstd compression levels a store can be
/// written at (zstd's own range, negative levels included).
#[pyfunction]
fn level_range() -> (i32, i32) {
    let range = loaderx::level_range();
    (*range.start(), *range.end())
}

/// Number of threads in the process-wide worker pool.
#[pyfunction]
fn pool_threads(py: Python<'_>) -> usize {
    py.detach(loaderx::pool::threads)
}
