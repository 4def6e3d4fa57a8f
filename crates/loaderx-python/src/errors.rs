//! Maps engine errors onto the Python exceptions of the loaderx API.
//!
//! Storage errors become `loaderx.zrecord.ZrecordError(message, code)`, a
//! `RuntimeError` subclass, and schema errors `loaderx.zrecord.SchemaError`,
//! a `ValueError` subclass; both are defined in Python (`loaderx._errors`)
//! so that they pickle and subclass like any Python exception.

use loaderx::Error;
use pyo3::exceptions::{PyFileNotFoundError, PyIndexError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

static ZRECORD_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static SCHEMA_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn zrecord_error_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    ZRECORD_ERROR.import(py, "loaderx._errors", "ZrecordError")
}

fn schema_error_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    SCHEMA_ERROR.import(py, "loaderx._errors", "SchemaError")
}

/// An instance of the Python exception class `ty` made with `args`, or the
/// error importing or calling it.
fn python_error<'py, A>(ty: PyResult<&Bound<'py, PyType>>, args: A) -> PyErr
where
    A: pyo3::call::PyCallArgs<'py>,
{
    match ty.and_then(|t| t.call1(args)) {
        Ok(value) => PyErr::from_value(value),
        Err(failure) => failure,
    }
}

/// Converts an engine error into the matching Python exception.
pub fn to_py(py: Python<'_>, err: Error) -> PyErr {
    let message = err.to_string();
    if let Some(code) = err.code() {
        return python_error(zrecord_error_type(py), (message, code));
    }
    match err {
        Error::Schema(_) => python_error(schema_error_type(py), (message,)),
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
