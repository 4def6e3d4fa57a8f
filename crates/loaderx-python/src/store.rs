//! Store handles: the native halves of `loaderx.zrecord.Dense` and `Ragged`.
//!
//! The Python classes validate arguments and shape results; these handles
//! move bytes. Writers sit behind a mutex (appends are serialised, as the
//! format requires); readers behind an `Arc`, so `close()` never frees a map
//! that a gather on another thread is still reading.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use loaderx::remote::StorageOptions;
use loaderx::schema::{DType, Kind, Schema};
use loaderx::store::manifest::ShardEntry;
use loaderx::store::{
    Checksums, DataAccess, DatasetWriter, RaggedRecord, ReadOptions, Sharding, StoreReader,
    WriteOptions,
};
use loaderx::{Codec, Error};
use numpy::npyffi::npy_intp;
use numpy::{
    PyArrayDescr, PyArrayDescrMethods, PyReadonlyArray1, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyIndexError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::args::{AccessArg, CodecArg, KindArg};
use crate::arrays::{dense_array, packed_tuple, ragged_list};
use crate::errors::IntoPyResult;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(commit_set, m)?)?;
    m.add_function(wrap_pyfunction!(upload, m)?)?;
    m.add_class::<WriterHandle>()?;
    m.add_class::<ReaderHandle>()?;
    Ok(())
}

fn closed_error(what: &str) -> PyErr {
    PyRuntimeError::new_err(format!("Container is closed ({what})"))
}

/// Writes the manifest of a set whose shards (`(path, records,
/// data_bytes)`, in record order) are committed under `root`, after checking
/// that they open as the manifest says; returns the manifest's JSON text.
#[pyfunction]
#[pyo3(signature = (root, kind, dtype, item_shape, codec, shards, storage_options=None))]
#[allow(clippy::too_many_arguments)]
fn commit_set(
    py: Python<'_>,
    root: String,
    kind: KindArg,
    dtype: &str,
    item_shape: Option<Vec<u64>>,
    codec: CodecArg,
    shards: Vec<(String, u64, u64)>,
    storage_options: Option<BTreeMap<String, Bound<'_, PyAny>>>,
) -> PyResult<String> {
    let storage = self::storage_options(storage_options)?;
    let schema = schema_of(py, kind.0, dtype, item_shape)?;
    let codec = codec.0;
    let entries = shards
        .into_iter()
        .map(|(path, records, bytes)| ShardEntry::new(path, records, bytes))
        .collect();
    let manifest = py
        .detach(|| loaderx::store::commit_set(&root, &schema, codec, entries, &storage))
        .py(py)?;
    Ok(String::from_utf8(manifest.to_json()).expect("JSON is UTF-8"))
}

/// Copies the committed local store or set at `local` to the empty
/// object-storage prefix `url`, in commit order.
#[pyfunction]
#[pyo3(signature = (local, url, storage_options=None))]
fn upload(
    py: Python<'_>,
    local: std::path::PathBuf,
    url: String,
    storage_options: Option<BTreeMap<String, Bound<'_, PyAny>>>,
) -> PyResult<()> {
    let storage = self::storage_options(storage_options)?;
    py.detach(|| loaderx::store::upload(&local, &url, &storage))
        .py(py)
}

fn schema_of(
    py: Python<'_>,
    kind: Kind,
    dtype: &str,
    item_shape: Option<Vec<u64>>,
) -> PyResult<Schema> {
    let dtype = DType::parse(dtype).py(py)?;
    match (kind, item_shape) {
        (Kind::Dense, Some(shape)) => Schema::dense(dtype, shape).py(py),
        (Kind::Ragged, None) => Ok(Schema::ragged(dtype)),
        _ => Err(PyValueError::new_err(
            "item_shape is given exactly for Dense stores",
        )),
    }
}

/// Storage options as the engine takes them: every value a string.
fn storage_options(
    options: Option<BTreeMap<String, Bound<'_, PyAny>>>,
) -> PyResult<StorageOptions> {
    let mut out = StorageOptions::new();
    for (key, value) in options.into_iter().flatten() {
        let text = if let Ok(b) = value.extract::<bool>() {
            // Python's True/False; object_store reads "true"/"false".
            b.to_string()
        } else {
            value.str()?.to_string()
        };
        out.insert(key, text);
    }
    Ok(out)
}

