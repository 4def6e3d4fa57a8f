//! The on-disk layouts of every loaderx release, told apart at open.
//!
//! loaderx changed its store format several times after 2.0.0 and wrote no
//! version number into any of them. These layouts were learnt only from the
//! bytes each release on PyPI writes (see `docs/format.md`, "Layouts of later
//! releases", and `tests/fixtures/later/`):
//!
//! | layout | written by | what differs from 2.0.0 |
//! |---|---|---|
//! | `2.0.0` | 2.0.0 (Ragged); 2.0.0–2.0.7 (Dense) | — |
//! | `2.0.1` | 2.0.1–2.0.7 (Ragged only) | a Ragged record's rank is one byte |
//! | `2.2` | 2.2.1 | schema gains `ndim`; Ragged records carry only their dims |
//! | `2.3.3` | 2.3.3–2.8.6 | records spread round-robin over `data_{i}.zr`; new header |
//! | `2.8.12` | 2.8.12 | as 2.3.3, dtypes stored by name (`"float32"`) |
//! | `2.8.18` | 2.8.18 (Ragged); 2.8.18–2.8.19 (Dense) | as 2.8.12, JSON schema, Dense without `ndim` |
//! | `2.8.19` | 2.8.19 (Ragged only) | as 2.8.18, Ragged dims are u32 |
//!
//! The files and header tell the first of each pair apart; two pairs share
//! every header byte and differ only in how a Ragged record encodes its shape
//! (2.0.0 / 2.0.1, 2.8.18 / 2.8.19). For those the record decides: no record
//! can be valid under both encodings of a pair (proved at [`RaggedPrefix`]),
//! so the first record decoded fixes the layout and every later record must
//! then agree with it. Anything that fits no known layout is refused with an
//! error naming what was found.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::{Error, Result};
use crate::format::Codec;
use crate::schema::{DType, Kind, Schema};
use crate::store::geometry::MAX_NDIM;

/// One store layout, named after the first release that wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// loaderx 2.0.0, the layout this package writes.
    V2_0_0,
    /// loaderx 2.0.1–2.0.7: Ragged records open with a one-byte rank.
    V2_0_1,
    /// loaderx 2.2.1: the schema holds `ndim`; Ragged records hold only dims.
    V2_2,
    /// loaderx 2.3.3–2.8.6: `data_{i}.zr` files, the sharded header.
    V2_3_3,
    /// loaderx 2.8.12: as 2.3.3 with dtypes stored by their NumPy name.
    V2_8_12,
    /// loaderx 2.8.18: as 2.8.12 with a JSON schema.
    V2_8_18,
    /// loaderx 2.8.19: as 2.8.18 with u32 Ragged dims.
    V2_8_19,
}

impl Layout {
    /// Every known layout, oldest first.
    pub const ALL: [Layout; 7] = [
        Layout::V2_0_0,
        Layout::V2_0_1,
        Layout::V2_2,
        Layout::V2_3_3,
        Layout::V2_8_12,
        Layout::V2_8_18,
        Layout::V2_8_19,
    ];

    /// Short identifier: the first release that wrote it (`"2.3.3"`).
    pub fn id(self) -> &'static str {
        match self {
            Layout::V2_0_0 => "2.0.0",
            Layout::V2_0_1 => "2.0.1",
            Layout::V2_2 => "2.2",
            Layout::V2_3_3 => "2.3.3",
            Layout::V2_8_12 => "2.8.12",
            Layout::V2_8_18 => "2.8.18",
            Layout::V2_8_19 => "2.8.19",
        }
    }

    /// Parses an identifier from [`Layout::id`].
    pub fn from_id(id: &str) -> Option<Layout> {
        Layout::ALL.into_iter().find(|l| l.id() == id)
    }

    /// The releases on PyPI that write this layout for a store of `kind`
    /// (Dense stores did not change where only the Ragged encoding did).
    pub fn releases(self, kind: Kind) -> &'static str {
        match (self, kind) {
            (Layout::V2_0_0, Kind::Dense) => "loaderx 2.0.0–2.0.7",
            (Layout::V2_0_0, Kind::Ragged) => "loaderx 2.0.0",
            (Layout::V2_0_1, _) => "loaderx 2.0.1–2.0.7",
            (Layout::V2_2, _) => "loaderx 2.2.1",
            (Layout::V2_3_3, _) => "loaderx 2.3.3–2.8.6",
            (Layout::V2_8_12, _) => "loaderx 2.8.12",
            (Layout::V2_8_18, Kind::Dense) => "loaderx 2.8.18–2.8.19",
            (Layout::V2_8_18, Kind::Ragged) => "loaderx 2.8.18",
            (Layout::V2_8_19, _) => "loaderx 2.8.19",
        }
    }

    /// Whether this is the layout this package writes (and appends to).
    pub fn is_native(self) -> bool {
        self == Layout::V2_0_0
    }
}

