//! The native half of `loaderx.dataloader.DataLoader`: sampling and gathers
//! on engine threads, batches handed to Python in step order.

use std::sync::Arc;
use std::time::Duration;

use loaderx::lent::LentPool;
use loaderx::loader::{Column, Loader, LoaderConfig, Next, Packed, Source};
use loaderx::mixture::Proportions;
use loaderx::sampler::Mode;
use loaderx::shape::{PackSpec, PadSpec, Padded, Policy, RowPacked, Side};
use numpy::npyffi::npy_intp;
use numpy::{PyArray1, PyArrayDescr, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::arrays::{dense_array, packed_tuple, padded_arrays, ragged_list, row_packed_arrays};
use crate::errors::{to_py, IntoPyResult};
use crate::store::ReaderHandle;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<LoaderHandle>()?;
    m.add_class::<LentPoolHandle>()?;
    Ok(())
}

/// How long one wait for a batch lasts before Python signals (Ctrl-C) are checked.
const POLL: Duration = Duration::from_millis(50);

struct StreamInfo {
    dtype: Py<PyArrayDescr>,
    item_shape: Option<Vec<npy_intp>>,
}

/// A stream's padding as Python passes it: `(length, value item bytes,
/// side, truncate, mask, lengths)`.
type PadArgs = (usize, Vec<u8>, String, String, bool, bool);
/// A stream's packing as Python passes it: `(max_tokens, rows, policy,
/// value item bytes)`.
type PackArgs = (usize, Option<usize>, String, Vec<u8>);

fn side(what: &str, s: &str) -> PyResult<Side> {
    match s {
        "right" => Ok(Side::Right),
        "left" => Ok(Side::Left),
        _ => Err(PyValueError::new_err(format!(
            "{what} must be 'right' or 'left', got {s:?}"
        ))),
    }
}

fn pad_spec((length, value, pad_side, truncate, mask, lengths): PadArgs) -> PyResult<PadSpec> {
    Ok(PadSpec {
        length,
        value,
        side: side("side", &pad_side)?,
        truncate: side("truncate", &truncate)?,
        mask,
        lengths,
    })
}

fn pack_spec((max_tokens, rows, policy, value): PackArgs) -> PyResult<PackSpec> {
    let policy = match policy.as_str() {
        "first_fit" => Policy::FirstFit,
        "best_fit" => Policy::BestFit,
        _ => {
            return Err(PyValueError::new_err(format!(
                "policy must be 'first_fit' or 'best_fit', got {policy:?}"
            )))
        }
    };
    Ok(PackSpec {
        max_tokens,
        rows,
        policy,
        value,
    })
}

/// Memory a Python consumer lends to loaders for their Dense columns
/// (pinned host memory, typically); see `loaderx::lent`.
#[pyclass(frozen, name = "LentPool", module = "loaderx._native")]
pub struct LentPoolHandle {
    pool: Arc<LentPool>,
}

#[pymethods]
impl LentPoolHandle {
    #[new]
    fn new() -> Self {
        LentPoolHandle {
            pool: LentPool::new(),
        }
    }

    /// Lends the memory of `array`, a writable C-contiguous 1-D uint8 array,
    /// as one region. The pool keeps the array (and whatever owns its
    /// memory) alive; the caller must not use that memory any more.
    fn lend(&self, array: Bound<'_, PyArray1<u8>>) -> PyResult<()> {
        // A writable view can be borrowed mutably; a read-only one cannot.
        if !array.is_contiguous() || array.try_readwrite().is_err() {
            return Err(PyValueError::new_err(
                "lent memory must be a writable C-contiguous uint8 array",
            ));
        }
        let len = array.len();
        let Some(ptr) = std::ptr::NonNull::new(array.data()) else {
            return Err(PyValueError::new_err("lent memory must not be empty"));
        };
        let owner: Py<PyAny> = array.into_any().unbind();
        // SAFETY: the array object, kept alive as the region's owner, keeps
        // its `len` bytes at `ptr` valid; the caller gives up using them
        // (documented above), so only the pool's buffers reach them.
        unsafe { self.pool.lend(ptr.cast(), len, Box::new(owner)) };
        Ok(())
    }