/// Native writer handle.
#[pyclass(frozen, module = "loaderx._native")]
pub struct WriterHandle {
    inner: Mutex<Option<DatasetWriter>>,
}

#[pymethods]
impl WriterHandle {
    /// Creates a store, or a store set when `shard_records` or
    /// `shard_bytes` is given. `item_shape` is given for Dense stores only;
    /// `path` is a local path or an object-storage URL; `level` is the zstd
    /// level of the frames (None: the codec's default).
    #[staticmethod]
    #[pyo3(signature = (path, kind, dtype, item_shape, codec, dict_bytes=None, shard_records=None, shard_bytes=None, storage_options=None, checksums=true, level=None))]
    #[allow(clippy::too_many_arguments)]
    fn create(
        py: Python<'_>,
        path: String,
        kind: KindArg,
        dtype: &str,
        item_shape: Option<Vec<u64>>,
        codec: CodecArg,
        dict_bytes: Option<&Bound<'_, PyBytes>>,
        shard_records: Option<u64>,
        shard_bytes: Option<u64>,
        storage_options: Option<BTreeMap<String, Bound<'_, PyAny>>>,
        checksums: bool,
        level: Option<i32>,
    ) -> PyResult<Self> {
        let storage = self::storage_options(storage_options)?;
        let codec = codec.0;
        let schema = schema_of(py, kind.0, dtype, item_shape)?;
        let dict = dict_bytes.map(|b| b.as_bytes().to_vec());
        let sharding = (shard_records.is_some() || shard_bytes.is_some()).then_some(Sharding {
            records: shard_records,
            bytes: shard_bytes,
        });
        let options = WriteOptions {
            codec,
            dict,
            sharding,
            checksums,
            level,
            storage,
        };
        let writer = py
            .detach(|| DatasetWriter::create(&path, schema, options))
            .py(py)?;
        Ok(WriterHandle {
            inner: Mutex::new(Some(writer)),
        })
    }

    /// Appends Dense records given as their C-order bytes.
    fn append_dense(&self, py: Python<'_>, data: PyReadonlyArray1<'_, u8>) -> PyResult<()> {
        let bytes = data.as_slice()?;
        self.with_writer(py, |w| w.append_dense(bytes))
    }

    /// Appends Ragged records: `items` is a list of ndarrays of `dtype`.
    fn append_ragged(
        &self,
        py: Python<'_>,
        items: &Bound<'_, PyList>,
        dtype: &Bound<'_, PyArrayDescr>,
    ) -> PyResult<()> {
        let n = items.len();
        // Keeps every array (and any contiguous copy) alive while the
        // engine reads their memory without the GIL.
        let mut arrays: Vec<Bound<'_, PyUntypedArray>> = Vec::with_capacity(n);
        let mut shapes: Vec<Vec<u64>> = Vec::with_capacity(n);
        let numpy = py.import("numpy")?;
        for (pos, item) in items.iter().enumerate() {
            let array = item.cast::<PyUntypedArray>().map_err(|_| {
                let type_name = item
                    .get_type()
                    .name()
                    .map(|s| s.to_string())
                    .unwrap_or_else(|_| "?".into());
                PyTypeError::new_err(format!(
                    "ragged records must be numpy arrays: item {pos} is {type_name} \
                     (convert it with numpy.asarray first)"
                ))
            })?;
            let item_dtype = array.dtype();
            if !item_dtype.is_equiv_to(dtype) {
                return Err(PyValueError::new_err(format!(
                    "ragged record dtype {} != store dtype {} (item {pos})",
                    item_dtype.str()?,
                    dtype.str()?
                )));
            }
            let array = if array.is_c_contiguous() {
                array.clone()
            } else {
                numpy
                    .call_method1("ascontiguousarray", (array,))?
                    .cast_into::<PyUntypedArray>()?
            };
            shapes.push(array.shape().iter().map(|&d| d as u64).collect());
            arrays.push(array);
        }
        let itemsize = dtype.itemsize();
        let records: Vec<RaggedRecord<'_>> = arrays
            .iter()
            .zip(&shapes)
            .map(|(array, shape)| {
                let len = array.shape().iter().product::<usize>() * itemsize;
                let payload: &[u8] = if len == 0 {
                    &[]
                } else {
                    // SAFETY: the array is C-contiguous, so its `len` bytes
                    // start at its data pointer; `arrays` holds a reference to
                    // it (and so to its buffer) until this call returns.
                    unsafe {
                        std::slice::from_raw_parts(
                            (*array.as_array_ptr()).fields.data as *const u8,
                            len,
                        )
                    }
                };
                RaggedRecord { shape, payload }
            })
            .collect();
        self.with_writer(py, |w| w.append_ragged(&records))
    }

