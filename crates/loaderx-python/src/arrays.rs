//! NumPy arrays over engine-owned buffers, built without copying.
//!
//! An engine `Vec<u8>` becomes a [`BatchBuffer`]; typed arrays are created
//! as views of it with the store's dtype and shapes, so each batch is one
//! allocation however many records it holds. When the last view is freed,
//! the buffer goes back to the engine's batch-buffer cache.

use std::ffi::c_void;
use std::ptr::NonNull;

use loaderx::buffers::Buf;
use loaderx::lent::{BatchBytes, LentBuffer};
use loaderx::shape::{PaddedBatch, RowPackedBatch};
use loaderx::store::{PackedBatch, RaggedBatch};
use numpy::npyffi::{self, npy_intp, NpyTypes, NPY_ARRAY_WRITEABLE, PY_ARRAY_API};
use numpy::{PyArrayDescr, PyArrayDescrMethods};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

/// The memory behind one batch's arrays: an engine buffer, reached by
/// NumPy only through the pointer taken when it was wrapped, so NumPy may
/// write through its views without aliasing any Rust reference. Dropping it
/// (when the last view dies) recycles the buffer.
#[pyclass(frozen, module = "loaderx._native")]
pub struct BatchBuffer {
    ptr: NonNull<u8>,
    len: usize,
    // Some until dropped; never read or written from Rust meanwhile.
    buf: Option<Buf>,
}

// SAFETY: the buffer is plain heap memory owned by this object alone; Rust
// never reads or writes it after construction except to recycle it in
// `Drop`, and NumPy accesses it under the GIL like any other array memory.
unsafe impl Send for BatchBuffer {}
// SAFETY: as above; the struct itself is immutable.
unsafe impl Sync for BatchBuffer {}

impl BatchBuffer {
    fn wrap(py: Python<'_>, mut data: Buf) -> PyResult<Bound<'_, BatchBuffer>> {
        let buffer = BatchBuffer {
            // The pointer is taken once, before NumPy sees the memory.
            ptr: NonNull::new(data.as_mut_ptr()).expect("buffer pointers are non-null"),
            len: data.len(),
            buf: Some(data),
        };
        Bound::new(py, buffer)
    }
}

impl Drop for BatchBuffer {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            loaderx::buffers::recycle(buf);
        }
    }
}

/// Memory lent by the consumer (see `loaderx::lent`) behind one batch's
/// array; dropping it (when the last view dies) returns the region to its
/// pool.
#[pyclass(frozen, module = "loaderx._native")]
pub struct LentMemory {
    ptr: NonNull<u8>,
    len: usize,
    // Never touched again from Rust: NumPy owns all access until the drop.
    _buffer: LentBuffer,
}

// SAFETY: the region is reached only through the pointer NumPy was given,
// under the GIL; the buffer itself is only dropped, which returns the region
// to its (Mutex-guarded) pool, from whichever thread drops the last view.
unsafe impl Send for LentMemory {}
// SAFETY: as above; the struct itself is immutable.
unsafe impl Sync for LentMemory {}

impl LentMemory {
    fn wrap(py: Python<'_>, mut buffer: LentBuffer) -> PyResult<Bound<'_, LentMemory>> {
        let len = buffer.len();
        // The pointer is taken once, before NumPy sees the memory.
        let ptr = NonNull::new(buffer.as_mut_ptr()).expect("slice pointers are non-null");
        Bound::new(
            py,
            LentMemory {
                ptr,
                len,
                _buffer: buffer,
            },
        )
    }
}

/// A writable C-contiguous array of `dtype` and `shape` over `data`
/// (which must hold exactly `prod(shape) * itemsize` bytes).
pub fn dense_array<'py>(
    py: Python<'py>,
    data: impl Into<BatchBytes>,
    shape: Vec<npy_intp>,
    dtype: &Bound<'py, PyArrayDescr>,
) -> PyResult<Bound<'py, PyAny>> {
    match data.into() {
        BatchBytes::Heap(v) => {
            let base = BatchBuffer::wrap(py, v)?;
            let (ptr, len) = (base.get().ptr, base.get().len);
            view(py, base.as_any(), ptr, len, 0, shape, dtype)
        }
        BatchBytes::Lent(b) => {
            let base = LentMemory::wrap(py, b)?;
            let (ptr, len) = (base.get().ptr, base.get().len);
            view(py, base.as_any(), ptr, len, 0, shape, dtype)
        }
    }
}