    /// `(lent, fallback, free)`: requests served with lent memory, requests
    /// that found no free region large enough, and regions free now.
    fn stats(&self) -> (u64, u64, usize) {
        let s = self.pool.stats();
        (s.lent, s.fallback, s.free)
    }
}

/// A running native loader.
#[pyclass(frozen, module = "loaderx._native")]
pub struct LoaderHandle {
    loader: Loader,
    streams: Vec<StreamInfo>,
    /// Whether batches end with an int32 array of source numbers.
    source_stream: bool,
}

#[pymethods]
impl LoaderHandle {
    /// Starts gathering `readers` (ReaderHandle objects) with numpy dtypes
    /// `dtypes`, one per stream. With `weights` (one per source), `readers`
    /// holds every source's streams, source after source, and the loader
    /// samples a mixture (`exact`: fixed quotas, else IID picks). With
    /// `epochs`, a finite pass whose batches end with a bool mask. `pad`
    /// and `pack`, when given, hold one entry per stream: None, or that
    /// stream's padding / packing (see `PadArgs`, `PackArgs`); a mixture
    /// takes neither (its sources merge per batch).
    #[new]
    #[pyo3(signature = (readers, dtypes, packed, batch_size, mode, seed, start_step, prefetch, shard_index, shard_count, producers, weights=None, exact=true, epochs=None, source_stream=false, lent=None, pad=None, pack=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        readers: Vec<Bound<'_, ReaderHandle>>,
        dtypes: Vec<Bound<'_, PyArrayDescr>>,
        packed: Vec<bool>,
        batch_size: u64,
        mode: u64,
        seed: u64,
        start_step: u64,
        prefetch: usize,
        shard_index: u64,
        shard_count: u64,
        producers: usize,
        weights: Option<Vec<f64>>,
        exact: bool,
        epochs: Option<u64>,
        source_stream: bool,
        lent: Option<Bound<'_, LentPoolHandle>>,
        pad: Option<Vec<Option<PadArgs>>>,
        pack: Option<Vec<Option<PackArgs>>>,
    ) -> PyResult<Self> {
        let per_source = dtypes.len();
        let source_count = weights.as_ref().map_or(1, Vec::len);
        let pad = pad.unwrap_or_else(|| vec![None; per_source]);
        let pack = pack.unwrap_or_else(|| vec![None; per_source]);
        if per_source == 0
            || packed.len() != per_source
            || pad.len() != per_source
            || pack.len() != per_source
            || source_count == 0
            || readers.len() != per_source.saturating_mul(source_count)
        {
            return Err(PyValueError::new_err(
                "one dtype, packed flag, pad and pack entry per stream, and one reader per \
                 stream of each source",
            ));
        }
        if weights.is_some()
            && (pad.iter().any(Option::is_some) || pack.iter().any(Option::is_some))
        {
            return Err(PyValueError::new_err(
                "pad= and pack= do not apply to a mixture",
            ));
        }
        let mode = Mode::try_from(mode).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let mut components: Vec<Vec<Arc<dyn Source>>> = Vec::with_capacity(source_count);
        let mut streams = Vec::with_capacity(per_source);
        for (i, reader) in readers.iter().enumerate() {
            let m = i % per_source;
            let handle = reader.get();
            let store = handle.reader()?;
            if i < per_source {
                // Stream layouts come from the first source; the Python
                // side checked that the others agree.
                streams.push(StreamInfo {
                    dtype: dtypes[m].clone().unbind(),
                    item_shape: handle
                        .item_shape_dims()
                        .map(|s| s.iter().map(|&d| d as npy_intp).collect()),
                });
            }
            if m == 0 {
                components.push(Vec::with_capacity(per_source));
            }
            let source: Arc<dyn Source> = match (packed[m], &pad[m], &pack[m]) {
                (false, None, None) => store,
                (true, None, None) => Arc::new(Packed(store)),
                (false, Some(p), None) => {
                    Arc::new(Padded::new(store, pad_spec(p.clone())?).py(py)?)
                }
                (false, None, Some(p)) => {
                    Arc::new(RowPacked::new(store, pack_spec(p.clone())?).py(py)?)
                }
                _ => {
                    return Err(PyValueError::new_err(
                        "a stream can be packed, padded or packed into rows, not several",
                    ))
                }
            };
            if let Some(last) = components.last_mut() {
                last.push(source);
            }
        }
        let config = LoaderConfig {
            batch_size,
            mode,
            seed,
            start_step,
            prefetch,
            shard_index,
            shard_count,
            producers,
            lent: lent.map(|p| Arc::clone(&p.get().pool)),
            epochs,
        };
        let loader = match weights {
            None => {
                let sources = components.pop().unwrap_or_default();
                py.detach(|| Loader::new(sources, config)).py(py)?
            }
            Some(weights) => {
                let proportions = if exact {
                    Proportions::Exact
                } else {
                    Proportions::Iid
                };
                py.detach(|| Loader::mixture(components, weights, proportions, config))
                    .py(py)?
            }
        };
        Ok(LoaderHandle {
            loader,
            streams,
            source_stream,
        })
    }

    /// The next batch in step order as `(step, [values])`, or None once the
    /// loader is closed. Waits with the GIL released. Streams give one value
    /// each, in order, except padded ones (values, then the mask and the
    /// lengths when asked for) and ones packed into rows (values, segment
    /// ids, positions, placement, dropped count); then the mask of a finite
    /// pass and the source numbers of a mixture, when there are.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        loop {
            match py.detach(|| self.loader.next_timeout(POLL)) {
                Next::Ready(Ok(batch)) => {
                    let values = PyList::empty(py);
                    for (column, info) in batch.columns.into_iter().zip(&self.streams) {
                        let dtype = info.dtype.bind(py);
                        let value = match column {
                            Column::Dense(d) => {
                                let mut shape = vec![d.rows as npy_intp];
                                shape.extend(info.item_shape.iter().flatten().copied());
                                dense_array(py, d.data, shape, dtype)?
                            }
                            Column::Ragged(r) => ragged_list(py, r, dtype)?.into_any(),
                            Column::Packed(p) => packed_tuple(py, p, dtype)?.into_any(),
                            Column::Padded(p) => {
                                for array in padded_arrays(py, p, dtype)? {
                                    values.append(array)?;
                                }
                                continue;
                            }
                            Column::RowPacked(p) => {
                                for array in row_packed_arrays(py, p, dtype)? {
                                    values.append(array)?;
                                }
                                continue;
                            }
                        };
                        values.append(value)?;
                    }
                    // The extra streams, after the user's: mask, then sources.
                    if let Some(mask) = batch.mask {
                        values.append(PyArray1::from_vec(py, mask))?;
                    }
                    if self.source_stream {
                        let sources: Vec<i32> = batch
                            .sources
                            .unwrap_or_else(|| vec![0; batch.indices.len()])
                            .into_iter()
                            .map(|k| k as i32)
                            .collect();
                        values.append(PyArray1::from_vec(py, sources))?;
                    }
                    return Ok(Some(PyTuple::new(
                        py,
                        [batch.step.into_pyobject(py)?.into_any(), values.into_any()],
                    )?));
                }
                Next::Ready(Err(e)) => return Err(to_py(py, e)),
                Next::Closed => return Ok(None),
                Next::Pending => py.check_signals()?,
            }
        }
    }

    /// Steps of a finite pass, None when endless.
    #[getter]
    fn steps(&self) -> Option<u64> {
        self.loader.steps()
    }

    /// The step of the next batch to be handed out.
    #[getter]
    fn step(&self) -> u64 {
        self.loader.step()
    }

    /// Stops the native threads and waits for them.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.loader.close());
    }

    /// Stops the native threads without waiting for them.
    fn request_close(&self) {
        self.loader.request_close();
    }
}
