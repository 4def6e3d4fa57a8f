//! Maps engine errors onto the Python exceptions of the loaderx API.
//!
//! Storage errors become `loaderx.zrecord.ZrecordError(message, code)`, a
//! `RuntimeError` subclass defined in Python (`loaderx._errors`) so that it
//! pickles and subclasses like any Python exception.

use loaderx::Error;
use pyo3::exceptions::{PyFileNotFoundError, PyIndexError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

static ZRECORD_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn zrecord_error_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    ZRECORD_ERROR.import(py, "loaderx._errors", "ZrecordError")
}

/// Converts an engine error into the matching Python exception.
pub fn to_py(py: Python<'_>, err: Error) -> PyErr {
    let message = err.to_string();
    if let Some(code) = err.code() {
        return match zrecord_error_type(py).and_then(|t| t.call1((message.clone(), code))) {
            Ok(value) => PyErr::from_value(value),
            Err(import_failure) => import_failure,
        };
    }
    match err {
        Error::NotFound { .. } => PyFileNotFoundError::new_err(message),
        Error::IndexOutOfRange(_) => PyIndexError::new_err(message),
        Error::State(_) => PyRuntimeError::new_err(message),
        _ => PyValueError::new_err(message),
    }
}

/// `result.map_err(...)` shorthand for engine results.
pub trait IntoPyResult<T> {
    /// Converts the error side into a Python exception.
    fn py(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn py(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}
