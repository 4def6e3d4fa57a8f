//! End-to-end behaviour of the store through the public Rust API.

use std::path::{Path, PathBuf};

use loaderx::store::{
    DenseReader, DenseWriter, RaggedReader, RaggedRecord, RaggedWriter, StoreReader,
};
use loaderx::{Codec, DType, Error, Kind};

const CODECS: [Codec; 3] = [Codec::Raw, Codec::Zstd, Codec::ZstdDict];

fn dict_for(codec: Codec, samples: &[Vec<u8>]) -> Option<Vec<u8>> {
    (codec == Codec::ZstdDict).then(|| {
        let mut c = loaderx::dict::SampleCollector::new(1 << 20);
        for s in samples {
            c.push(s);
        }
        c.train(16 << 10).expect("training")
    })
}

/// Record i of the Dense test stores: 3x5 little-endian u32, i*100 + k.
fn dense_record(i: u32) -> Vec<u8> {
    (0..15u32)
        .flat_map(|k| (i * 100 + k % 7).to_le_bytes())
        .collect()
}

/// Record i of the Ragged test stores: shape and i16 values depending on i.
fn ragged_record(i: u64) -> (Vec<u64>, Vec<u8>) {
    let shape: Vec<u64> = match i % 3 {
        0 => vec![],
        1 => vec![i % 11 + 1],
        _ => vec![2, i % 5 + 1],
    };
    let n: u64 = shape.iter().product();
    let payload = (0..n)
        .flat_map(|k| ((i * 3 + k) as i16).to_le_bytes())
        .collect();
    (shape, payload)
}

#[test]
fn dense_round_trip_every_codec() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<Vec<u8>> = (0..500).map(dense_record).collect();
    for codec in CODECS {
        let path = dir.path().join(codec.name());
        let dict = dict_for(codec, &records);
        let mut w = DenseWriter::create(
            &path,
            DType::parse("<u4").unwrap(),
            &[3, 5],
            codec,
            dict.clone(),
        )
        .unwrap();
        for chunk in records.chunks(123) {
            w.append(&chunk.concat()).unwrap();
        }
        assert_eq!(w.inner().len(), 500);
        w.close().unwrap();
        w.close().unwrap(); // harmless

        let r = DenseReader::open(&path).unwrap();
        assert_eq!(
            (r.len(), r.record_width(), r.item_shape()),
            (500, 60, &[3u64, 5][..])
        );
        assert_eq!(r.inner().dict_bytes(), dict.as_deref());
        let idx: Vec<u64> = (0..2000u64).map(|k| (k * 7919) % 500).collect();
        let mut out = vec![0u8; idx.len() * 60];
        r.gather_into(&idx, &mut out).unwrap();
        for (k, &i) in idx.iter().enumerate() {
            assert_eq!(
                &out[k * 60..(k + 1) * 60],
                &records[i as usize][..],
                "{codec:?} record {i}"
            );
        }
    }
}

#[test]
fn ragged_round_trip_every_codec() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<(Vec<u64>, Vec<u8>)> = (0..300).map(ragged_record).collect();
    let samples: Vec<Vec<u8>> = records.iter().map(|(_, p)| p.clone()).collect();
    for codec in CODECS {
        let path = dir.path().join(codec.name());
        let mut w = RaggedWriter::create(
            &path,
            DType::parse("<i2").unwrap(),
            codec,
            dict_for(codec, &samples),
        )
        .unwrap();
        for chunk in records.chunks(77) {
            let batch: Vec<RaggedRecord<'_>> = chunk
                .iter()
                .map(|(s, p)| RaggedRecord {
                    shape: s,
                    payload: p,
                })
                .collect();
            w.append(&batch).unwrap();
        }
        w.close().unwrap();
        let r = RaggedReader::open(&path).unwrap();
        let idx: Vec<u64> = (0..900u64).map(|k| (k * 31) % 300).collect();
        let batch = r.gather(&idx).unwrap();
        assert_eq!(batch.len(), idx.len());
        for (k, &i) in idx.iter().enumerate() {
            let (shape, payload) = &records[i as usize];
            assert_eq!(batch.shape(k), &shape[..], "{codec:?} record {i}");
            assert_eq!(batch.payload(k), &payload[..], "{codec:?} record {i}");
        }
        // Records 1, 4, 7, ... are all 1-D, so they pack.
        let ones: Vec<u64> = (0..50).map(|k| 3 * k + 1).collect();
        let packed = r.gather_packed(&ones).unwrap();
        let want: Vec<u8> = ones
            .iter()
            .flat_map(|&i| records[i as usize].1.clone())
            .collect();
        assert_eq!(packed.values, want);
        assert_eq!(packed.len(), 50);
        assert!(
            r.gather_packed(&[0, 1]).is_err(),
            "ranks 0 and 1 do not pack"
        );
    }
}