/// Wraps a packed Ragged batch as `(values, cu_seqlens, shapes)`: a 1-D
/// `dtype` array of every element, int32 offsets (n + 1, from 0) and an int64
/// `(n, ndim)` array of shapes.
pub fn packed_tuple<'py>(
    py: Python<'py>,
    batch: PackedBatch,
    dtype: &Bound<'py, PyArrayDescr>,
) -> PyResult<Bound<'py, PyTuple>> {
    let n = batch.len();
    let elements = *batch.cu_seqlens.last().unwrap_or(&0) as npy_intp;
    let values = dense_array(py, batch.values, vec![elements], dtype)?;
    // Offsets and shapes go into aligned engine buffers too, so every array
    // of the tuple crosses DLPack without a copy (see `loaderx::buffers`).
    let cu_bytes: Vec<u8> = batch
        .cu_seqlens
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let cu_seqlens = dense_array(
        py,
        aligned_copy(&cu_bytes)?,
        vec![batch.cu_seqlens.len() as npy_intp],
        &numpy::dtype::<i32>(py),
    )?;
    let shape_bytes: Vec<u8> = batch
        .shapes
        .iter()
        .flat_map(|&d| (d as i64).to_le_bytes())
        .collect();
    let shapes = dense_array(
        py,
        aligned_copy(&shape_bytes)?,
        vec![n as npy_intp, batch.ndim as npy_intp],
        &numpy::dtype::<i64>(py),
    )?;
    PyTuple::new(py, [values, cu_seqlens, shapes])
}

/// `bytes` in an aligned engine buffer (MemoryError when that fails: never
/// a panic across the FFI boundary).
fn aligned_copy(bytes: &[u8]) -> PyResult<Buf> {
    Buf::try_from_slice(bytes).ok_or_else(|| {
        pyo3::exceptions::PyMemoryError::new_err(format!(
            "cannot allocate {} bytes for a batch array",
            bytes.len()
        ))
    })
}

/// Little-endian i32s in an aligned engine buffer, so a small int array
/// crosses DLPack without a copy like the others.
fn i32_buf(values: &[i32]) -> PyResult<Buf> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    aligned_copy(&bytes)
}

fn dims(first: &[usize], rest: &[u64]) -> Vec<npy_intp> {
    first
        .iter()
        .map(|&d| d as npy_intp)
        .chain(rest.iter().map(|&d| d as npy_intp))
        .collect()
}

/// A padded batch as its arrays: values `[rows, length, *rest]` of
/// `dtype`, then a bool `[rows, length]` mask and int32 `[rows]` lengths
/// when the batch has them.
pub fn padded_arrays<'py>(
    py: Python<'py>,
    batch: PaddedBatch,
    dtype: &Bound<'py, PyArrayDescr>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let (rows, length) = (batch.rows, batch.length);
    let mut out = vec![dense_array(
        py,
        batch.values,
        dims(&[rows, length], &batch.rest),
        dtype,
    )?];
    if let Some(mask) = batch.mask {
        let shape = dims(&[rows, length], &[]);
        out.push(dense_array(py, mask, shape, &numpy::dtype::<bool>(py))?);
    }
    if let Some(lengths) = batch.lengths {
        out.push(dense_array(
            py,
            i32_buf(&lengths)?,
            dims(&[rows], &[]),
            &numpy::dtype::<i32>(py),
        )?);
    }
    Ok(out)
}

