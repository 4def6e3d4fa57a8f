//! Compression levels: every level in zstd's range writes a store that reads
//! back exactly; the defaults are loaderx 2.0.0's; a level with the raw
//! codec, or outside zstd's range, is refused before anything is made.

use loaderx::remote::StorageOptions;
use loaderx::store::{
    CreateOptions, DatasetWriter, DenseReader, Sharding, StoreWriter, WriteOptions,
};
use loaderx::{Codec, DType, Error, Schema, ZSTD_DICT_LEVEL, ZSTD_LEVEL};

const WIDTH: usize = 4096;

/// Record i: compressible (runs and a slow ramp) but not trivially so.
fn record(i: usize) -> Vec<u8> {
    (0..WIDTH)
        .map(|k| ((k / 13 + i * 7) % 251) as u8 ^ (k * k + i).is_multiple_of(17) as u8)
        .collect()
}

fn schema() -> Schema {
    Schema::dense(DType::parse("|u1").unwrap(), vec![WIDTH as u64]).unwrap()
}

fn dictionary(records: &[Vec<u8>]) -> Vec<u8> {
    let mut c = loaderx::dict::SampleCollector::new(1 << 20);
    for r in records {
        c.push(r);
    }
    c.train(8 << 10).expect("training")
}

/// Writes `records` at `level`, checks what the writer reports, reads every
/// record back and returns the payload size.
fn round_trip(codec: Codec, level: Option<i32>, records: &[Vec<u8>], dict: Option<&[u8]>) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let options = CreateOptions::new(codec, dict.map(<[u8]>::to_vec)).with_level(level);
    let mut w = StoreWriter::create(&path, schema(), options).unwrap();
    let want = level.or(loaderx::default_level(codec));
    assert_eq!(w.level(), want, "{codec:?} at {level:?}");
    for chunk in records.chunks(37) {
        w.append_dense(&chunk.concat()).unwrap();
    }
    w.close(false).unwrap();
    let size = w.payload_bytes();

    let r = DenseReader::open(&path).unwrap();
    let idx: Vec<u64> = (0..records.len() as u64).rev().collect();
    let mut out = vec![0u8; idx.len() * WIDTH];
    r.gather_into(&idx, &mut out).unwrap();
    for (k, &i) in idx.iter().enumerate() {
        assert!(
            out[k * WIDTH..(k + 1) * WIDTH] == records[i as usize][..],
            "{codec:?} level {level:?}: record {i} differs"
        );
    }
    size
}

#[test]
fn every_level_round_trips() {
    let records: Vec<Vec<u8>> = (0..150).map(record).collect();
    let range = loaderx::level_range();
    let (min, max) = (*range.start(), *range.end());
    assert!(min < -5 && max >= 19, "zstd's range is {min}..={max}");
    for level in [min, -5, -1, 0, 1, 3, 9, 19, max] {
        round_trip(Codec::Zstd, Some(level), &records, None);
    }
    let dict = dictionary(&records);
    for level in [-5, 1, 3, 19] {
        round_trip(Codec::ZstdDict, Some(level), &records, Some(&dict));
    }
}

#[test]
fn the_level_shapes_the_frames() {
    let records: Vec<Vec<u8>> = (0..150).map(record).collect();
    let fast = round_trip(Codec::Zstd, Some(-5), &records, None);
    let default = round_trip(Codec::Zstd, None, &records, None);
    let three = round_trip(Codec::Zstd, Some(3), &records, None);
    let strong = round_trip(Codec::Zstd, Some(19), &records, None);
    assert_eq!(default, three, "None is level 3 for zstd");
    assert!(
        fast > three && three > strong,
        "{fast} > {three} > {strong}"
    );

    let dict = dictionary(&records);
    let dict_default = round_trip(Codec::ZstdDict, None, &records, Some(&dict));
    let dict_19 = round_trip(Codec::ZstdDict, Some(19), &records, Some(&dict));
    let dict_1 = round_trip(Codec::ZstdDict, Some(1), &records, Some(&dict));
    assert_eq!(dict_default, dict_19, "None is level 19 for zstd_dict");
    assert!(dict_1 > dict_19, "{dict_1} > {dict_19}");
}