    /// Commits the store (a set: its last shard, then the manifest);
    /// `durable` flushes everything to stable storage first. Returns the
    /// committed shards as `(path, records, data_bytes)` (a plain store: one
    /// entry with an empty path); a second close returns an empty list.
    #[pyo3(signature = (durable=false))]
    fn close(&self, py: Python<'_>, durable: bool) -> PyResult<Vec<(String, u64, u64)>> {
        let inner = &self.inner;
        py.detach(|| {
            let mut guard = inner.lock().expect("writer lock poisoned");
            let mut done = Vec::new();
            if let Some(w) = guard.as_mut() {
                w.close(durable)?;
                done = w
                    .shards()
                    .iter()
                    .map(|s| (s.path.clone(), s.records, s.data_bytes))
                    .collect();
            }
            *guard = None;
            Ok::<_, Error>(done)
        })
        .py(py)
    }

    /// Records appended so far.
    fn __len__(&self) -> PyResult<usize> {
        let guard = self.inner.lock().expect("writer lock poisoned");
        match guard.as_ref() {
            Some(w) => Ok(w.len() as usize),
            None => Err(closed_error("the writer")),
        }
    }

    /// Whether the store carries a dictionary.
    fn has_dict(&self) -> PyResult<bool> {
        let guard = self.inner.lock().expect("writer lock poisoned");
        match guard.as_ref() {
            Some(w) => Ok(w.has_dict()),
            None => Err(closed_error("the writer")),
        }
    }

    /// Whether `close()` has run.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.lock().expect("writer lock poisoned").is_none()
    }

    /// Shards committed so far, as `(path, records, data_bytes)`.
    fn shards(&self) -> PyResult<Vec<(String, u64, u64)>> {
        let guard = self.inner.lock().expect("writer lock poisoned");
        match guard.as_ref() {
            Some(w) => Ok(w
                .shards()
                .iter()
                .map(|s| (s.path.clone(), s.records, s.data_bytes))
                .collect()),
            None => Err(closed_error("the writer")),
        }
    }
}

impl WriterHandle {
    fn with_writer<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut DatasetWriter) -> Result<T, Error> + Send,
    ) -> PyResult<T> {
        let inner = &self.inner;
        let result = py.detach(|| {
            let mut guard = inner.lock().expect("writer lock poisoned");
            guard.as_mut().map(f)
        });
        match result {
            Some(r) => r.py(py),
            None => Err(closed_error("the writer")),
        }
    }
}

/// Native reader handle.
#[pyclass(frozen, module = "loaderx._native")]
pub struct ReaderHandle {
    inner: RwLock<Option<Arc<StoreReader>>>,
    dtype: String,
    item_shape: Option<Vec<u64>>,
    width: usize,
    codec: Codec,
    length: u64,
    has_dict: bool,
}

#[pymethods]
impl ReaderHandle {
    /// Opens a committed store (or store set) as `kind` ("dense" or
    /// "ragged"); `data_access` is "auto", "read" or "map" (None:
    /// `LOADERX_DATA_ACCESS`, else auto).
    #[staticmethod]
    #[pyo3(signature = (path, kind, data_access=None, storage_options=None, verify_checksums=false))]
    fn open(
        py: Python<'_>,
        path: String,
        kind: KindArg,
        data_access: Option<AccessArg>,
        storage_options: Option<BTreeMap<String, Bound<'_, PyAny>>>,
        verify_checksums: bool,
    ) -> PyResult<Self> {
        let options = read_options(data_access, storage_options, verify_checksums)?;
        let reader = py
            .detach(|| StoreReader::open_with_options(&path, kind.0, &options))
            .py(py)?;
        Ok(Self::of(reader))
    }

