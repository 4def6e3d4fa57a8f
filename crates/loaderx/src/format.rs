//! The on-disk layout of a Zrecord store, byte-compatible with loaderx 2.0.0.
//!
//! A store is a directory of three files:
//!
//! * `meta.zr`: a 4096-byte static page (a 32-byte [`Header`] and the
//!   MessagePack schema), then the record table, one 16-byte [`RecordLoc`]
//!   per record starting at byte 4096;
//! * `data.zr`: the record payloads, each at the absolute offset its table
//!   entry names;
//! * `dict.zr`: the zstd dictionary, present exactly when the codec is
//!   [`Codec::ZstdDict`].
//!
//! All integers are little-endian. The format has no version field and no
//! checksum; validity is established by the structural checks in this module.
//!
//! Invariants a committed store satisfies (checked on open or on each gather):
//! * `1 <= schema_length <= 4064`, reserved bytes zero, codec tag known;
//! * `tail_offset <= i64::MAX` and `tail_offset <= len(data.zr)`;
//! * `len(meta.zr) >= 4096 + 16 * length`;
//! * every entry below `length` has `1 <= logic_length <= 2^31`,
//!   `phys_length >= 1`, `offset + phys_length <= tail_offset`, and for raw
//!   stores `phys_length == logic_length`.
//!
//! A writer keeps `schema_length == 0` on disk until `close()`, so a store
//! whose build was interrupted is refused rather than opened as empty.

use crate::error::{Error, Result};

/// Size of the static page at the start of `meta.zr`.
pub const PAGE_SIZE: u64 = 4096;
/// Size of the physical header at the start of the static page.
pub const HEADER_SIZE: usize = 32;
/// Room for the schema in the static page.
pub const SCHEMA_CAPACITY: usize = PAGE_SIZE as usize - HEADER_SIZE;
/// Size of one record table entry.
pub const LOC_SIZE: usize = 16;
/// Largest logical record (and Dense record width) the format allows: 2 GiB.
pub const MAX_RECORD_BYTES: u64 = 1 << 31;
/// Name of the metadata file inside a store directory.
pub const META_FILE: &str = "meta.zr";
/// Name of the payload file inside a store directory.
pub const DATA_FILE: &str = "data.zr";
/// Name of the dictionary file inside a store directory.
pub const DICT_FILE: &str = "dict.zr";
/// Name of the optional checksum sidecar of a raw store: `SUMS_MAGIC`, the
/// record count (u64, written at commit), then one XXH3-64 per record.
/// loaderx 2.0.0 does not know it and ignores it.
pub const SUMS_FILE: &str = "sums.zr";
/// First 8 bytes of `sums.zr`.
pub const SUMS_MAGIC: [u8; 8] = *b"LXSUMS\x00\x01";
/// Bytes before the first checksum in `sums.zr`.
pub const SUMS_HEADER: u64 = 16;

/// Whether a zstd frame's header sets the content-checksum flag (libzstd
/// then checks the last 4 bytes against the decoded content on every
/// decode). `None` when `frame` is too short or not a zstd frame.
pub fn frame_has_checksum(frame: &[u8]) -> Option<bool> {
    const MAGIC: [u8; 4] = 0xFD2F_B528u32.to_le_bytes();
    if frame.len() < 5 || frame[..4] != MAGIC {
        return None;
    }
    Some(frame[4] & 0x04 != 0)
}

/// The one compression method of a store, fixed at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codec {
    /// Payload bytes are the record bytes.
    Raw = 0,
    /// One independent zstd frame per record (written at level 3).
    Zstd = 1,
    /// One zstd frame per record against the store's dictionary (written at level 19).
    ZstdDict = 2,
}

impl Codec {
    /// The tag stored in byte 31 of the header.
    pub fn tag(self) -> u8 {
        self as u8
    }

    /// Parses a header tag.
    pub fn from_tag(tag: u8) -> Result<Codec> {
        match tag {
            0 => Ok(Codec::Raw),
            1 => Ok(Codec::Zstd),
            2 => Ok(Codec::ZstdDict),
            other => Err(Error::InvalidFormat(format!("unknown codec tag {other}"))),
        }
    }