#[test]
fn defaults_are_loaderx_2_0_0s() {
    assert_eq!(loaderx::default_level(Codec::Zstd), Some(ZSTD_LEVEL));
    assert_eq!(
        loaderx::default_level(Codec::ZstdDict),
        Some(ZSTD_DICT_LEVEL)
    );
    assert_eq!(loaderx::default_level(Codec::Raw), None);
    assert_eq!((ZSTD_LEVEL, ZSTD_DICT_LEVEL), (3, 19));
    let dir = tempfile::tempdir().unwrap();
    let w = StoreWriter::create(
        dir.path().join("raw"),
        schema(),
        CreateOptions::new(Codec::Raw, None),
    )
    .unwrap();
    assert_eq!(w.level(), None);
}

#[test]
fn refused_levels_make_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let range = loaderx::level_range();
    let cases = [
        (Codec::Raw, 3, "raw stores are not compressed"),
        (Codec::Raw, 0, "raw stores are not compressed"),
        (
            Codec::Zstd,
            *range.end() + 1,
            "level must be in zstd's range",
        ),
        (
            Codec::Zstd,
            *range.start() - 1,
            "level must be in zstd's range",
        ),
        (
            Codec::ZstdDict,
            *range.end() + 1,
            "level must be in zstd's range",
        ),
    ];
    let trained = dictionary(&(0..150).map(record).collect::<Vec<_>>());
    for (k, (codec, level, words)) in cases.into_iter().enumerate() {
        let dict = (codec == Codec::ZstdDict).then(|| trained.clone());
        let path = dir.path().join(format!("plain{k}"));
        let options = CreateOptions::new(codec, dict.clone()).with_level(Some(level));
        match StoreWriter::create(&path, schema(), options) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(words), "{m}"),
            other => panic!("{codec:?} at {level}: {other:?}"),
        }
        assert!(!path.exists(), "a refused create leaves nothing behind");

        // A store set is refused before its root is claimed.
        let root = dir.path().join(format!("set{k}"));
        let options = WriteOptions {
            codec,
            dict,
            sharding: Some(Sharding {
                records: Some(10),
                bytes: None,
            }),
            checksums: true,
            level: Some(level),
            storage: StorageOptions::new(),
        };
        match DatasetWriter::create(root.to_str().unwrap(), schema(), options) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(words), "{m}"),
            other => panic!("set, {codec:?} at {level}: {other:?}"),
        }
        assert!(!root.exists(), "a refused set leaves nothing behind");
    }
}

#[test]
fn a_store_set_writes_every_shard_at_its_level() {
    let records: Vec<Vec<u8>> = (0..100).map(record).collect();
    let dir = tempfile::tempdir().unwrap();
    let mut sizes = Vec::new();
    for level in [-5, 19] {
        let root = dir.path().join(format!("set{level}"));
        let options = WriteOptions {
            codec: Codec::Zstd,
            dict: None,
            sharding: Some(Sharding {
                records: Some(30),
                bytes: None,
            }),
            checksums: true,
            level: Some(level),
            storage: StorageOptions::new(),
        };
        let mut w = DatasetWriter::create(root.to_str().unwrap(), schema(), options).unwrap();
        for chunk in records.chunks(25) {
            w.append_dense(&chunk.concat()).unwrap();
        }
        w.close(false).unwrap();
        let shard_sizes: Vec<u64> = (0..4)
            .map(|k| {
                let shard = root.join(format!("shard-{k:06}"));
                std::fs::metadata(shard.join("data.zr")).unwrap().len()
            })
            .collect();
        let r = loaderx::store::StoreReader::open_location(
            root.to_str().unwrap(),
            loaderx::Kind::Dense,
            loaderx::store::DataAccess::Read,
            &StorageOptions::new(),
        )
        .unwrap();
        assert_eq!(r.len(), 100);
        let mut out = vec![0u8; 100 * WIDTH];
        r.gather_fixed(&(0..100).collect::<Vec<u64>>(), WIDTH, &mut out)
            .unwrap();
        assert!(out == records.concat(), "set at level {level} reads back");
        sizes.push(shard_sizes);
    }
    // Every full shard (30 records) is smaller at 19 than at -5.
    for k in 0..3 {
        assert!(sizes[0][k] > sizes[1][k], "shard {k}: {sizes:?}");
    }
}
