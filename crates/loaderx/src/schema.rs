//! The typed record schema: a NumPy dtype string, plus the item shape for
//! Dense stores, serialised as one MessagePack map in the static page.
//!
//! The schema is the only authority for record geometry: a Dense record's
//! width is derived from it, never stored separately. Decoding is strict: the
//! map must hold exactly the keys of its store kind.

use crate::error::{Error, Result};
use crate::format::{MAX_RECORD_BYTES, SCHEMA_CAPACITY};

/// A NumPy dtype in its `dtype.str` form (`"<f4"`, `"|u1"`, `"<M8[ns]"`, ...).
///
/// The engine only needs the item size; the full meaning of the string is
/// NumPy's. Object dtypes (`"|O"`) are refused because their bytes are
/// pointers. Structured and subarray dtypes print as plain `"|V<n>"` and are
/// refused by the Python layer, which can see their fields.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DType {
    descr: String,
    itemsize: u64,
}

impl DType {
    /// Parses a `dtype.str` string.
    ///
    /// ```
    /// use loaderx::schema::DType;
    /// assert_eq!(DType::parse("<f4").unwrap().itemsize(), 4);
    /// assert_eq!(DType::parse("<U5").unwrap().itemsize(), 20);
    /// assert_eq!(DType::parse("<M8[ns]").unwrap().itemsize(), 8);
    /// assert!(DType::parse("|O").is_err());
    /// // ml-dtypes types are stored by name.
    /// assert_eq!(DType::parse("bfloat16").unwrap().itemsize(), 2);
    /// ```
    pub fn parse(descr: &str) -> Result<DType> {
        if let Some(itemsize) = ml_dtype_itemsize(descr) {
            return Ok(DType {
                descr: descr.to_owned(),
                itemsize,
            });
        }
        let bad = |why: &str| Error::InvalidArgument(format!("unsupported dtype {descr:?}: {why}"));
        let bytes = descr.as_bytes();
        if bytes.len() < 2 {
            return Err(bad("expected a byte-order character, a kind and a size"));
        }
        if !matches!(bytes[0], b'<' | b'>' | b'|' | b'=') {
            return Err(bad("the first character must be one of < > | ="));
        }
        let kind = bytes[1];
        let rest = &descr[2..];
        let (digits, unit) = match rest.find('[') {
            Some(pos) => (&rest[..pos], Some(&rest[pos..])),
            None => (rest, None),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 12 {
            return Err(bad("the size must be a decimal number"));
        }
        let size: u64 = digits
            .parse()
            .map_err(|_| bad("the size must be a decimal number"))?;
        let itemsize = match kind {
            b'b' | b'i' | b'u' | b'f' | b'c' | b'S' | b'V' => size,
            b'U' => size * 4,
            b'm' | b'M' => size,
            b'O' => return Err(bad("object dtypes hold pointers, not data")),
            _ => return Err(bad("unknown kind")),
        };
        match (kind, unit) {
            (b'm' | b'M', Some(u)) if u.len() >= 3 && u.ends_with(']') => {}
            (b'm' | b'M', None) => {}
            (_, None) => {}
            _ => return Err(bad("only datetime and timedelta dtypes carry a unit")),
        }
        if itemsize == 0 {
            return Err(bad("zero-sized items cannot be stored"));
        }
        Ok(DType {
            descr: descr.to_owned(),
            itemsize,
        })
    }

    /// The `dtype.str` string.
    pub fn descr(&self) -> &str {
        &self.descr
    }

    /// Bytes per item.
    pub fn itemsize(&self) -> u64 {
        self.itemsize
    }
}

/// Machine-learning types of the `ml-dtypes` package, stored by name: NumPy
/// prints them as opaque void types (`"<V2"`) or, for `float8_e5m2`, as a
/// string it cannot parse back (`"<f1"`). Little-endian, like the format.
pub const ML_DTYPES: [(&str, u64); 16] = [
    ("bfloat16", 2),
    ("float8_e3m4", 1),
    ("float8_e4m3", 1),
    ("float8_e4m3b11fnuz", 1),
    ("float8_e4m3fn", 1),
    ("float8_e4m3fnuz", 1),
    ("float8_e5m2", 1),
    ("float8_e5m2fnuz", 1),
    ("float8_e8m0fnu", 1),
    ("float6_e2m3fn", 1),
    ("float6_e3m2fn", 1),
    ("float4_e2m1fn", 1),
    ("int2", 1),
    ("int4", 1),
    ("uint2", 1),
    ("uint4", 1),
];

/// The item size of the ml-dtypes type named `name`, if it is one.
fn ml_dtype_itemsize(name: &str) -> Option<u64> {
    ML_DTYPES
        .iter()
        .find(|(known, _)| *known == name)
        .map(|&(_, size)| size)
}

/// The schema of a store, which also selects its geometry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Schema {
    /// Fixed-shape records of `prod(item_shape) * itemsize` bytes.
    Dense {
        /// Element type.
        dtype: DType,
        /// Shape of one record (empty for scalars).
        item_shape: Vec<u64>,
    },
    /// Records of one dtype and any shape, each prefixed by its shape.
    Ragged {
        /// Element type.
        dtype: DType,
    },
}