#[test]
fn out_of_range_and_empty_requests() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = DenseWriter::create(
        dir.path().join("d"),
        DType::parse("|u1").unwrap(),
        &[4],
        Codec::Zstd,
        None,
    )
    .unwrap();
    w.append(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    w.close().unwrap();
    let r = DenseReader::open(dir.path().join("d")).unwrap();
    let mut out = vec![0u8; 4];
    assert!(matches!(
        r.gather_into(&[2], &mut out),
        Err(Error::IndexOutOfRange(_))
    ));
    assert!(matches!(
        r.gather_into(&[0, 1], &mut out),
        Err(Error::BufferTooSmall(_))
    ));
    r.gather_into(&[], &mut []).unwrap();
    r.gather_into(&[1], &mut out).unwrap();
    assert_eq!(out, [5, 6, 7, 8]);
}

#[test]
fn an_unclosed_writer_leaves_a_store_that_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d");
    {
        let mut w =
            DenseWriter::create(&path, DType::parse("<f8").unwrap(), &[2], Codec::Raw, None)
                .unwrap();
        w.append(&[0u8; 160]).unwrap();
        // Dropped without close().
    }
    let err = DenseReader::open(&path).unwrap_err();
    assert_eq!(err.code(), Some(-8), "{err}");
    assert!(err.to_string().contains("never closed"), "{err}");
}

#[test]
fn locks_exclude_writers_and_readers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d");
    let mut w =
        DenseWriter::create(&path, DType::parse("|u1").unwrap(), &[1], Codec::Raw, None).unwrap();
    w.append(&[1, 2, 3]).unwrap();
    let busy = StoreReader::open(&path, Kind::Dense).unwrap_err();
    assert_eq!(busy.code(), Some(-13), "{busy}");
    w.close().unwrap();
    let r1 = DenseReader::open(&path).unwrap();
    let _r2 = DenseReader::open(&path).unwrap();
    let again = DenseWriter::create(&path, DType::parse("|u1").unwrap(), &[1], Codec::Raw, None)
        .unwrap_err();
    assert_eq!(again.code(), Some(-13), "{again}");
    drop(r1);
    drop(_r2);
    let exists = DenseWriter::create(&path, DType::parse("|u1").unwrap(), &[1], Codec::Raw, None)
        .unwrap_err();
    assert_eq!(exists.code(), Some(-12), "{exists}");
}

#[test]
fn a_failed_append_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let mut w =
        RaggedWriter::create(&path, DType::parse("<i4").unwrap(), Codec::Zstd, None).unwrap();
    let good = [1u8, 0, 0, 0];
    w.append(&[RaggedRecord {
        shape: &[1],
        payload: &good,
    }])
    .unwrap();
    let err = w
        .append(&[
            RaggedRecord {
                shape: &[1],
                payload: &good,
            },
            RaggedRecord {
                shape: &[2],
                payload: &good,
            }, // shape says 8 bytes
        ])
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(w
        .append(&[RaggedRecord {
            shape: &[0],
            payload: &[]
        }])
        .is_err());
    assert!(w.append(&[]).is_err());
    assert_eq!(w.inner().len(), 1);
    w.close().unwrap();
    assert_eq!(RaggedReader::open(&path).unwrap().len(), 1);
}