/// How a Ragged record encodes its shape ahead of its payload.
///
/// Within each pair that shares a header the encodings are exclusive:
///
/// * `RankU64` vs `RankU8`, rank `n` in byte 0 either way. Under `RankU64`
///   bytes 1..8 are zero (a rank is at most 64); under `RankU8` with `n >= 1`
///   they are the low 7 bytes of the first dim, which is 1..=2^31 (records are
///   non-empty and at most 2^31 bytes), so not all zero. With `n == 0` the
///   record is `8 + itemsize` bytes under one and `1 + itemsize` under the
///   other.
/// * `Dims64` vs `Dims32` (same `ndim` from the schema). Read as u64, a
///   `Dims32` record's first dim is `d0 | d1 << 32` (ndim >= 2, so >= 2^32)
///   or `d0 | p << 32` (ndim 1, `p` the first payload word): either too large
///   for a 2^31-byte record, or, with `p == 0`, exactly `d0` while the payload
///   is 4 bytes shorter than `d0` items. Read as u32, a `Dims64` record's
///   second word is a dim's zero high half (ndim >= 2: an empty shape, which
///   no record has) or, with ndim 1, `d0` while the payload is 4 bytes longer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RaggedPrefix {
    /// `[u64 ndim][u64 dim; ndim]` (2.0.0 and this package).
    RankU64,
    /// `[u8 ndim][u64 dim; ndim]` (2.0.1–2.0.7).
    RankU8,
    /// `[u64 dim; ndim]`, the rank fixed by the schema (2.2.1–2.8.18).
    Dims64(u8),
    /// `[u32 dim; ndim]`, the rank fixed by the schema (2.8.19).
    Dims32(u8),
}

impl RaggedPrefix {
    /// Parses the prefix of decoded record `index`, appending its dims to
    /// `dims`; returns the prefix length. The dims must account for exactly
    /// the (non-empty) payload that follows.
    pub fn parse(
        self,
        index: u64,
        record: &[u8],
        itemsize: u64,
        dims: &mut Vec<u64>,
    ) -> Result<usize> {
        if self == RaggedPrefix::RankU64 {
            // The native path, unchanged.
            return super::geometry::parse_ragged(index, record, itemsize, dims);
        }
        let corrupt = |why: String| Error::Corrupt(format!("ragged record {index}: {why}"));
        let (ndim, at, width) = match self {
            RaggedPrefix::RankU8 => match record.first() {
                Some(&n) => (n as usize, 1usize, 8usize),
                None => return Err(corrupt("an empty record has no shape prefix".into())),
            },
            RaggedPrefix::Dims64(n) => (n as usize, 0, 8),
            RaggedPrefix::Dims32(n) => (n as usize, 0, 4),
            RaggedPrefix::RankU64 => unreachable!("handled above"),
        };
        if ndim as u64 > MAX_NDIM {
            return Err(corrupt(format!("rank {ndim} exceeds {MAX_NDIM}")));
        }
        super::geometry::parse_dims(index, record, at, width, ndim, itemsize, dims)
    }
}

/// The Ragged encoding of one store: one known prefix, or a pair that the
/// first record decoded settles (see the module docs).
#[derive(Debug)]
pub(crate) struct RaggedEncoding {
    choices: [(Layout, RaggedPrefix); 2],
    /// 0 while undecided, else 1 + the index of the choice in force.
    decided: AtomicU8,
}

impl RaggedEncoding {
    /// An encoding known from the files alone.
    pub(crate) fn fixed(layout: Layout, prefix: RaggedPrefix) -> Self {
        RaggedEncoding {
            choices: [(layout, prefix); 2],
            decided: AtomicU8::new(1),
        }
    }