/// A batch packed into rows as its arrays: values `[rows, max_tokens,
/// *rest]` of `dtype`, int32 segment ids and positions `[rows, max_tokens]`,
/// int32 placement `[records, 3]` and the int32 0-d count of dropped records.
pub fn row_packed_arrays<'py>(
    py: Python<'py>,
    batch: RowPackedBatch,
    dtype: &Bound<'py, PyArrayDescr>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let (rows, mt) = (batch.rows, batch.max_tokens);
    let int32 = numpy::dtype::<i32>(py);
    let records = batch.placement.len() / 3;
    let dropped = i32::try_from(batch.dropped).unwrap_or(i32::MAX);
    Ok(vec![
        dense_array(py, batch.values, dims(&[rows, mt], &batch.rest), dtype)?,
        dense_array(py, batch.segment_ids, dims(&[rows, mt], &[]), &int32)?,
        dense_array(py, batch.positions, dims(&[rows, mt], &[]), &int32)?,
        dense_array(
            py,
            i32_buf(&batch.placement)?,
            dims(&[records, 3], &[]),
            &int32,
        )?,
        dense_array(py, i32_buf(&[dropped])?, Vec::new(), &int32)?,
    ])
}

/// Wraps a Ragged batch as a list of arrays viewing one buffer.
pub fn ragged_list<'py>(
    py: Python<'py>,
    batch: RaggedBatch,
    dtype: &Bound<'py, PyArrayDescr>,
) -> PyResult<Bound<'py, PyList>> {
    let n = batch.len();
    let shapes: Vec<Vec<npy_intp>> = (0..n)
        .map(|i| batch.shape(i).iter().map(|&d| d as npy_intp).collect())
        .collect();
    let offsets: Vec<usize> = (0..n).map(|i| batch.payload_range(i).start).collect();
    let base = BatchBuffer::wrap(py, batch.into_data())?;
    let (ptr, len) = (base.get().ptr, base.get().len);
    let list = PyList::empty(py);
    for (shape, offset) in shapes.into_iter().zip(offsets) {
        list.append(view(py, base.as_any(), ptr, len, offset, shape, dtype)?)?;
    }
    Ok(list)
}

/// A view of the `len` bytes at `ptr`, which `base` owns, from `offset` as
/// a C-contiguous `dtype` array of `shape`.
fn view<'py>(
    py: Python<'py>,
    base: &Bound<'py, PyAny>,
    ptr: NonNull<u8>,
    len: usize,
    offset: usize,
    mut shape: Vec<npy_intp>,
    dtype: &Bound<'py, PyArrayDescr>,
) -> PyResult<Bound<'py, PyAny>> {
    let bytes = shape.iter().map(|&d| d as usize).product::<usize>() * dtype.itemsize();
    if offset + bytes > len {
        return Err(pyo3::exceptions::PyRuntimeError::new_err(
            "internal error: array view outside its buffer",
        ));
    }
    // SAFETY: the view lies inside the base's `len` bytes (checked above).
    // The base's data pointer is valid while `base` lives, and the view keeps
    // `base` alive through its base-object reference. PyArray_NewFromDescr
    // steals one reference to the descriptor, so we add one first;
    // PyArray_SetBaseObject steals one reference to the base, so we add one
    // too. Null results are turned into the pending Python exception.
    unsafe {
        let data = ptr.as_ptr().add(offset) as *mut c_void;
        let descr = dtype.as_dtype_ptr();
        pyo3::ffi::Py_INCREF(descr.cast());
        let array_type = npyffi::get_type_object(py, NpyTypes::PyArray_Type);
        let ptr = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            array_type,
            descr,
            shape.len() as i32,
            shape.as_mut_ptr(),
            std::ptr::null_mut(),
            data,
            NPY_ARRAY_WRITEABLE,
            std::ptr::null_mut(),
        );
        let array = Bound::from_owned_ptr_or_err(py, ptr)?;
        pyo3::ffi::Py_INCREF(base.as_ptr());
        if PY_ARRAY_API.PyArray_SetBaseObject(py, ptr.cast(), base.as_ptr()) < 0 {
            return Err(PyErr::fetch(py));
        }
        Ok(array)
    }
}