    /// The public name: `"raw"`, `"zstd"` or `"zstd_dict"`.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Zstd => "zstd",
            Codec::ZstdDict => "zstd_dict",
        }
    }

    /// Parses a public name.
    pub fn from_name(name: &str) -> Result<Codec> {
        match name {
            "raw" => Ok(Codec::Raw),
            "zstd" => Ok(Codec::Zstd),
            "zstd_dict" => Ok(Codec::ZstdDict),
            other => Err(Error::InvalidArgument(format!(
                "unknown codec {other:?}: expected \"raw\", \"zstd\" or \"zstd_dict\""
            ))),
        }
    }

    /// Whether records are zstd frames.
    pub fn is_compressed(self) -> bool {
        self != Codec::Raw
    }
}

/// The 32-byte physical header at the start of `meta.zr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Number of records.
    pub length: u64,
    /// End of the committed payload in `data.zr`.
    pub tail_offset: u64,
    /// Length of the MessagePack schema at byte 32; 0 marks an uncommitted store.
    pub schema_length: u32,
    /// The store's codec.
    pub codec: Codec,
}

impl Header {
    /// Serialises the header.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut out = [0u8; HEADER_SIZE];
        out[0..8].copy_from_slice(&self.length.to_le_bytes());
        out[8..16].copy_from_slice(&self.tail_offset.to_le_bytes());
        out[16..20].copy_from_slice(&self.schema_length.to_le_bytes());
        out[31] = self.codec.tag();
        out
    }

    /// Parses and validates a committed header.
    pub fn decode(bytes: &[u8; HEADER_SIZE]) -> Result<Header> {
        let length = u64::from_le_bytes(bytes[0..8].try_into().expect("8 bytes"));
        let tail_offset = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        let schema_length = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
        if bytes[20..31].iter().any(|&b| b != 0) {
            return Err(Error::InvalidFormat(
                "header reserved bytes 20..31 are not zero".into(),
            ));
        }
        let codec = Codec::from_tag(bytes[31])?;
        if schema_length == 0 {
            return Err(Error::InvalidFormat(
                "the store was never closed: its header is uncommitted (schema_length is 0), \
                 so its writer stopped before close(); rebuild it"
                    .into(),
            ));
        }
        if schema_length as usize > SCHEMA_CAPACITY {
            return Err(Error::InvalidFormat(format!(
                "schema_length {schema_length} exceeds the {SCHEMA_CAPACITY}-byte schema area"
            )));
        }
        if tail_offset > i64::MAX as u64 {
            return Err(Error::InvalidFormat(format!(
                "tail_offset {tail_offset} exceeds the largest file offset"
            )));
        }
        Ok(Header {
            length,
            tail_offset,
            schema_length,
            codec,
        })
    }

    /// Byte length `meta.zr` must have at least for this header's record count.
    pub fn meta_len_required(&self) -> Result<u64> {
        self.length
            .checked_mul(LOC_SIZE as u64)
            .and_then(|t| t.checked_add(PAGE_SIZE))
            .ok_or_else(|| {
                Error::InvalidFormat(format!("record count {} overflows the table", self.length))
            })
    }
}

/// One record table entry: where record `i`'s frame lives and how large it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RecordLoc {
    /// Absolute offset of the frame in `data.zr`.
    pub offset: u64,
    /// Stored (frame) size in bytes.
    pub phys_length: u32,
    /// Decoded size in bytes.
    pub logic_length: u32,
}

impl RecordLoc {
    /// Serialises the entry.
    pub fn encode(&self) -> [u8; LOC_SIZE] {
        let mut out = [0u8; LOC_SIZE];
        out[0..8].copy_from_slice(&self.offset.to_le_bytes());
        out[8..12].copy_from_slice(&self.phys_length.to_le_bytes());
        out[12..16].copy_from_slice(&self.logic_length.to_le_bytes());
        out
    }

    /// Parses an entry; `bytes` must hold at least 16 bytes.
    #[inline]
    pub fn decode(bytes: &[u8]) -> RecordLoc {
        RecordLoc {
            offset: u64::from_le_bytes(bytes[0..8].try_into().expect("8 bytes")),
            phys_length: u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")),
            logic_length: u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes")),
        }
    }