/// Which contract a store follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Fixed-shape records.
    Dense,
    /// Variable-shape records.
    Ragged,
}

impl Kind {
    /// `"Dense"` or `"Ragged"`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Dense => "Dense",
            Kind::Ragged => "Ragged",
        }
    }
}

impl Schema {
    /// A Dense schema, checking that the record width is in `1..=2^31` bytes.
    pub fn dense(dtype: DType, item_shape: Vec<u64>) -> Result<Schema> {
        dense_width(&dtype, &item_shape)?;
        Ok(Schema::Dense { dtype, item_shape })
    }

    /// A Ragged schema.
    pub fn ragged(dtype: DType) -> Schema {
        Schema::Ragged { dtype }
    }

    /// The store kind.
    pub fn kind(&self) -> Kind {
        match self {
            Schema::Dense { .. } => Kind::Dense,
            Schema::Ragged { .. } => Kind::Ragged,
        }
    }

    /// The element type.
    pub fn dtype(&self) -> &DType {
        match self {
            Schema::Dense { dtype, .. } | Schema::Ragged { dtype } => dtype,
        }
    }

    /// The Dense record width in bytes; `None` for Ragged.
    pub fn record_width(&self) -> Option<u64> {
        match self {
            // Validated on construction.
            Schema::Dense { dtype, item_shape } => dense_width(dtype, item_shape).ok(),
            Schema::Ragged { .. } => None,
        }
    }