    /// One of two encodings, to be settled by the first record decoded.
    pub(crate) fn either(a: (Layout, RaggedPrefix), b: (Layout, RaggedPrefix)) -> Self {
        RaggedEncoding {
            choices: [a, b],
            decided: AtomicU8::new(0),
        }
    }

    /// The layout in force, `None` while no record has settled it.
    pub(crate) fn layout(&self) -> Option<Layout> {
        match self.decided.load(Ordering::Relaxed) {
            0 => None,
            d => Some(self.choices[d as usize - 1].0),
        }
    }

    /// The layout when the store is empty (both candidates read the same).
    pub(crate) fn first_layout(&self) -> Layout {
        self.choices[0].0
    }

    /// Parses record `index` (see [`RaggedPrefix::parse`]).
    #[inline]
    pub(crate) fn parse(
        &self,
        index: u64,
        record: &[u8],
        itemsize: u64,
        dims: &mut Vec<u64>,
    ) -> Result<usize> {
        match self.decided.load(Ordering::Relaxed) {
            0 => self.settle(index, record, itemsize, dims),
            d => self.choices[d as usize - 1]
                .1
                .parse(index, record, itemsize, dims),
        }
    }

    #[cold]
    fn settle(
        &self,
        index: u64,
        record: &[u8],
        itemsize: u64,
        dims: &mut Vec<u64>,
    ) -> Result<usize> {
        let (first, second) = (self.choices[0], self.choices[1]);
        let (pick, result) = match first.1.parse(index, record, itemsize, dims) {
            Ok(n) => (1u8, Ok(n)),
            Err(e) => match second.1.parse(index, record, itemsize, dims) {
                Ok(n) => (2u8, Ok(n)),
                // Neither: report it as the first (the older) encoding sees it.
                Err(_) => return Err(e),
            },
        };
        // Another thread may have settled it meanwhile, from another record:
        // the two records must then agree.
        match self
            .decided
            .compare_exchange(0, pick, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => result,
            Err(d) if d == pick => result,
            Err(d) => Err(Error::Corrupt(format!(
                "ragged record {index} is encoded as loaderx {} writes records, but other \
                 records of the store as {} does",
                self.choices[pick as usize - 1].0.releases(Kind::Ragged),
                self.choices[d as usize - 1].0.releases(Kind::Ragged)
            ))),
        }
    }
}

/// Size of the sharded header's fixed part (length, schema length, shard
/// count, codec, 4 zero bytes) before the per-file tails.
const SHARDED_FIXED: usize = 16;
/// Where the schema starts in a sharded header: after room for 255 tails.
pub(crate) const SHARDED_SCHEMA_AT: usize = SHARDED_FIXED + 8 * 255;

/// The static page of the sharded layouts (2.3.3 and later):
///
/// | offset | size | field |
/// |---|---|---|
/// | 0 | 8 | record count (u64) |
/// | 8 | 2 | schema length (u16) |
/// | 10 | 1 | data file count `n` (1..=255) |
/// | 11 | 1 | codec (0 raw, 1 zstd, 2 zstd_dict) |
/// | 12 | 4 | zero |
/// | 16 | 8·n | committed bytes of `data_0.zr` … `data_{n-1}.zr` (u64 each) |
/// | … | | zero up to 2056 |
/// | 2056 | schema length | the schema (MessagePack, or JSON from 2.8.18) |
/// | … | | zero up to 4096 |
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ShardedHeader {
    pub(crate) length: u64,
    pub(crate) codec: Codec,
    pub(crate) tails: Vec<u64>,
    pub(crate) schema: std::ops::Range<usize>,
}

