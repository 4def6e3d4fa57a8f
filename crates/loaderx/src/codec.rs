//! Per-record compression. Encoders are made per worker task and share one
//! prepared dictionary; decoders are pooled per store and reused across
//! gathers, each owning its digested copy of the dictionary.

use std::sync::Mutex;
use zstd::bulk::{Compressor, Decompressor};

use zstd::dict::EncoderDictionary;

use crate::error::{Error, Result};
use crate::format::Codec;

/// Level loaderx 2.0.0 writes plain zstd frames at: the default of
/// [`Codec::Zstd`].
pub const ZSTD_LEVEL: i32 = 3;
/// Level loaderx 2.0.0 writes dictionary frames at: the default of
/// [`Codec::ZstdDict`].
pub const ZSTD_DICT_LEVEL: i32 = 19;

/// The compression levels a store can be written at: zstd's own range,
/// negative (faster, larger) levels included. Level 0 is zstd's default
/// level, 3. The level only shapes the frames; it is not stored, and every
/// reader (loaderx 2.0.0's too) decodes frames of any level.
pub fn level_range() -> std::ops::RangeInclusive<i32> {
    zstd::compression_level_range()
}

/// The level `codec` writes at when none is chosen: loaderx 2.0.0's
/// ([`ZSTD_LEVEL`], [`ZSTD_DICT_LEVEL`]); `None` for [`Codec::Raw`].
pub fn default_level(codec: Codec) -> Option<i32> {
    match codec {
        Codec::Raw => None,
        Codec::Zstd => Some(ZSTD_LEVEL),
        Codec::ZstdDict => Some(ZSTD_DICT_LEVEL),
    }
}

/// The level a store of `codec` is written at, given the requested one:
/// the codec's default for `None`; an error for a level with
/// [`Codec::Raw`] (which compresses nothing) or outside [`level_range`].
pub fn resolve_level(codec: Codec, level: Option<i32>) -> Result<Option<i32>> {
    match (codec, level) {
        (_, None) => Ok(default_level(codec)),
        (Codec::Raw, Some(l)) => Err(Error::InvalidArgument(format!(
            "level applies only to codecs \"zstd\" and \"zstd_dict\": raw stores are not \
             compressed (got level {l})"
        ))),
        (_, Some(l)) => {
            let range = level_range();
            if range.contains(&l) {
                Ok(Some(l))
            } else {
                Err(Error::InvalidArgument(format!(
                    "level must be in zstd's range {}..={}, got {l}",
                    range.start(),
                    range.end()
                )))
            }
        }
    }
}

/// Writes frames of one codec. Created per worker task.
pub(crate) enum Encoder<'d> {
    Raw,
    Zstd { ctx: Compressor<'d>, frame: Vec<u8> },
}

impl<'d> Encoder<'d> {
    /// An encoder of `codec` at `level` (a plain zstd store's; a
    /// dictionary store's level is the one its prepared `dict` was made
    /// with, see [`encoder_dictionary`]); with `checksum`, each zstd frame
    /// carries the content checksum libzstd verifies on every decode.
    pub(crate) fn new(
        codec: Codec,
        level: i32,
        dict: Option<&'d EncoderDictionary<'static>>,
        checksum: bool,
    ) -> Result<Self> {
        let ctx = match (codec, dict) {
            (Codec::Raw, _) => return Ok(Encoder::Raw),
            (Codec::Zstd, _) => Compressor::new(level),
            (Codec::ZstdDict, Some(d)) => Compressor::with_prepared_dictionary(d),
            (Codec::ZstdDict, None) => {
                return Err(Error::InvalidArgument(
                    "a zstd_dict store needs its dictionary".into(),
                ))
            }
        }
        .map_err(|e| Error::OutOfMemory(format!("creating a zstd compression context: {e}")))?;
        let mut ctx = ctx;
        if checksum {
            ctx.set_parameter(zstd::stream::raw::CParameter::ChecksumFlag(true))
                .map_err(|e| Error::OutOfMemory(format!("configuring zstd: {e}")))?;
        }
        Ok(Encoder::Zstd {
            ctx,
            frame: Vec::new(),
        })
    }