    /// Serialises the schema as loaderx 2.0.0 does: a MessagePack map with
    /// `dtype` first, then `item_shape` for Dense.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        // Writing into a Vec cannot fail.
        match self {
            Schema::Dense { dtype, item_shape } => {
                rmp::encode::write_map_len(&mut out, 2).expect("vec write");
                rmp::encode::write_str(&mut out, "dtype").expect("vec write");
                rmp::encode::write_str(&mut out, dtype.descr()).expect("vec write");
                rmp::encode::write_str(&mut out, "item_shape").expect("vec write");
                rmp::encode::write_array_len(&mut out, item_shape.len() as u32).expect("vec write");
                for &d in item_shape {
                    rmp::encode::write_uint(&mut out, d).expect("vec write");
                }
            }
            Schema::Ragged { dtype } => {
                rmp::encode::write_map_len(&mut out, 1).expect("vec write");
                rmp::encode::write_str(&mut out, "dtype").expect("vec write");
                rmp::encode::write_str(&mut out, dtype.descr()).expect("vec write");
            }
        }
        out
    }

    /// Parses schema bytes for a store opened as `kind`.
    ///
    /// A map whose keys are not exactly those of `kind` is a [`Error::Schema`]
    /// error naming the fields; bytes that are not a MessagePack map of the
    /// expected value types are [`Error::InvalidFormat`].
    pub fn decode(bytes: &[u8], kind: Kind) -> Result<Schema> {
        let malformed =
            |why: &str| Error::InvalidFormat(format!("schema is not valid MessagePack: {why}"));
        let mut rd = bytes;
        // A well-formed value that is not a map has the wrong fields (none).
        let entries = match rmp::decode::read_map_len(&mut rd) {
            Ok(n) => n,
            Err(_) if !bytes.is_empty() && bytes[0] != 0xc1 => {
                return Err(Error::Schema(format!(
                    "{}: the schema is not a map",
                    schema_fields_prefix(kind)
                )))
            }
            Err(_) => return Err(malformed("expected a map at the top level")),
        };
        let mut dtype: Option<String> = None;
        let mut shape: Option<Vec<u64>> = None;
        let mut keys = Vec::new();
        for _ in 0..entries {
            let (key, rest) = rmp::decode::read_str_from_slice(rd)
                .map_err(|_| malformed("expected string keys"))?;
            rd = rest;
            keys.push(key.to_owned());
            match key {
                "dtype" if dtype.is_none() => {
                    let (value, rest) = rmp::decode::read_str_from_slice(rd)
                        .map_err(|_| malformed("dtype must be a string"))?;
                    rd = rest;
                    dtype = Some(value.to_owned());
                }
                "item_shape" if shape.is_none() => {
                    let n = rmp::decode::read_array_len(&mut rd)
                        .map_err(|_| malformed("item_shape must be an array"))?;
                    // Each element takes at least one byte, which bounds the
                    // allocation by the schema's own size.
                    if n as usize > rd.len() {
                        return Err(malformed("item_shape is longer than the schema"));
                    }
                    let mut dims = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        let d: u64 = rmp::decode::read_int(&mut rd).map_err(|_| {
                            malformed("item_shape entries must be non-negative integers")
                        })?;
                        dims.push(d);
                    }
                    shape = Some(dims);
                }
                _ => {
                    // An unknown or repeated key: the field set is wrong.
                    return Err(schema_fields_error(kind, &keys));
                }
            }
        }
        if !rd.is_empty() {
            return Err(malformed("trailing bytes after the map"));
        }
        let wanted_shape = kind == Kind::Dense;
        if dtype.is_none() || shape.is_some() != wanted_shape {
            return Err(schema_fields_error(kind, &keys));
        }
        let dtype = DType::parse(dtype.as_deref().expect("checked"))
            .map_err(|e| Error::InvalidFormat(format!("schema dtype: {e}")))?;
        match kind {
            Kind::Dense => {
                let item_shape = shape.expect("checked");
                Schema::dense(dtype, item_shape)
                    .map_err(|e| Error::InvalidFormat(format!("schema: {e}")))
            }
            Kind::Ragged => Ok(Schema::Ragged { dtype }),
        }
    }

    /// Encodes and checks that the schema fits the static page.
    pub fn encode_checked(&self) -> Result<Vec<u8>> {
        let bytes = self.encode();
        if bytes.len() > SCHEMA_CAPACITY {
            return Err(Error::InvalidArgument(format!(
                "the encoded schema takes {} bytes, more than the {SCHEMA_CAPACITY} available",
                bytes.len()
            )));
        }
        Ok(bytes)
    }
}

/// loaderx 2.0.0's words for a schema that does not have exactly the
/// kind's fields; the engine's details follow them.
pub(crate) fn schema_fields_prefix(kind: Kind) -> &'static str {
    match kind {
        Kind::Dense => "invalid dense schema fields, expected ['dtype', 'item_shape']",
        Kind::Ragged => "invalid ragged schema fields, expected ['dtype']",
    }
}

fn schema_fields_error(kind: Kind, found: &[String]) -> Error {
    Error::Schema(format!(
        "{}: the store has {found:?}",
        schema_fields_prefix(kind)
    ))
}