impl ShardedHeader {
    /// Parses the 4096-byte page of a store with `data_{i}.zr` files.
    pub(crate) fn decode(page: &[u8], name: &str) -> Result<ShardedHeader> {
        let unknown = |why: String| {
            Error::InvalidFormat(format!(
                "{name}: meta.zr beside data_0.zr is not a header of loaderx 2.3.3–2.8.x ({why}): \
                 written by a loaderx release this version does not know, or damaged"
            ))
        };
        if page.len() < 4096 {
            return Err(unknown(format!(
                "{} bytes, not a 4096-byte page",
                page.len()
            )));
        }
        let length = u64::from_le_bytes(page[0..8].try_into().expect("8 bytes"));
        let schema_length = u16::from_le_bytes(page[8..10].try_into().expect("2 bytes")) as usize;
        let files = page[10] as usize;
        let codec =
            Codec::from_tag(page[11]).map_err(|_| unknown(format!("codec tag {}", page[11])))?;
        if page[12..16].iter().any(|&b| b != 0) {
            return Err(unknown(format!(
                "bytes 12..16 are {:02x?}, expected zero",
                &page[12..16]
            )));
        }
        if files == 0 {
            return Err(unknown("it names 0 data files".into()));
        }
        if schema_length == 0 || SHARDED_SCHEMA_AT + schema_length > page.len() {
            return Err(unknown(format!("schema length {schema_length}")));
        }
        let tails_end = SHARDED_FIXED + 8 * files;
        let tails: Vec<u64> = page[SHARDED_FIXED..tails_end]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        if page[tails_end..SHARDED_SCHEMA_AT].iter().any(|&b| b != 0) {
            return Err(unknown(
                "bytes after the data-file tails are not zero".into(),
            ));
        }
        let schema = SHARDED_SCHEMA_AT..SHARDED_SCHEMA_AT + schema_length;
        if page[schema.end..4096].iter().any(|&b| b != 0) {
            return Err(unknown("bytes after the schema are not zero".into()));
        }
        let mut total: u64 = 0;
        for &t in &tails {
            total = total
                .checked_add(t)
                .filter(|&t| t <= i64::MAX as u64)
                .ok_or_else(|| unknown("the data-file tails overflow".into()))?;
        }
        Ok(ShardedHeader {
            length,
            codec,
            tails,
            schema,
        })
    }
}

/// What a later release's schema said, translated to this package's terms.
pub(crate) struct ForeignSchema {
    pub(crate) schema: Schema,
    /// A Ragged store's fixed rank.
    pub(crate) ndim: Option<u8>,
    /// Whether the dtype was stored by name (`"float32"`), as 2.8.12 does.
    pub(crate) dtype_by_name: bool,
}

/// The NumPy dtype names 2.8.12 and later store, as `dtype.str`. Those
/// releases refuse byte-swapped dtypes, so every name is the native
/// little-endian type.
fn dtype_of_name(name: &str) -> Option<&'static str> {
    Some(match name {
        "bool" => "|b1",
        "int8" => "|i1",
        "uint8" => "|u1",
        "int16" => "<i2",
        "uint16" => "<u2",
        "int32" => "<i4",
        "uint32" => "<u4",
        "int64" => "<i8",
        "uint64" => "<u8",
        "float16" => "<f2",
        "float32" => "<f4",
        "float64" => "<f8",
        "complex64" => "<c8",
        "complex128" => "<c16",
        _ => return None,
    })
}

/// The fields of a later release's schema map, before checking.
#[derive(Default)]
struct Fields {
    keys: Vec<String>,
    dtype: Option<String>,
    ndim: Option<u64>,
    item_shape: Option<Vec<u64>>,
}

fn read_msgpack(bytes: &[u8]) -> Result<Fields> {
    let malformed =
        |why: &str| Error::InvalidFormat(format!("schema is not valid MessagePack: {why}"));
    let mut rd = bytes;
    let entries = rmp::decode::read_map_len(&mut rd)
        .map_err(|_| malformed("expected a map at the top level"))?;
    let mut f = Fields::default();
    for _ in 0..entries {
        let (key, rest) =
            rmp::decode::read_str_from_slice(rd).map_err(|_| malformed("expected string keys"))?;
        rd = rest;
        f.keys.push(key.to_owned());
        match key {
            "dtype" if f.dtype.is_none() => {
                let (value, rest) = rmp::decode::read_str_from_slice(rd)
                    .map_err(|_| malformed("dtype must be a string"))?;
                rd = rest;
                f.dtype = Some(value.to_owned());
            }
            "ndim" if f.ndim.is_none() => {
                f.ndim = Some(
                    rmp::decode::read_int(&mut rd)
                        .map_err(|_| malformed("ndim must be a non-negative integer"))?,
                );
            }
            "item_shape" if f.item_shape.is_none() => {
                let n = rmp::decode::read_array_len(&mut rd)
                    .map_err(|_| malformed("item_shape must be an array"))?;
                // Each element takes at least one byte: bounds the allocation.
                if n as usize > rd.len() {
                    return Err(malformed("item_shape is longer than the schema"));
                }
                let mut dims = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    dims.push(rmp::decode::read_int(&mut rd).map_err(|_| {
                        malformed("item_shape entries must be non-negative integers")
                    })?);
                }
                f.item_shape = Some(dims);
            }
            // Unknown or repeated: the field check below names them all.
            _ => {
                f.keys.push(String::new());
                return Ok(f);
            }
        }
    }
    if !rd.is_empty() {
        return Err(malformed("trailing bytes after the map"));
    }
    Ok(f)
}

