//! Arguments that name an engine enum, parsed by PyO3's argument conversion
//! (`FromPyObject`) so the `#[pyfunction]`s take them as typed values.
//!
//! The engine enums live in another crate, so each gets a newtype here. A
//! value of the wrong Python type is the `TypeError` of a `str` argument
//! (PyO3 prefixes it with the argument's name); an unknown name is the
//! `ValueError` the binding has always raised.

use loaderx::schema::Kind;
use loaderx::store::DataAccess;
use loaderx::Codec;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::IntoPyResult;

/// A store kind: `"dense"` or `"ragged"`.
#[derive(Clone, Copy, Debug)]
pub struct KindArg(pub Kind);

impl<'a, 'py> FromPyObject<'a, 'py> for KindArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        match obj.extract::<&str>()? {
            "dense" => Ok(KindArg(Kind::Dense)),
            "ragged" => Ok(KindArg(Kind::Ragged)),
            other => Err(PyValueError::new_err(format!(
                "unknown store kind {other:?}"
            ))),
        }
    }
}

/// How a reader gets at `data.zr`: `"auto"`, `"read"` or `"map"`. An
/// omitted (`None`) argument means `LOADERX_DATA_ACCESS`, else auto: see
/// [`AccessArg::or_env`].
#[derive(Clone, Copy, Debug)]
pub struct AccessArg(pub DataAccess);

impl AccessArg {
    /// The access named by `arg`, else the one `LOADERX_DATA_ACCESS` names.
    pub fn or_env(arg: Option<AccessArg>) -> DataAccess {
        arg.map_or_else(DataAccess::from_env, |a| a.0)
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for AccessArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        match obj.extract::<&str>()? {
            "auto" => Ok(AccessArg(DataAccess::Auto)),
            "read" => Ok(AccessArg(DataAccess::Read)),
            "map" => Ok(AccessArg(DataAccess::Map)),
            other => Err(PyValueError::new_err(format!(
                "unknown data_access {other:?}: expected \"auto\", \"read\" or \"map\""
            ))),
        }
    }
}

/// A codec name: `"raw"`, `"zstd"` or `"zstd_dict"`; an unknown one is the
/// engine's `InvalidArgument` error (a `ValueError`).
#[derive(Clone, Copy, Debug)]
pub struct CodecArg(pub Codec);

impl<'a, 'py> FromPyObject<'a, 'py> for CodecArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let name = obj.extract::<&str>()?;
        Codec::from_name(name).py(obj.py()).map(CodecArg)
    }
}