/// `prod(item_shape) * itemsize`, checked to lie in `1..=2^31`.
pub fn dense_width(dtype: &DType, item_shape: &[u64]) -> Result<u64> {
    let width = item_shape
        .iter()
        .try_fold(dtype.itemsize(), |acc, &d| acc.checked_mul(d));
    match width {
        Some(w) if (1..=MAX_RECORD_BYTES).contains(&w) => Ok(w),
        _ => Err(Error::InvalidArgument(format!(
            "record width prod(item_shape {item_shape:?}) * itemsize {} must be 1..=2^31 bytes",
            dtype.itemsize()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_bytes_match_loaderx_2() {
        // meta.zr bytes 32.. of the dense_f32_raw fixture.
        let expected = b"\x82\xa5dtype\xa3<f4\xaaitem_shape\x93\x03\x05\x07";
        let s = Schema::dense(DType::parse("<f4").unwrap(), vec![3, 5, 7]).unwrap();
        assert_eq!(s.encode(), expected);
        assert_eq!(Schema::decode(expected, Kind::Dense).unwrap(), s);
        assert_eq!(s.record_width(), Some(420));
    }

    #[test]
    fn ragged_bytes_match_loaderx_2() {
        let expected = b"\x81\xa5dtype\xa3<i4";
        let s = Schema::ragged(DType::parse("<i4").unwrap());
        assert_eq!(s.encode(), expected);
        assert_eq!(Schema::decode(expected, Kind::Ragged).unwrap(), s);
    }

    #[test]
    fn wide_dims_round_trip() {
        let s = Schema::dense(DType::parse("|u1").unwrap(), vec![70000, 1, 300]).unwrap();
        assert_eq!(Schema::decode(&s.encode(), Kind::Dense).unwrap(), s);
        let scalar = Schema::dense(DType::parse("<i8").unwrap(), vec![]).unwrap();
        assert_eq!(scalar.record_width(), Some(8));
        assert_eq!(
            Schema::decode(&scalar.encode(), Kind::Dense).unwrap(),
            scalar
        );
    }

    #[test]
    fn field_set_is_strict() {
        let ragged = Schema::ragged(DType::parse("<i4").unwrap()).encode();
        let err = Schema::decode(&ragged, Kind::Dense).unwrap_err();
        assert!(matches!(err, Error::Schema(_)));
        assert!(err.to_string().contains("schema fields"), "{err}");
        let dense = Schema::dense(DType::parse("<i4").unwrap(), vec![2])
            .unwrap()
            .encode();
        assert!(matches!(
            Schema::decode(&dense, Kind::Ragged),
            Err(Error::Schema(_))
        ));
        let extra = b"\x82\xa5dtype\xa3<i4\xa4meta\xa1x";
        assert!(matches!(
            Schema::decode(extra, Kind::Ragged),
            Err(Error::Schema(_))
        ));
        // A valid MessagePack value that is not a map has the wrong fields;
        // bytes that are not MessagePack at all are a format error.
        assert!(matches!(
            Schema::decode(b"\x93\x01\x02\x03", Kind::Ragged),
            Err(Error::Schema(_))
        ));
        assert!(matches!(
            Schema::decode(b"\xc1", Kind::Ragged),
            Err(Error::InvalidFormat(_))
        ));
        assert!(matches!(
            Schema::decode(b"", Kind::Ragged),
            Err(Error::InvalidFormat(_))
        ));
        let huge_array = b"\x82\xa5dtype\xa3<i4\xaaitem_shape\xdd\xff\xff\xff\xff";
        assert!(matches!(
            Schema::decode(huge_array, Kind::Dense),
            Err(Error::InvalidFormat(_))
        ));
        let negative = b"\x82\xa5dtype\xa3<i4\xaaitem_shape\x91\xff";
        assert!(matches!(
            Schema::decode(negative, Kind::Dense),
            Err(Error::InvalidFormat(_))
        ));
        let zero_width = b"\x82\xa5dtype\xa3<i4\xaaitem_shape\x91\x00";
        assert!(matches!(
            Schema::decode(zero_width, Kind::Dense),
            Err(Error::InvalidFormat(_))
        ));
    }

    #[test]
    fn dtypes() {
        for (s, size) in [
            ("|b1", 1),
            ("<f2", 2),
            ("<c16", 16),
            ("|S3", 3),
            ("<U5", 20),
            ("|V8", 8),
            ("<m8[s]", 8),
            (">i4", 4),
        ] {
            assert_eq!(DType::parse(s).unwrap().itemsize(), size, "{s}");
        }
        for s in [
            "",
            "f4",
            "<x4",
            "|O",
            "<f",
            "<U0",
            "<f4[ns]",
            "<M8[",
            "<i99999999999999",
        ] {
            assert!(DType::parse(s).is_err(), "{s}");
        }
    }

    #[test]
    fn width_bounds() {
        let u1 = DType::parse("|u1").unwrap();
        assert!(Schema::dense(u1.clone(), vec![0]).is_err());
        assert!(Schema::dense(u1.clone(), vec![1 << 31]).is_ok());
        assert!(Schema::dense(u1.clone(), vec![(1 << 31) + 1]).is_err());
        assert!(Schema::dense(u1, vec![u64::MAX, u64::MAX]).is_err());
    }
}