    /// Appends the stored form of `record` to `out`, returning its length.
    pub(crate) fn encode_into(&mut self, record: &[u8], out: &mut Vec<u8>) -> Result<usize> {
        match self {
            Encoder::Raw => {
                out.extend_from_slice(record);
                Ok(record.len())
            }
            Encoder::Zstd { ctx, frame } => {
                frame.clear();
                frame.reserve(zstd::zstd_safe::compress_bound(record.len()));
                let n = ctx
                    .compress_to_buffer(record, frame)
                    .map_err(|e| Error::Corrupt(format!("zstd compression failed: {e}")))?;
                out.extend_from_slice(&frame[..n]);
                Ok(n)
            }
        }
    }
}

/// Reads frames of one codec into caller memory.
pub(crate) struct Decoder {
    ctx: Option<Decompressor<'static>>,
    /// Where a frame read from the file waits to be decoded.
    pub(crate) staging: Vec<u8>,
}

impl Decoder {
    fn new(codec: Codec, dict: Option<&[u8]>) -> Result<Self> {
        let ctx = match (codec, dict) {
            (Codec::Raw, _) => None,
            (Codec::Zstd, _) => Some(Decompressor::new()),
            // The context keeps its own digested copy of the dictionary, so
            // it owns everything it needs and can be pooled freely.
            (Codec::ZstdDict, Some(d)) => Some(Decompressor::with_dictionary(d)),
            (Codec::ZstdDict, None) => {
                return Err(Error::InvalidFormat(
                    "a zstd_dict store has no dictionary".into(),
                ))
            }
        }
        .transpose()
        .map_err(|e| match codec {
            Codec::ZstdDict => {
                Error::InvalidFormat(format!("dict.zr is not a usable zstd dictionary: {e}"))
            }
            _ => Error::OutOfMemory(format!("creating a zstd decompression context: {e}")),
        })?;
        Ok(Decoder {
            ctx,
            staging: Vec::new(),
        })
    }

    /// Decodes record `index`'s frame straight into `dst`, which must end up
    /// exactly full.
    #[inline]
    pub(crate) fn decode_into(&mut self, index: u64, frame: &[u8], dst: &mut [u8]) -> Result<()> {
        decode(self.ctx.as_mut(), index, frame, dst)
    }

    /// Decodes the frame waiting in `staging` into `dst`.
    #[inline]
    pub(crate) fn decode_staged(&mut self, index: u64, dst: &mut [u8]) -> Result<()> {
        decode(self.ctx.as_mut(), index, &self.staging, dst)
    }
}

fn decode(
    ctx: Option<&mut Decompressor<'static>>,
    index: u64,
    frame: &[u8],
    dst: &mut [u8],
) -> Result<()> {
    let Some(ctx) = ctx else {
        if frame.len() != dst.len() {
            return Err(Error::Corrupt(format!(
                "record {index}: stored {} bytes, expected {}",
                frame.len(),
                dst.len()
            )));
        }
        dst.copy_from_slice(frame);
        return Ok(());
    };
    let n = ctx.decompress_to_buffer(frame, dst).map_err(|e| {
        Error::Corrupt(format!(
            "record {index}: zstd frame does not decode to {} bytes: {e}",
            dst.len()
        ))
    })?;
    if n != dst.len() {
        return Err(Error::Corrupt(format!(
            "record {index}: zstd frame decodes to {n} bytes, expected {}",
            dst.len()
        )));
    }
    Ok(())
}

/// Decoder contexts of one store, kept for reuse.
///
/// Creating a zstd context costs several microseconds (more with a
/// dictionary to digest), as much as decoding a small record; a pool makes
/// that a once-per-thread cost instead of a per-gather one.
pub(crate) struct DecoderPool {
    codec: Codec,
    dict: Option<Vec<u8>>,
    free: Mutex<Vec<Decoder>>,
}

/// Contexts kept per store beyond those in use; more are created on demand.
const POOL_KEEP: usize = 64;