#[test]
fn argument_errors_at_create() {
    let dir = tempfile::tempdir().unwrap();
    let u1 = || DType::parse("|u1").unwrap();
    assert!(matches!(
        DenseWriter::create(dir.path().join("a"), u1(), &[0], Codec::Raw, None),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        DenseWriter::create(dir.path().join("b"), u1(), &[1], Codec::ZstdDict, None),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        DenseWriter::create(
            dir.path().join("c"),
            u1(),
            &[1],
            Codec::Zstd,
            Some(vec![1, 2, 3])
        ),
        Err(Error::InvalidArgument(_))
    ));
    assert!(
        !dir.path().join("a").exists(),
        "a refused create leaves nothing behind"
    );
}

#[test]
fn missing_and_malformed_stores() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        StoreReader::open(dir.path().join("nope"), Kind::Dense),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        StoreReader::open(dir.path(), Kind::Dense),
        Err(Error::NotFound { .. })
    ));

    let path = dir.path().join("d");
    let mut w = DenseWriter::create(
        &path,
        DType::parse("|u1").unwrap(),
        &[64],
        Codec::Zstd,
        None,
    )
    .unwrap();
    w.append(&[7u8; 64 * 10]).unwrap();
    w.close().unwrap();

    // A flipped frame byte is a decode error on that record only.
    let data = path.join("data.zr");
    let mut bytes = std::fs::read(&data).unwrap();
    let last = bytes.len() - 2;
    bytes[last] ^= 0xff;
    std::fs::write(&data, &bytes).unwrap();
    let r = DenseReader::open(&path).unwrap();
    let mut out = vec![0u8; 64];
    r.gather_into(&[0], &mut out).unwrap();
    let err = r.gather_into(&[9], &mut out).unwrap_err();
    assert_eq!(err.code(), Some(-7), "{err}");
    drop(r);

    // A truncated data.zr is refused at open.
    std::fs::write(&data, &bytes[..bytes.len() / 2]).unwrap();
    assert_eq!(DenseReader::open(&path).unwrap_err().code(), Some(-8));

    // A stray dict.zr on a zstd store is refused.
    std::fs::write(&data, &bytes).unwrap();
    std::fs::write(path.join("dict.zr"), b"x").unwrap();
    assert_eq!(DenseReader::open(&path).unwrap_err().code(), Some(-8));
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/loaderx-2.0.0")
}

/// The data of a version-1/2 .npy file (header skipped).
fn npy_data(path: &Path) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize,
            12,
        ),
    };
    bytes[start + len..].to_vec()
}

