//! The native half of `loaderx.dataloader.DataLoader`: sampling and gathers
//! on engine threads, batches handed to Python in step order.

use std::sync::Arc;
use std::time::Duration;

use loaderx::loader::{Column, Loader, LoaderConfig, Next, Packed, Source};
use loaderx::sampler::Mode;
use numpy::npyffi::npy_intp;
use numpy::PyArrayDescr;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::arrays::{dense_array, packed_tuple, ragged_list};
use crate::errors::{to_py, IntoPyResult};
use crate::store::ReaderHandle;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<LoaderHandle>()?;
    Ok(())
}

/// How long one wait for a batch lasts before Python signals (Ctrl-C) are checked.
const POLL: Duration = Duration::from_millis(50);

struct StreamInfo {
    dtype: Py<PyArrayDescr>,
    item_shape: Option<Vec<npy_intp>>,
}

/// A running native loader.
#[pyclass(frozen, module = "loaderx._native")]
pub struct LoaderHandle {
    loader: Loader,
    streams: Vec<StreamInfo>,
}

#[pymethods]
impl LoaderHandle {
    /// Starts gathering `readers` (ReaderHandle objects) with numpy dtypes `dtypes`.
    #[new]
    #[pyo3(signature = (readers, dtypes, packed, batch_size, mode, seed, start_step, prefetch, shard_index, shard_count, producers))]
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
    ) -> PyResult<Self> {
        if readers.len() != dtypes.len() || readers.len() != packed.len() {
            return Err(PyValueError::new_err(
                "one dtype and one packed flag per reader",
            ));
        }
        let mode = Mode::try_from(mode).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let mut sources: Vec<Arc<dyn Source>> = Vec::with_capacity(readers.len());
        let mut streams = Vec::with_capacity(readers.len());
        for ((reader, dtype), pack) in readers.iter().zip(dtypes).zip(packed) {
            let handle = reader.get();
            let store = handle.reader()?;
            streams.push(StreamInfo {
                dtype: dtype.unbind(),
                item_shape: handle
                    .item_shape_dims()
                    .map(|s| s.iter().map(|&d| d as npy_intp).collect()),
            });
            if pack {
                sources.push(Arc::new(Packed(store)));
            } else {
                sources.push(store);
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
        };
        let loader = py.detach(|| Loader::new(sources, config)).py(py)?;
        Ok(LoaderHandle { loader, streams })
    }

    /// The next batch in step order as `(step, [value per stream])`, or None
    /// once the loader is closed. Waits with the GIL released.
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
                        };
                        values.append(value)?;
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
