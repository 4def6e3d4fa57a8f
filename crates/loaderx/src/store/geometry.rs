//! Record geometry: how a logical record maps to the bytes of one frame.
//!
//! Dense records are exactly `width` bytes of C-order data. A Ragged record is
//! its shape followed by its data, `[u64 ndim][u64 dim; ndim][payload]`, all
//! little-endian, so shape and payload share one frame and one table entry.

use crate::error::{Error, Result};
use crate::format::MAX_RECORD_BYTES;

/// Largest rank a Ragged record may have (NumPy's own limit is 64).
pub const MAX_NDIM: u64 = 64;

/// One Ragged record to append: its shape and its C-order bytes.
#[derive(Clone, Copy, Debug)]
pub struct RaggedRecord<'a> {
    /// The record's shape (empty for a 0-d scalar).
    pub shape: &'a [u64],
    /// `prod(shape) * itemsize` bytes of C-order data.
    pub payload: &'a [u8],
}

impl RaggedRecord<'_> {
    /// Size of the encoded record: shape prefix plus payload.
    pub fn encoded_len(&self) -> u64 {
        8 * (1 + self.shape.len() as u64) + self.payload.len() as u64
    }

    /// Appends the encoded record to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len() as usize);
        out.extend_from_slice(&(self.shape.len() as u64).to_le_bytes());
        for d in self.shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(self.payload);
    }

    /// Checks the record before anything is written: a payload that matches
    /// its shape, is not empty, and encodes to at most 2^31 bytes.
    pub fn validate(&self, position: usize, itemsize: u64) -> Result<()> {
        if self.shape.len() as u64 > MAX_NDIM {
            return Err(Error::InvalidArgument(format!(
                "record {position}: rank {} exceeds {MAX_NDIM}",
                self.shape.len()
            )));
        }
        let expected = self
            .shape
            .iter()
            .try_fold(itemsize, |acc, &d| acc.checked_mul(d));
        if expected != Some(self.payload.len() as u64) {
            return Err(Error::InvalidArgument(format!(
                "record {position}: {} payload bytes do not match shape {:?} with itemsize {itemsize}",
                self.payload.len(),
                self.shape
            )));
        }
        if self.payload.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "empty records are not stored — a record must be non-empty: record {position} has shape {:?}",
                self.shape
            )));
        }
        if self.encoded_len() > MAX_RECORD_BYTES {
            return Err(Error::InvalidArgument(format!(
                "record {position}: encodes to {} bytes, over the 2^31-byte record limit",
                self.encoded_len()
            )));
        }
        Ok(())
    }
}

/// Parses the shape prefix of decoded Ragged record `index`, appending its
/// dims to `dims` and returning the length of the prefix. The dims must
/// account for exactly the payload that follows.
pub fn parse_ragged(
    index: u64,
    record: &[u8],
    itemsize: u64,
    dims: &mut Vec<u64>,
) -> Result<usize> {
    let corrupt = |why: String| Error::Corrupt(format!("ragged record {index}: {why}"));
    if record.len() < 8 {
        return Err(corrupt(format!(
            "{} bytes cannot hold a shape prefix",
            record.len()
        )));
    }
    let ndim = u64::from_le_bytes(record[0..8].try_into().expect("8 bytes"));
    if ndim > MAX_NDIM {
        return Err(corrupt(format!("rank {ndim} exceeds {MAX_NDIM}")));
    }
    parse_dims(index, record, 8, 8, ndim as usize, itemsize, dims)
}

/// Parses the `ndim` dims of decoded Ragged record `index`, each `width`
/// bytes (8 or 4, little-endian) from byte `at`, appending them to `dims`;
/// returns the prefix length. The dims must account for exactly the
/// non-empty payload that follows. Shared by every Ragged prefix encoding
/// (see `layout::RaggedPrefix`).
#[inline]
pub(crate) fn parse_dims(
    index: u64,
    record: &[u8],
    at: usize,
    width: usize,
    ndim: usize,
    itemsize: u64,
    dims: &mut Vec<u64>,
) -> Result<usize> {
    let corrupt = |why: String| Error::Corrupt(format!("ragged record {index}: {why}"));
    let header = at + width * ndim;
    if record.len() < header {
        return Err(corrupt(format!(
            "{} bytes cannot hold a rank-{ndim} shape prefix",
            record.len()
        )));
    }
    let start = dims.len();
    let mut elements: Option<u64> = Some(1);
    for chunk in record[at..header].chunks_exact(width) {
        let d = match width {
            8 => u64::from_le_bytes(chunk.try_into().expect("8 bytes")),
            _ => u32::from_le_bytes(chunk.try_into().expect("4 bytes")) as u64,
        };
        elements = elements.and_then(|e| e.checked_mul(d));
        dims.push(d);
    }
    let payload = (record.len() - header) as u64;
    if elements.and_then(|e| e.checked_mul(itemsize)) != Some(payload) || payload == 0 {
        let shape = dims[start..].to_vec();
        dims.truncate(start);
        return Err(corrupt(format!(
            "shape {shape:?} does not describe its {payload}-byte payload"
        )));
    }
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_parse_round_trip() {
        let payload = [0u8; 24];
        let rec = RaggedRecord {
            shape: &[2, 3],
            payload: &payload,
        };
        rec.validate(0, 4).unwrap();
        let mut buf = Vec::new();
        rec.encode_into(&mut buf);
        assert_eq!(buf.len() as u64, rec.encoded_len());
        assert_eq!(&buf[..8], &2u64.to_le_bytes());
        let mut dims = Vec::new();
        assert_eq!(parse_ragged(0, &buf, 4, &mut dims).unwrap(), 24);
        assert_eq!(dims, vec![2, 3]);
    }

    #[test]
    fn scalar_record() {
        let payload = 3.5f64.to_le_bytes();
        let rec = RaggedRecord {
            shape: &[],
            payload: &payload,
        };
        let mut buf = Vec::new();
        rec.encode_into(&mut buf);
        let mut dims = Vec::new();
        assert_eq!(parse_ragged(0, &buf, 8, &mut dims).unwrap(), 8);
        assert!(dims.is_empty());
    }

    #[test]
    fn validation_failures() {
        let p = [0u8; 8];
        assert!(RaggedRecord {
            shape: &[3],
            payload: &p
        }
        .validate(0, 4)
        .is_err());
        assert!(RaggedRecord {
            shape: &[0],
            payload: &[]
        }
        .validate(0, 4)
        .is_err());
        assert!(RaggedRecord {
            shape: &[u64::MAX, 2],
            payload: &p
        }
        .validate(0, 4)
        .is_err());
    }

    #[test]
    fn hostile_prefixes() {
        let mut dims = Vec::new();
        assert!(parse_ragged(0, &[1, 2, 3], 1, &mut dims).is_err());
        let mut rec = u64::MAX.to_le_bytes().to_vec();
        rec.extend_from_slice(&[0; 16]);
        assert!(parse_ragged(0, &rec, 1, &mut dims).is_err());
        let mut rec = 1u64.to_le_bytes().to_vec();
        rec.extend_from_slice(&u64::MAX.to_le_bytes());
        rec.extend_from_slice(&[0; 4]);
        assert!(parse_ragged(0, &rec, 4, &mut dims).is_err());
        let mut rec = 1u64.to_le_bytes().to_vec();
        rec.extend_from_slice(&2u64.to_le_bytes());
        rec.extend_from_slice(&[0; 4]);
        assert!(parse_ragged(0, &rec, 4, &mut dims).is_err());
        assert!(dims.is_empty());
    }
}