#[test]
fn loaderx_2_fixtures_read_back() {
    let root = fixtures();
    if !root.exists() {
        panic!("fixtures not found at {}", root.display());
    }
    let dense = [
        ("dense_bool_zstd", 40),
        ("dense_f16_raw", 50),
        ("dense_f32_raw", 97),
        ("dense_f32_zstd", 97),
        ("dense_i64_scalar_zstd", 333),
        ("dense_u8_zstd_dict", 200),
    ];
    for (name, len) in dense {
        let r = DenseReader::open(root.join(name)).unwrap();
        assert_eq!(r.len(), len, "{name}");
        let idx: Vec<u64> = (0..len).collect();
        let mut out = vec![0u8; idx.len() * r.record_width()];
        r.gather_into(&idx, &mut out).unwrap();
        assert_eq!(
            out,
            npy_data(&root.join(format!("{name}.expected.npy"))),
            "{name}"
        );
    }
    for (name, len) in [
        ("ragged_f64_mixed_rank_raw", 4),
        ("ragged_i32_tokens_raw", 150),
        ("ragged_i32_tokens_zstd", 150),
        ("ragged_i32_tokens_zstd_dict", 150),
        ("ragged_u8_images_zstd", 60),
    ] {
        let r = RaggedReader::open(root.join(name)).unwrap();
        assert_eq!(r.len(), len, "{name}");
        let idx: Vec<u64> = (0..len).collect();
        assert_eq!(r.gather(&idx).unwrap().len() as u64, len, "{name}");
    }
    // The three token stores hold the same records.
    let idx: Vec<u64> = (0..150).collect();
    let raw = RaggedReader::open(root.join("ragged_i32_tokens_raw"))
        .unwrap()
        .gather(&idx)
        .unwrap();
    for name in ["ragged_i32_tokens_zstd", "ragged_i32_tokens_zstd_dict"] {
        let other = RaggedReader::open(root.join(name))
            .unwrap()
            .gather(&idx)
            .unwrap();
        for k in 0..150 {
            assert_eq!(
                (raw.shape(k), raw.payload(k)),
                (other.shape(k), other.payload(k)),
                "{name} {k}"
            );
        }
    }
}

#[test]
fn both_data_access_modes_read_the_same_records() {
    use loaderx::store::DataAccess;
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<Vec<u8>> = (0..200).map(dense_record).collect();
    for codec in [Codec::Raw, Codec::Zstd] {
        let path = dir.path().join(codec.name());
        let mut w =
            DenseWriter::create(&path, DType::parse("<u4").unwrap(), &[3, 5], codec, None).unwrap();
        w.append(&records.concat()).unwrap();
        w.close().unwrap();
        let auto = StoreReader::open_with(&path, Kind::Dense, DataAccess::Auto).unwrap();
        // Small raw records are mapped; compressed ones are read.
        let expected = if codec == Codec::Raw {
            DataAccess::Map
        } else {
            DataAccess::Read
        };
        assert_eq!(auto.data_access(), expected);
        let idx: Vec<u64> = (0..500u64).map(|k| (k * 37) % 200).collect();
        let mut outs = Vec::new();
        for access in [DataAccess::Map, DataAccess::Read] {
            let r = StoreReader::open_with(&path, Kind::Dense, access).unwrap();
            assert_eq!(r.data_access(), access);
            let mut out = vec![0u8; idx.len() * 60];
            r.gather_fixed(&idx, 60, &mut out).unwrap();
            outs.push(out);
        }
        assert_eq!(outs[0], outs[1]);
        assert_eq!(&outs[0][60..120], &records[37][..]);
    }
}

#[test]
fn a_file_shortened_under_a_reading_handle_is_an_error() {
    use loaderx::store::DataAccess;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d");
    let mut w = DenseWriter::create(
        &path,
        DType::parse("|u1").unwrap(),
        &[4096],
        Codec::Raw,
        None,
    )
    .unwrap();
    w.append(&vec![9u8; 4096 * 8]).unwrap();
    w.close().unwrap();
    let r = StoreReader::open_with(&path, Kind::Dense, DataAccess::Read).unwrap();
    // A non-cooperating process truncates the payload behind the lock.
    std::fs::OpenOptions::new()
        .write(true)
        .open(path.join("data.zr"))
        .unwrap()
        .set_len(4096 * 2)
        .unwrap();
    let mut out = vec![0u8; 4096];
    r.gather_fixed(&[1], 4096, &mut out).unwrap();
    let err = r.gather_fixed(&[5], 4096, &mut out).unwrap_err();
    assert_eq!(err.code(), Some(-2), "{err}");
}

