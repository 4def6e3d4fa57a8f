//! Per-record compression. Encoders are made per worker task and share one
//! prepared dictionary; decoders are pooled per store and reused across
//! gathers, each owning its digested copy of the dictionary.

use std::sync::Mutex;
use zstd::bulk::{Compressor, Decompressor};

use zstd::dict::EncoderDictionary;

use crate::error::{Error, Result};
use crate::format::Codec;

/// Level loaderx 2.0.0 writes plain zstd frames at.
pub const ZSTD_LEVEL: i32 = 3;
/// Level loaderx 2.0.0 writes dictionary frames at.
pub const ZSTD_DICT_LEVEL: i32 = 19;

/// Writes frames of one codec. Created per worker task.
pub(crate) enum Encoder<'d> {
    Raw,
    Zstd { ctx: Compressor<'d>, frame: Vec<u8> },
}

impl<'d> Encoder<'d> {
    /// An encoder of `codec`; with `checksum`, each zstd frame carries the
    /// content checksum libzstd verifies on every decode.
    pub(crate) fn new(
        codec: Codec,
        dict: Option<&'d EncoderDictionary<'static>>,
        checksum: bool,
    ) -> Result<Self> {
        let ctx = match (codec, dict) {
            (Codec::Raw, _) => return Ok(Encoder::Raw),
            (Codec::Zstd, _) => Compressor::new(ZSTD_LEVEL),
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

/// Prepares the shared encoder dictionary of a zstd_dict writer.
pub(crate) fn encoder_dictionary(bytes: &[u8]) -> Result<EncoderDictionary<'static>> {
    EncoderDictionary::try_copy(bytes, ZSTD_DICT_LEVEL).map_err(|e| {
        Error::InvalidArgument(format!("dictionary bytes are not usable by zstd: {e}"))
    })
}