fn read_json(bytes: &[u8]) -> Result<Fields> {
    let malformed = |why: String| Error::InvalidFormat(format!("schema is not valid JSON: {why}"));
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| malformed(e.to_string()))?;
    let map = value
        .as_object()
        .ok_or_else(|| malformed("expected an object at the top level".into()))?;
    let mut f = Fields::default();
    for (key, v) in map {
        f.keys.push(key.clone());
        match key.as_str() {
            "dtype" => {
                f.dtype = Some(
                    v.as_str()
                        .ok_or_else(|| malformed("dtype must be a string".into()))?
                        .to_owned(),
                )
            }
            "ndim" => {
                f.ndim = Some(
                    v.as_u64()
                        .ok_or_else(|| malformed("ndim must be a non-negative integer".into()))?,
                )
            }
            "item_shape" => {
                let arr = v
                    .as_array()
                    .ok_or_else(|| malformed("item_shape must be an array".into()))?;
                f.item_shape = Some(
                    arr.iter()
                        .map(|d| {
                            d.as_u64().ok_or_else(|| {
                                malformed("item_shape entries must be non-negative integers".into())
                            })
                        })
                        .collect::<Result<_>>()?,
                );
            }
            _ => {}
        }
    }
    Ok(f)
}

/// Which schema encoding a layout uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SchemaFlavor {
    /// MessagePack `{dtype, ndim[, item_shape]}` (2.2.1–2.8.12).
    MsgpackNdim,
    /// JSON `{"dtype", "item_shape"}` / `{"dtype", "ndim"}` (2.8.18–2.8.19).
    Json,
}

/// Decodes a later release's schema for a store opened as `kind`.
pub(crate) fn decode_schema(
    bytes: &[u8],
    kind: Kind,
    flavor: SchemaFlavor,
) -> Result<ForeignSchema> {
    let f = match flavor {
        SchemaFlavor::MsgpackNdim => read_msgpack(bytes)?,
        SchemaFlavor::Json => read_json(bytes)?,
    };
    let keys: Vec<&str> = f.keys.iter().map(String::as_str).collect();
    // The field sets each flavour writes, per kind.
    let dense_keys: &[&str] = match flavor {
        SchemaFlavor::MsgpackNdim => &["dtype", "ndim", "item_shape"],
        SchemaFlavor::Json => &["dtype", "item_shape"],
    };
    let ragged_keys: &[&str] = &["dtype", "ndim"];
    let same = |want: &[&str]| {
        let mut a = keys.clone();
        let mut b = want.to_vec();
        a.sort_unstable();
        b.sort_unstable();
        a == b
    };
    let found = if same(dense_keys) {
        Kind::Dense
    } else if same(ragged_keys) {
        Kind::Ragged
    } else {
        return Err(Error::InvalidFormat(format!(
            "schema fields {keys:?} match no layout of a loaderx release this version knows"
        )));
    };
    if found != kind {
        return Err(Error::Schema(format!(
            "{}: got fields {keys:?}, a {} store",
            crate::schema::schema_fields_prefix(kind),
            found.name()
        )));
    }
    let text = f.dtype.expect("checked");
    let (dtype, dtype_by_name) = match DType::parse(&text) {
        Ok(d) => (d, false),
        Err(_) => match dtype_of_name(&text) {
            Some(descr) => (DType::parse(descr).expect("known descr"), true),
            None => {
                return Err(Error::InvalidFormat(format!(
                    "schema dtype {text:?} is not one a loaderx release writes"
                )))
            }
        },
    };
    match kind {
        Kind::Dense => {
            let shape = f.item_shape.expect("checked");
            if let Some(n) = f.ndim {
                if n != shape.len() as u64 {
                    return Err(Error::InvalidFormat(format!(
                        "schema ndim {n} disagrees with item_shape {shape:?}"
                    )));
                }
            }
            let schema = Schema::dense(dtype, shape)
                .map_err(|e| Error::InvalidFormat(format!("schema: {e}")))?;
            Ok(ForeignSchema {
                schema,
                ndim: None,
                dtype_by_name,
            })
        }
        Kind::Ragged => {
            let n = f.ndim.expect("checked");
            if n == 0 || n > MAX_NDIM {
                return Err(Error::InvalidFormat(format!(
                    "schema ndim {n} is outside 1..={MAX_NDIM}"
                )));
            }
            Ok(ForeignSchema {
                schema: Schema::ragged(dtype),
                ndim: Some(n as u8),
                dtype_by_name,
            })
        }
    }
}