    /// Opens whichever kind of store is at `path`: `(kind, handle)`.
    #[staticmethod]
    #[pyo3(signature = (path, data_access=None, storage_options=None, verify_checksums=false))]
    fn open_any(
        py: Python<'_>,
        path: String,
        data_access: Option<AccessArg>,
        storage_options: Option<BTreeMap<String, Bound<'_, PyAny>>>,
        verify_checksums: bool,
    ) -> PyResult<(&'static str, Self)> {
        let options = read_options(data_access, storage_options, verify_checksums)?;
        let (kind, reader) = py
            .detach(|| StoreReader::probe_kind(&path, &options))
            .py(py)?;
        let name = match kind {
            Kind::Dense => "dense",
            Kind::Ragged => "ragged",
        };
        Ok((name, Self::of(reader)))
    }

    /// "frames" (zstd content checksums), "sidecar" (sums.zr) or None.
    fn checksums(&self, py: Python<'_>) -> PyResult<Option<&'static str>> {
        let reader = self.reader()?;
        Ok(match py.detach(|| reader.checksums()).py(py)? {
            Checksums::Frames => Some("frames"),
            Checksums::Sidecar => Some("sidecar"),
            Checksums::None => None,
        })
    }

    /// The store's on-disk layout: `(id, releases)`, e.g. `("2.3.3",
    /// "loaderx 2.3.3–2.8.6")`. May read the first record of a Ragged store.
    fn layout(&self, py: Python<'_>) -> PyResult<(&'static str, &'static str)> {
        let reader = self.reader()?;
        let kind = reader.schema().kind();
        let layout = py.detach(|| reader.layout()).py(py)?;
        Ok((layout.id(), layout.releases(kind)))
    }

    /// Bytes the store takes in storage (every shard's files).
    #[getter]
    fn disk_bytes(&self) -> PyResult<u64> {
        Ok(self.reader()?.disk_bytes())
    }

    /// The logical sizes of records `start..stop`, from the record table.
    fn logical_sizes<'py>(
        &self,
        py: Python<'py>,
        start: u64,
        stop: u64,
    ) -> PyResult<Bound<'py, numpy::PyArray1<i64>>> {
        let reader = self.reader()?;
        let sizes = py.detach(|| reader.logical_sizes(start..stop)).py(py)?;
        let sizes: Vec<i64> = sizes.into_iter().map(i64::from).collect();
        Ok(numpy::PyArray1::from_vec(py, sizes))
    }

    /// The stored dtype string (`dtype.str`).
    #[getter]
    fn dtype(&self) -> &str {
        &self.dtype
    }

    /// The Dense item shape, `None` for Ragged.
    #[getter]
    fn item_shape(&self) -> Option<Vec<u64>> {
        self.item_shape.clone()
    }

    /// The codec name.
    #[getter]
    fn codec(&self) -> &'static str {
        self.codec.name()
    }

    /// "map", "read" or "remote": how this reader gets at data.zr.
    #[getter]
    fn data_access(&self) -> PyResult<&'static str> {
        let reader = self.reader()?;
        Ok(match reader.data_access() {
            _ if reader.is_remote() => "remote",
            DataAccess::Map => "map",
            _ => "read",
        })
    }

    /// The path or URL the store was opened at (URLs without credentials).
    #[getter]
    fn location(&self) -> PyResult<String> {
        Ok(self.reader()?.location().to_owned())
    }

    /// The shards of a store set as `(path, records, data_bytes)`; empty for
    /// a plain store.
    fn shards(&self) -> PyResult<Vec<(String, u64, u64)>> {
        Ok(self
            .reader()?
            .manifest()
            .map(|m| {
                m.shards
                    .iter()
                    .map(|s| (s.path.clone(), s.records, s.data_bytes))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Bytes per Dense record (0 for Ragged).
    #[getter]
    fn record_width(&self) -> usize {
        self.width
    }

    /// Whether the store carries a dictionary.
    fn has_dict(&self) -> bool {
        self.has_dict
    }

    /// The dictionary bytes, or None.
    fn dict_bytes<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let reader = self.reader()?;
        Ok(reader.dict_bytes().map(|d| PyBytes::new(py, d)))
    }

    fn __len__(&self) -> usize {
        self.length as usize
    }

    /// Whether `close()` has run.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.read().expect("reader lock poisoned").is_none()
    }

    /// Releases the store (its maps and lock) once no gather uses it.
    fn close(&self) {
        self.inner.write().expect("reader lock poisoned").take();
    }

    /// Mean logical bytes per record over up to `probe` evenly spread records.
    fn mean_record_bytes(&self, py: Python<'_>, probe: u64) -> PyResult<f64> {
        let reader = self.reader()?;
        py.detach(|| reader.mean_record_bytes(probe)).py(py)
    }

    /// Gathers Dense records `indices` into a new `(n, *item_shape)` array of
    /// `dtype`, whose memory comes from (and returns to) the batch-buffer cache.
    fn gather_dense_array<'py>(
        &self,
        py: Python<'py>,
        indices: PyReadonlyArray1<'_, i64>,
        dtype: &Bound<'py, PyArrayDescr>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let reader = self.reader()?;
        let indices = to_indices(indices.as_slice()?, self.length)?;
        let data = py.detach(|| reader.gather_dense(&indices)).py(py)?;
        let mut shape = vec![indices.len() as npy_intp];
        shape.extend(self.item_shape.iter().flatten().map(|&d| d as npy_intp));
        dense_array(py, data, shape, dtype)
    }

    /// Gathers Ragged records `indices` as a list of arrays of `dtype` that
    /// view one shared buffer.
    fn gather_ragged<'py>(
        &self,
        py: Python<'py>,
        indices: PyReadonlyArray1<'_, i64>,
        dtype: &Bound<'py, PyArrayDescr>,
    ) -> PyResult<Bound<'py, PyList>> {
        let reader = self.reader()?;
        let indices = to_indices(indices.as_slice()?, self.length)?;
        let batch = py.detach(|| reader.gather_ragged(&indices)).py(py)?;
        ragged_list(py, batch, dtype)
    }

    /// Gathers Ragged records `indices` packed back to back:
    /// `(values, cu_seqlens, shapes)`.
    fn gather_packed<'py>(
        &self,
        py: Python<'py>,
        indices: PyReadonlyArray1<'_, i64>,
        dtype: &Bound<'py, PyArrayDescr>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let reader = self.reader()?;
        let indices = to_indices(indices.as_slice()?, self.length)?;
        let packed = py
            .detach(|| reader.gather_ragged(&indices)?.into_packed())
            .py(py)?;
        packed_tuple(py, packed, dtype)
    }
}

