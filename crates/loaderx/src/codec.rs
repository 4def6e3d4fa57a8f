//! Per-record compression: one encoder or decoder context per worker task,
//! reused for every record the task handles; dictionaries are prepared once
//! per store and shared read-only by every context.

use zstd::bulk::{Compressor, Decompressor};
use zstd::dict::{DecoderDictionary, EncoderDictionary};

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
    pub(crate) fn new(codec: Codec, dict: Option<&'d EncoderDictionary<'static>>) -> Result<Self> {
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

/// Reads frames of one codec into caller memory. Created per worker task.
pub(crate) enum Decoder<'d> {
    Raw,
    Zstd(Decompressor<'d>),
}

impl<'d> Decoder<'d> {
    pub(crate) fn new(codec: Codec, dict: Option<&'d DecoderDictionary<'static>>) -> Result<Self> {
        let ctx = match (codec, dict) {
            (Codec::Raw, _) => return Ok(Decoder::Raw),
            (Codec::Zstd, _) => Decompressor::new(),
            (Codec::ZstdDict, Some(d)) => Decompressor::with_prepared_dictionary(d),
            (Codec::ZstdDict, None) => {
                return Err(Error::InvalidFormat(
                    "a zstd_dict store has no dictionary".into(),
                ))
            }
        }
        .map_err(|e| Error::OutOfMemory(format!("creating a zstd decompression context: {e}")))?;
        Ok(Decoder::Zstd(ctx))
    }

    /// Decodes record `index`'s frame straight into `dst`, which must end up
    /// exactly full.
    #[inline]
    pub(crate) fn decode_into(&mut self, index: u64, frame: &[u8], dst: &mut [u8]) -> Result<()> {
        match self {
            Decoder::Raw => {
                if frame.len() != dst.len() {
                    return Err(Error::Corrupt(format!(
                        "record {index}: stored {} bytes, expected {}",
                        frame.len(),
                        dst.len()
                    )));
                }
                dst.copy_from_slice(frame);
                Ok(())
            }
            Decoder::Zstd(ctx) => {
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
        }
    }
}

/// Prepares the shared encoder dictionary of a zstd_dict writer.
pub(crate) fn encoder_dictionary(bytes: &[u8]) -> Result<EncoderDictionary<'static>> {
    EncoderDictionary::try_copy(bytes, ZSTD_DICT_LEVEL).map_err(|e| {
        Error::InvalidArgument(format!("dictionary bytes are not usable by zstd: {e}"))
    })
}

/// Prepares the shared decoder dictionary of a zstd_dict reader.
pub(crate) fn decoder_dictionary(bytes: &[u8]) -> Result<DecoderDictionary<'static>> {
    DecoderDictionary::try_copy(bytes)
        .map_err(|e| Error::InvalidFormat(format!("dict.zr is not a usable zstd dictionary: {e}")))
}
