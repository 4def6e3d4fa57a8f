//! Dictionary training: an evenly spread sample collected natively, trained
//! by zstd with the GIL released.

use loaderx::dict::SampleCollector;
use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Mutex;

use crate::errors::IntoPyResult;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DictSampler>()?;
    Ok(())
}

/// Collects training samples within a byte budget (see `loaderx::dict::SampleCollector`).
#[pyclass(frozen, module = "loaderx._native")]
pub struct DictSampler {
    inner: Mutex<SampleCollector>,
}

#[pymethods]
impl DictSampler {
    #[new]
    fn new(budget: usize) -> Self {
        DictSampler {
            inner: Mutex::new(SampleCollector::new(budget)),
        }
    }

    /// Offers one record (its bytes as a uint8 array).
    fn push(&self, record: PyReadonlyArray1<'_, u8>) -> PyResult<()> {
        let bytes = record.as_slice()?;
        self.inner.lock().expect("poisoned").push(bytes);
        Ok(())
    }

    /// Offers `len(data) // width` records of `width` bytes each.
    fn push_rows(
        &self,
        py: Python<'_>,
        data: PyReadonlyArray1<'_, u8>,
        width: usize,
    ) -> PyResult<()> {
        let bytes = data.as_slice()?;
        let inner = &self.inner;
        py.detach(|| inner.lock().expect("poisoned").push_rows(bytes, width));
        Ok(())
    }

    /// Records offered so far.
    #[getter]
    fn seen(&self) -> u64 {
        self.inner.lock().expect("poisoned").seen()
    }

    /// Records kept.
    #[getter]
    fn kept(&self) -> usize {
        self.inner.lock().expect("poisoned").kept()
    }

    /// Trains a dictionary of at most `max_size` bytes.
    fn train<'py>(&self, py: Python<'py>, max_size: usize) -> PyResult<Bound<'py, PyBytes>> {
        let inner = &self.inner;
        let dict = py
            .detach(|| inner.lock().expect("poisoned").train(max_size))
            .py(py)?;
        Ok(PyBytes::new(py, &dict))
    }
}