    /// Checks the entry of record `index` against the store's codec and tail.
    #[inline]
    pub fn validate(&self, index: u64, codec: Codec, tail_offset: u64) -> Result<()> {
        let logic = self.logic_length as u64;
        let phys = self.phys_length as u64;
        if logic == 0 || logic > MAX_RECORD_BYTES {
            return Err(Error::InvalidFormat(format!(
                "record {index}: logical length {logic} is outside 1..=2^31"
            )));
        }
        if phys == 0 {
            return Err(Error::InvalidFormat(format!(
                "record {index}: stored length is 0"
            )));
        }
        match self.offset.checked_add(phys) {
            Some(end) if end <= tail_offset => {}
            _ => {
                return Err(Error::InvalidFormat(format!(
                    "record {index}: bytes {}..{}+{} lie past the committed end {tail_offset} of data.zr",
                    self.offset, self.offset, phys
                )))
            }
        }
        match codec {
            Codec::Raw if phys != logic => Err(Error::InvalidFormat(format!(
                "record {index}: raw record has stored length {phys} but logical length {logic}"
            ))),
            // A zstd block decodes to at most 128 KiB and costs at least 3 bytes
            // of frame, plus a frame header: a claimed size beyond that bound
            // cannot be real, and refusing it keeps a forged table entry from
            // making a gather allocate gigabytes.
            Codec::Zstd | Codec::ZstdDict if logic > phys.saturating_mul(MAX_ZSTD_EXPANSION) => {
                Err(Error::Corrupt(format!(
                    "record {index}: a {phys}-byte zstd frame cannot decode to {logic} bytes"
                )))
            }
            _ => Ok(()),
        }
    }
}

/// Upper bound on how many decoded bytes one byte of zstd frame can produce
/// (a 3-byte RLE block header yields at most a 128 KiB block).
pub const MAX_ZSTD_EXPANSION: u64 = (128 << 10) / 3 + 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = Header {
            length: 97,
            tail_offset: 40740,
            schema_length: 26,
            codec: Codec::Zstd,
        };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let bytes = h.encode();
        assert_eq!(&bytes[0..8], &97u64.to_le_bytes());
        assert_eq!(bytes[31], 1);
    }

    #[test]
    fn header_rejects_malformed() {
        let good = Header {
            length: 1,
            tail_offset: 1,
            schema_length: 10,
            codec: Codec::Raw,
        }
        .encode();
        let mut bad = good;
        bad[25] = 1;
        assert!(matches!(Header::decode(&bad), Err(Error::InvalidFormat(_))));
        let mut bad = good;
        bad[31] = 3;
        assert!(matches!(Header::decode(&bad), Err(Error::InvalidFormat(_))));
        let mut bad = good;
        bad[16..20].copy_from_slice(&0u32.to_le_bytes());
        let err = Header::decode(&bad).unwrap_err();
        assert!(err.to_string().contains("never closed"), "{err}");
        let mut bad = good;
        bad[16..20].copy_from_slice(&4065u32.to_le_bytes());
        assert!(matches!(Header::decode(&bad), Err(Error::InvalidFormat(_))));
        let mut bad = good;
        bad[8..16].copy_from_slice(&(1u64 << 63).to_le_bytes());
        assert!(matches!(Header::decode(&bad), Err(Error::InvalidFormat(_))));
    }

    #[test]
    fn codec_names() {
        for c in [Codec::Raw, Codec::Zstd, Codec::ZstdDict] {
            assert_eq!(Codec::from_name(c.name()).unwrap(), c);
            assert_eq!(Codec::from_tag(c.tag()).unwrap(), c);
        }
        let err = Codec::from_name("lz4").unwrap_err();
        assert!(err.to_string().contains("unknown codec"));
    }

    #[test]
    fn loc_validation() {
        let loc = |offset, phys, logic| RecordLoc {
            offset,
            phys_length: phys,
            logic_length: logic,
        };
        assert!(loc(0, 10, 10).validate(0, Codec::Raw, 10).is_ok());
        assert!(loc(1, 10, 10).validate(0, Codec::Raw, 10).is_err());
        assert!(loc(0, 9, 10).validate(0, Codec::Raw, 10).is_err());
        assert!(loc(0, 0, 10).validate(0, Codec::Zstd, 10).is_err());
        assert!(loc(0, 5, 0).validate(0, Codec::Zstd, 10).is_err());
        assert!(loc(u64::MAX, 5, 5).validate(0, Codec::Zstd, 10).is_err());
        assert!(loc(0, 5, 1 << 31).validate(0, Codec::Zstd, 10).is_err());
        assert!(loc(0, 10, 1000).validate(0, Codec::Zstd, 10).is_ok());
        let e = loc(0, 10, 0x8000_0000).validate(0, Codec::Zstd, 100);
        assert!(matches!(e, Err(Error::Corrupt(_))));
        let round = loc(7, 8, 9);
        assert_eq!(RecordLoc::decode(&round.encode()), round);
    }
}