impl DecoderPool {
    /// A pool for `codec`; builds one context now so a bad dictionary is
    /// reported when the store opens, not on its first read.
    pub(crate) fn new(codec: Codec, dict: Option<&[u8]>) -> Result<Self> {
        let first = Decoder::new(codec, dict)?;
        Ok(DecoderPool {
            codec,
            dict: dict.map(<[u8]>::to_vec),
            free: Mutex::new(vec![first]),
        })
    }

    /// Takes a context (creating one if none is free); it returns to the
    /// pool when dropped.
    pub(crate) fn get(&self) -> Result<PooledDecoder<'_>> {
        let cached = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let decoder = match cached {
            Some(d) => d,
            None => Decoder::new(self.codec, self.dict.as_deref())?,
        };
        Ok(PooledDecoder {
            pool: self,
            decoder: Some(decoder),
        })
    }
}

/// A decoder borrowed from a [`DecoderPool`].
pub(crate) struct PooledDecoder<'p> {
    pool: &'p DecoderPool,
    decoder: Option<Decoder>,
}

impl std::ops::Deref for PooledDecoder<'_> {
    type Target = Decoder;
    fn deref(&self) -> &Decoder {
        self.decoder.as_ref().expect("present until drop")
    }
}

impl std::ops::DerefMut for PooledDecoder<'_> {
    fn deref_mut(&mut self) -> &mut Decoder {
        self.decoder.as_mut().expect("present until drop")
    }
}

impl Drop for PooledDecoder<'_> {
    fn drop(&mut self) {
        if let Some(d) = self.decoder.take() {
            let mut free = self.pool.free.lock().unwrap_or_else(|p| p.into_inner());
            if free.len() < POOL_KEEP {
                free.push(d);
            }
        }
    }
}

/// Prepares the shared encoder dictionary of a zstd_dict writer, digested
/// for compression at `level` (the frames' level comes from it).
pub(crate) fn encoder_dictionary(bytes: &[u8], level: i32) -> Result<EncoderDictionary<'static>> {
    EncoderDictionary::try_copy(bytes, level).map_err(|e| {
        Error::InvalidArgument(format!("dictionary bytes are not usable by zstd: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_resolve_to_the_codec_default_or_the_choice() {
        assert_eq!(resolve_level(Codec::Zstd, None).unwrap(), Some(ZSTD_LEVEL));
        assert_eq!(
            resolve_level(Codec::ZstdDict, None).unwrap(),
            Some(ZSTD_DICT_LEVEL)
        );
        assert_eq!(resolve_level(Codec::Raw, None).unwrap(), None);
        let range = level_range();
        for level in [*range.start(), -5, 0, 1, 19, *range.end()] {
            assert_eq!(
                resolve_level(Codec::Zstd, Some(level)).unwrap(),
                Some(level)
            );
            assert_eq!(
                resolve_level(Codec::ZstdDict, Some(level)).unwrap(),
                Some(level)
            );
        }
        for level in [*range.start() - 1, *range.end() + 1, i32::MIN, i32::MAX] {
            let e = resolve_level(Codec::Zstd, Some(level)).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidArgument(m) if m.contains("zstd's range")),
                "{e:?}"
            );
        }
        let e = resolve_level(Codec::Raw, Some(3)).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("raw stores are not compressed")),
            "{e:?}"
        );
    }

    #[test]
    fn task_encoders_write_frames_at_their_level() {
        // Text-like: words of a small vocabulary picked by an LCG.
        let words = [
            "zstd ", "level ", "frame ", "record ", "store ", "loaderx ", "the ",
        ];
        let mut state = 12345u32;
        let mut record = Vec::new();
        while record.len() < 1 << 16 {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
            record.extend_from_slice(words[(state >> 16) as usize % words.len()].as_bytes());
        }
        let mut sizes = Vec::new();
        for level in [-5, 3, 19] {
            let mut enc = Encoder::new(Codec::Zstd, level, None, true).unwrap();
            let mut out = Vec::new();
            let n = enc.encode_into(&record, &mut out).unwrap();
            assert_eq!(zstd::bulk::decompress(&out, record.len()).unwrap(), record);
            sizes.push(n);
        }
        assert!(sizes[0] > sizes[1] && sizes[1] > sizes[2], "{sizes:?}");
    }
}