#[test]
fn batch_size_hints() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = DenseWriter::create(
        dir.path().join("d"),
        DType::parse("<u4").unwrap(),
        &[3, 5],
        Codec::Zstd,
        None,
    )
    .unwrap();
    w.append(&(0..4).flat_map(dense_record).collect::<Vec<u8>>())
        .unwrap();
    w.close().unwrap();
    let d = DenseReader::open(dir.path().join("d")).unwrap();
    assert_eq!(d.inner().batch_bytes_hint(7), 7 * 60, "exact for Dense");

    // Ragged: two record sizes alternating, so the mean is their midpoint.
    let mut w = RaggedWriter::create(
        dir.path().join("r"),
        DType::parse("<i2").unwrap(),
        Codec::Raw,
        None,
    )
    .unwrap();
    let (short, long) = (vec![0u8; 20], vec![0u8; 60]);
    let records: Vec<RaggedRecord<'_>> = (0..8)
        .map(|i| {
            if i % 2 == 0 {
                RaggedRecord {
                    shape: &[10],
                    payload: &short,
                }
            } else {
                RaggedRecord {
                    shape: &[30],
                    payload: &long,
                }
            }
        })
        .collect();
    w.append(&records).unwrap();
    w.close().unwrap();
    let r = RaggedReader::open(dir.path().join("r")).unwrap();
    let (a, b) = (
        r.inner().loc(0).unwrap().logic_length,
        r.inner().loc(1).unwrap().logic_length,
    );
    assert_eq!(b - a, 40);
    let mean = (a + b) as f64 / 2.0;
    assert_eq!(r.inner().mean_record_bytes(8).unwrap(), mean);
    assert_eq!(
        r.inner().mean_record_bytes(1000).unwrap(),
        mean,
        "probe capped at len"
    );
    assert_eq!(
        r.inner().mean_record_bytes(1).unwrap(),
        a as f64,
        "record 0 only"
    );
    // Each record also takes up to a 16-byte alignment slot.
    assert_eq!(r.inner().batch_bytes_hint(10), (mean as usize + 16) * 10);

    let empty = dir.path().join("e");
    RaggedWriter::create(&empty, DType::parse("<i2").unwrap(), Codec::Raw, None)
        .unwrap()
        .close()
        .unwrap();
    let e = RaggedReader::open(&empty).unwrap();
    assert_eq!(e.inner().mean_record_bytes(64).unwrap(), 0.0);
    assert_eq!(e.inner().batch_bytes_hint(10), 160);
}

/// Truncating either file under an open reader, in every access mode, is an
/// error from the next gather; nothing faults (a SIGBUS would end this test
/// binary, so passing here is the proof).
#[test]
fn truncation_under_a_reader_never_faults() {
    use loaderx::store::DataAccess;
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<u8> = (0..3000u32).flat_map(|i| [i as u8; 64]).collect();
    for codec in [Codec::Raw, Codec::Zstd] {
        for access in [DataAccess::Auto, DataAccess::Read, DataAccess::Map] {
            for file in ["meta.zr", "data.zr"] {
                let path = dir
                    .path()
                    .join(format!("{}-{access:?}-{file}", codec.name()));
                let mut w =
                    DenseWriter::create(&path, DType::parse("|u1").unwrap(), &[64], codec, None)
                        .unwrap();
                w.append(&records).unwrap();
                w.close().unwrap();
                let r = StoreReader::open_with(&path, Kind::Dense, access).unwrap();
                let mut out = vec![0u8; 64];
                r.gather_fixed(&[3], 64, &mut out).unwrap();
                assert_eq!(out, [3u8; 64]);
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(path.join(file))
                    .unwrap()
                    .set_len(4096)
                    .unwrap();
                // Record 2500's table chunk and frame both lie past the cut
                // (what was read before it stays readable: it is in memory).
                let err = r.gather_fixed(&[2500], 64, &mut out).unwrap_err();
                assert_eq!(err.code(), Some(-2), "{codec:?} {access:?} {file}: {err}");
                let msg = err.to_string();
                assert!(
                    msg.contains(file) || msg.contains("record table"),
                    "{codec:?} {access:?} {file}: {msg}"
                );
            }
        }
    }
}