/// Whether a MessagePack schema map has an `ndim` key (2.2.1 and later).
pub(crate) fn msgpack_has_ndim(bytes: &[u8]) -> bool {
    read_msgpack(bytes).is_ok_and(|f| f.keys.iter().any(|k| k == "ndim"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc_u8(shape: &[u64], payload: &[u8]) -> Vec<u8> {
        let mut v = vec![shape.len() as u8];
        for d in shape {
            v.extend_from_slice(&d.to_le_bytes());
        }
        v.extend_from_slice(payload);
        v
    }

    fn enc_dims(shape: &[u64], payload: &[u8], width: usize) -> Vec<u8> {
        let mut v = Vec::new();
        for d in shape {
            v.extend_from_slice(&d.to_le_bytes()[..width]);
        }
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn prefixes_parse_and_exclude_each_other() {
        let mut dims = Vec::new();
        let rec = enc_u8(&[1, 3], &[1, 2, 3]);
        assert_eq!(
            RaggedPrefix::RankU8.parse(0, &rec, 1, &mut dims).unwrap(),
            17
        );
        assert_eq!(dims, [1, 3]);
        assert!(RaggedPrefix::RankU64.parse(0, &rec, 1, &mut dims).is_err());
        let rec = enc_u8(&[], &[7]);
        assert!(RaggedPrefix::RankU8.parse(0, &rec, 1, &mut dims).is_ok());
        assert!(RaggedPrefix::RankU64.parse(0, &rec, 1, &mut dims).is_err());

        let rec = enc_dims(&[2, 2], &[0; 16], 4);
        dims.clear();
        assert_eq!(
            RaggedPrefix::Dims32(2)
                .parse(0, &rec, 4, &mut dims)
                .unwrap(),
            8
        );
        assert_eq!(dims, [2, 2]);
        assert!(RaggedPrefix::Dims64(2)
            .parse(0, &rec, 4, &mut dims)
            .is_err());
        let rec = enc_dims(&[4], &[0; 4], 8);
        assert!(RaggedPrefix::Dims64(1).parse(0, &rec, 1, &mut dims).is_ok());
        assert!(RaggedPrefix::Dims32(1)
            .parse(0, &rec, 1, &mut dims)
            .is_err());
        // A u32 record whose first payload word is zero is still not a u64 one.
        let rec = enc_dims(&[8], &[0; 8], 4);
        assert!(RaggedPrefix::Dims32(1).parse(0, &rec, 1, &mut dims).is_ok());
        assert!(RaggedPrefix::Dims64(1)
            .parse(0, &rec, 1, &mut dims)
            .is_err());
        // Truncated and hostile prefixes.
        assert!(RaggedPrefix::RankU8.parse(0, &[], 1, &mut dims).is_err());
        assert!(RaggedPrefix::RankU8.parse(0, &[65], 1, &mut dims).is_err());
        assert!(RaggedPrefix::Dims64(3)
            .parse(0, &[1, 0, 0], 1, &mut dims)
            .is_err());
    }

    #[test]
    fn encoding_settles_once() {
        let enc = RaggedEncoding::either(
            (Layout::V2_0_0, RaggedPrefix::RankU64),
            (Layout::V2_0_1, RaggedPrefix::RankU8),
        );
        assert_eq!(enc.layout(), None);
        let mut dims = Vec::new();
        enc.parse(0, &enc_u8(&[2], &[1, 2]), 1, &mut dims).unwrap();
        assert_eq!(enc.layout(), Some(Layout::V2_0_1));
        // A 2.0.0 record no longer passes.
        let mut native = 1u64.to_le_bytes().to_vec();
        native.extend_from_slice(&2u64.to_le_bytes());
        native.extend_from_slice(&[1, 2]);
        assert!(enc.parse(1, &native, 1, &mut dims).is_err());
    }

    #[test]
    fn sharded_header() {
        let mut page = vec![0u8; 4096];
        page[0..8].copy_from_slice(&3u64.to_le_bytes());
        page[8..10].copy_from_slice(&5u16.to_le_bytes());
        page[10] = 2;
        page[11] = 1;
        page[16..24].copy_from_slice(&10u64.to_le_bytes());
        page[24..32].copy_from_slice(&7u64.to_le_bytes());
        page[SHARDED_SCHEMA_AT..SHARDED_SCHEMA_AT + 5].copy_from_slice(b"abcde");
        let h = ShardedHeader::decode(&page, "s").unwrap();
        assert_eq!(
            (h.length, h.codec, h.tails.clone()),
            (3, Codec::Zstd, vec![10, 7])
        );
        let mut bad = page.clone();
        bad[13] = 1;
        let e = ShardedHeader::decode(&bad, "s").unwrap_err().to_string();
        assert!(e.contains("does not know"), "{e}");
        let mut bad = page.clone();
        bad[11] = 9;
        assert!(ShardedHeader::decode(&bad, "s").is_err());
        let mut bad = page.clone();
        bad[10] = 0;
        assert!(ShardedHeader::decode(&bad, "s").is_err());
        let mut bad = page.clone();
        bad[40] = 1;
        assert!(ShardedHeader::decode(&bad, "s").is_err());
        let mut bad = page;
        bad[8..10].copy_from_slice(&3000u16.to_le_bytes());
        assert!(ShardedHeader::decode(&bad, "s").is_err());
    }

    #[test]
    fn schemas_of_later_releases() {
        let j = br#"{"dtype": "uint8", "item_shape": [4]}"#;
        let s = decode_schema(j, Kind::Dense, SchemaFlavor::Json).unwrap();
        assert_eq!(s.schema.record_width(), Some(4));
        assert!(s.dtype_by_name);
        assert!(matches!(
            decode_schema(j, Kind::Ragged, SchemaFlavor::Json),
            Err(Error::Schema(_))
        ));
        let j = br#"{"dtype": "int32", "ndim": 2}"#;
        let s = decode_schema(j, Kind::Ragged, SchemaFlavor::Json).unwrap();
        assert_eq!(s.ndim, Some(2));
        let j = br#"{"dtype": "object", "ndim": 2}"#;
        assert!(decode_schema(j, Kind::Ragged, SchemaFlavor::Json).is_err());
        let j = br#"{"dtype": "int32", "ndim": 0}"#;
        assert!(decode_schema(j, Kind::Ragged, SchemaFlavor::Json).is_err());
        // MessagePack {dtype: "<f4", ndim: 2, item_shape: [2, 3]} as 2.2.1 writes it.
        let m = b"\x83\xa5dtype\xa3<f4\xa4ndim\x02\xaaitem_shape\x92\x02\x03";
        assert!(msgpack_has_ndim(m));
        let s = decode_schema(m, Kind::Dense, SchemaFlavor::MsgpackNdim).unwrap();
        assert_eq!(s.schema.record_width(), Some(24));
        let m = b"\x83\xa5dtype\xa3<f4\xa4ndim\x01\xaaitem_shape\x92\x02\x03";
        assert!(decode_schema(m, Kind::Dense, SchemaFlavor::MsgpackNdim).is_err());
        let m = b"\x83\xa5dtype\xa3<f4\xa4ndim\x02\xa5extra\x02";
        assert!(decode_schema(m, Kind::Dense, SchemaFlavor::MsgpackNdim).is_err());
    }

    #[test]
    fn layout_ids() {
        for l in Layout::ALL {
            assert_eq!(Layout::from_id(l.id()), Some(l));
        }
        assert!(Layout::V2_0_0.is_native());
        assert!(!Layout::V2_8_19.is_native());
    }
}
