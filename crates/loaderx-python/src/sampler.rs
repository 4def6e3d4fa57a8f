//! `loaderx._native.Sampler`: the index sampler engine, filling NumPy
//! buffers owned by the Python wrapper (`loaderx.zsampler.Sampler`).
//!
//! The wrapper validates every public argument before it reaches this
//! class; the checks here only keep the native side memory-safe and
//! panic-free when it is called directly.
use loaderx::sampler::{Mode, Sampler, SamplerError};
use numpy::PyReadwriteArray1;
use pyo3::exceptions::{PyMemoryError, PyValueError};
use pyo3::prelude::*;

/// Batches longer than this are filled with the GIL released; for shorter
/// ones releasing and re-acquiring it costs more than the fill itself.
const DETACH_MIN: usize = 1 << 16;

fn to_pyerr(err: SamplerError) -> PyErr {
    match err {
        SamplerError::BatchTooLarge(_) => PyMemoryError::new_err(err.to_string()),
        _ => PyValueError::new_err(err.to_string()),
    }
}

/// Native sampler state: the engine plus the position of the next draw.
#[pyclass(name = "Sampler", module = "loaderx._native")]
pub struct PySampler {
    inner: Sampler,
}

impl PySampler {
    /// Fills `out` with batch `step`, after checking that it is a contiguous
    /// buffer of exactly one batch.
    fn fill(
        &self,
        py: Python<'_>,
        step: u64,
        out: &mut PyReadwriteArray1<'_, u64>,
    ) -> PyResult<()> {
        let slice = out
            .as_slice_mut()
            .map_err(|_| PyValueError::new_err("the index buffer must be C-contiguous"))?;
        if slice.len() != self.inner.batch_len() {
            return Err(PyValueError::new_err(format!(
                "the index buffer holds {} indices but a batch has {}",
                slice.len(),
                self.inner.batch_len()
            )));
        }
        if slice.len() > DETACH_MIN {
            let inner = &self.inner;
            py.detach(|| inner.fill(step, slice));
        } else {
            self.inner.fill(step, slice);
        }
        Ok(())
    }
}

#[pymethods]
impl PySampler {
    /// `Sampler(length, batch_size, mode, seed)`: mode is 0 (sequential),
    /// 1 (iid) or 2 (cyclic).
    #[new]
    fn new(length: u64, batch_size: u64, mode: u64, seed: u64) -> PyResult<Self> {
        let mode = Mode::try_from(mode).map_err(to_pyerr)?;
        let inner = Sampler::new(length, batch_size, mode, seed).map_err(to_pyerr)?;
        Ok(PySampler { inner })
    }

    /// Number of indices one draw writes.
    #[getter]
    fn batch_len(&self) -> usize {
        self.inner.batch_len()
    }

    #[getter]
    fn length(&self) -> u64 {
        self.inner.length()
    }

    #[getter]
    fn batch_size(&self) -> u64 {
        self.inner.batch_size()
    }

    /// The mode's numeric code.
    #[getter]
    fn mode(&self) -> u64 {
        self.inner.mode().code()
    }

    #[getter]
    fn seed(&self) -> u64 {
        self.inner.seed()
    }

    /// The step the next draw produces.
    #[getter]
    fn step(&self) -> u64 {
        self.inner.step()
    }

    /// Makes `step` the next batch to draw.
    fn seek(&mut self, step: u64) {
        self.inner.seek(step);
    }

    /// Writes the batch at the current step into `out` (a C-contiguous
    /// uint64 array of `batch_len` elements) and advances one step.
    fn fill_next(&mut self, py: Python<'_>, mut out: PyReadwriteArray1<'_, u64>) -> PyResult<()> {
        let step = self.inner.step();
        self.fill(py, step, &mut out)?;
        self.inner.seek(step.wrapping_add(1));
        Ok(())
    }

    /// Writes batch `step` into `out` without moving the position.
    fn fill_at(
        &self,
        py: Python<'_>,
        step: u64,
        mut out: PyReadwriteArray1<'_, u64>,
    ) -> PyResult<()> {
        self.fill(py, step, &mut out)
    }

    fn __repr__(&self) -> String {
        format!(
            "_native.Sampler(length={}, batch_size={}, mode={}, seed={}, step={})",
            self.inner.length(),
            self.inner.batch_size(),
            self.inner.mode().code(),
            self.inner.seed(),
            self.inner.step()
        )
    }
}

/// Adds `Sampler` to the `loaderx._native` module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySampler>()
}