fn read_options(
    data_access: Option<AccessArg>,
    storage_options: Option<BTreeMap<String, Bound<'_, PyAny>>>,
    verify_checksums: bool,
) -> PyResult<ReadOptions> {
    Ok(ReadOptions {
        access: AccessArg::or_env(data_access),
        verify_checksums,
        storage: self::storage_options(storage_options)?,
    })
}

impl ReaderHandle {
    fn of(reader: StoreReader) -> Self {
        let schema = reader.schema().clone();
        let item_shape = match &schema {
            Schema::Dense { item_shape, .. } => Some(item_shape.clone()),
            Schema::Ragged { .. } => None,
        };
        ReaderHandle {
            dtype: schema.dtype().descr().to_owned(),
            item_shape,
            width: schema.record_width().unwrap_or(0) as usize,
            codec: reader.codec(),
            length: reader.len(),
            has_dict: reader.dict_bytes().is_some(),
            inner: RwLock::new(Some(Arc::new(reader))),
        }
    }

    /// The Dense item shape, None for Ragged.
    pub(crate) fn item_shape_dims(&self) -> Option<&[u64]> {
        self.item_shape.as_deref()
    }

    pub(crate) fn reader(&self) -> PyResult<Arc<StoreReader>> {
        self.inner
            .read()
            .expect("reader lock poisoned")
            .clone()
            .ok_or_else(|| closed_error("the reader"))
    }
}

/// Converts Python indices, refusing negative ones with an IndexError.
fn to_indices(indices: &[i64], length: u64) -> PyResult<Vec<u64>> {
    indices
        .iter()
        .map(|&i| {
            u64::try_from(i).map_err(|_| {
                PyIndexError::new_err(format!(
                    "index {i} is out of range for a store of {length} records"
                ))
            })
        })
        .collect()
}
