//! Store sets on local disk: rollover, reads spanning shards, and every way
//! a set can be incomplete or inconsistent.

use std::path::Path;
use std::sync::Arc;

use loaderx::loader::{Column, Loader, LoaderConfig, Source};
use loaderx::remote::StorageOptions;
use loaderx::sampler::Mode;
use loaderx::store::manifest::{Manifest, MANIFEST_FILE};
use loaderx::store::{
    commit_set, write_shard, DataAccess, DatasetWriter, RaggedRecord, Sharding, StoreReader,
    WriteOptions,
};
use loaderx::{Codec, DType, Error, Kind, Schema};

fn u4_pairs() -> Schema {
    Schema::dense(DType::parse("<u4").unwrap(), vec![2]).unwrap()
}

/// Record i of the Dense sets: (i, 1000 + i) as little-endian u32.
fn pair(i: u32) -> Vec<u8> {
    [i, 1000 + i].iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn options(codec: Codec, records: Option<u64>, bytes: Option<u64>) -> WriteOptions {
    WriteOptions {
        codec,
        dict: None,
        sharding: Some(Sharding { records, bytes }),
        checksums: true,
        level: None,
        storage: StorageOptions::new(),
    }
}

fn build_dense(path: &Path, n: u32, opts: WriteOptions, chunk: usize) -> DatasetWriter {
    let mut w = DatasetWriter::create(path.to_str().unwrap(), u4_pairs(), opts).unwrap();
    let all: Vec<u8> = (0..n).flat_map(pair).collect();
    for part in all.chunks(chunk * 8) {
        w.append_dense(part).unwrap();
    }
    w
}

fn open(path: &Path, kind: Kind) -> Result<StoreReader, Error> {
    StoreReader::open_location(
        path.to_str().unwrap(),
        kind,
        DataAccess::Auto,
        &StorageOptions::new(),
    )
}

fn manifest_of(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path.join(MANIFEST_FILE)).unwrap()).unwrap()
}

fn rewrite_manifest(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut m = manifest_of(path);
    edit(&mut m);
    std::fs::write(path.join(MANIFEST_FILE), serde_json::to_vec(&m).unwrap()).unwrap();
}

#[test]
fn records_roll_over_and_read_back_as_one_store() {
    let dir = tempfile::tempdir().unwrap();
    for codec in [Codec::Raw, Codec::Zstd] {
        let path = dir.path().join(codec.name());
        // Appends of 3 records against shards of 4: splits inside appends.
        let mut w = build_dense(&path, 10, options(codec, Some(4), None), 3);
        assert_eq!(w.len(), 10);
        assert!(
            !path.join(MANIFEST_FILE).exists(),
            "the manifest comes last"
        );
        w.close(false).unwrap();
        let m = manifest_of(&path);
        let shards: Vec<(String, u64)> = m["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["path"].as_str().unwrap().to_string(),
                    s["records"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            shards,
            [
                ("shard-000000".into(), 4),
                ("shard-000001".into(), 4),
                ("shard-000002".into(), 2)
            ]
        );
        assert_eq!(
            (m["records"].as_u64(), m["codec"].as_str()),
            (Some(10), Some(codec.name()))
        );

        let r = open(&path, Kind::Dense).unwrap();
        assert_eq!((r.len(), r.shard_count(), r.codec()), (10, 3, codec));
        // One gather across every shard, in the caller's order, with repeats.
        let idx = [9u64, 0, 4, 3, 8, 4, 5];
        let mut out = vec![0u8; idx.len() * 8];
        r.gather_fixed(&idx, 8, &mut out).unwrap();
        let expected: Vec<u8> = idx.iter().flat_map(|&i| pair(i as u32)).collect();
        assert_eq!(out, expected);
        // A large gather takes the parallel path.
        let big: Vec<u64> = (0..40_000u64).map(|k| (k * 7) % 10).collect();
        let mut out = vec![0u8; big.len() * 8];
        r.gather_fixed(&big, 8, &mut out).unwrap();
        assert!(out.chunks(8).zip(&big).all(|(c, &i)| c == pair(i as u32)));
        let e = r.gather_fixed(&[10], 8, &mut [0u8; 8]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "index 10 is out of range for a store of 10 records"
        );
        // Every shard is a plain store on its own.
        let shard = open(&path.join("shard-000001"), Kind::Dense).unwrap();
        let mut out = vec![0u8; 8];
        shard.gather_fixed(&[0], 8, &mut out).unwrap();
        assert_eq!(out, pair(4));
    }
}

#[test]
fn byte_limits_split_appends() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bytes");
    // 8-byte raw records, shards of 20 bytes: two records fit below the
    // limit, the third reaches it.
    let mut w = build_dense(&path, 7, options(Codec::Raw, None, Some(20)), 7);
    w.close(false).unwrap();
    let r = open(&path, Kind::Dense).unwrap();
    let sizes: Vec<u64> = r
        .manifest()
        .unwrap()
        .shards
        .iter()
        .map(|s| s.records)
        .collect();
    assert_eq!(sizes, [3, 3, 1]);
    assert_eq!(r.tail_offset(), 56);
    // Both limits: whichever comes first.
    let path = dir.path().join("both");
    let mut w = build_dense(&path, 7, options(Codec::Raw, Some(2), Some(20)), 1);
    w.close(false).unwrap();
    let sizes: Vec<u64> = open(&path, Kind::Dense)
        .unwrap()
        .manifest()
        .unwrap()
        .shards
        .iter()
        .map(|s| s.records)
        .collect();
    assert_eq!(sizes, [2, 2, 2, 1]);
}

#[test]
fn an_exactly_full_last_shard_leaves_no_empty_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let mut w = build_dense(&path, 8, options(Codec::Zstd, Some(4), None), 8);
    w.close(false).unwrap();
    let r = open(&path, Kind::Dense).unwrap();
    assert_eq!(r.shard_count(), 2);
    assert!(!path.join("shard-000002").exists());
    // An empty set is one empty shard.
    let empty = dir.path().join("empty");
    let mut w = DatasetWriter::create(
        empty.to_str().unwrap(),
        u4_pairs(),
        options(Codec::Raw, Some(4), None),
    )
    .unwrap();
    w.close(true).unwrap();
    let r = open(&empty, Kind::Dense).unwrap();
    assert_eq!((r.len(), r.shard_count()), (0, 1));
}

#[test]
fn ragged_sets_gather_and_pack_across_shards() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    let schema = Schema::ragged(DType::parse("<i2").unwrap());
    let mut w = DatasetWriter::create(
        path.to_str().unwrap(),
        schema,
        options(Codec::Zstd, Some(3), None),
    )
    .unwrap();
    let payloads: Vec<Vec<u8>> = (0..8i16)
        .map(|i| (0..=i).flat_map(|v| (v * 10).to_le_bytes()).collect())
        .collect();
    let shapes: Vec<[u64; 1]> = (0..8u64).map(|i| [i + 1]).collect();
    let records: Vec<RaggedRecord<'_>> = payloads
        .iter()
        .zip(&shapes)
        .map(|(p, s)| RaggedRecord {
            shape: s,
            payload: p,
        })
        .collect();
    w.append_ragged(&records).unwrap();
    w.close(false).unwrap();
    let r = open(&path, Kind::Ragged).unwrap();
    assert_eq!((r.len(), r.shard_count()), (8, 3));
    let batch = r.gather_ragged(&[7, 0, 3]).unwrap();
    assert_eq!(batch.shape(0), &[8]);
    assert_eq!(batch.payload(2), &payloads[3][..]);
    let packed = r.gather_ragged(&[2, 6]).unwrap().into_packed().unwrap();
    assert_eq!(packed.cu_seqlens, [0, 3, 10]);
    assert_eq!(packed.values, [&payloads[2][..], &payloads[6][..]].concat());
    // Opening a Ragged set as Dense is a schema error, as for one store.
    let e = open(&path, Kind::Dense).unwrap_err();
    assert!(matches!(e, Error::Schema(_)), "{e}");
    assert!(e.to_string().contains("is a ragged store set"), "{e}");
}

#[test]
fn a_loader_reads_a_set_like_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    build_dense(&path, 10, options(Codec::Zstd, Some(3), None), 10)
        .close(false)
        .unwrap();
    let source: Arc<dyn Source> = Arc::new(open(&path, Kind::Dense).unwrap());
    let config = LoaderConfig {
        batch_size: 4,
        mode: Mode::Sequential,
        ..LoaderConfig::default()
    };
    let mut loader = Loader::new(vec![source], config).unwrap();
    for step in 0..3u64 {
        let batch = loader.next().unwrap().unwrap();
        let Column::Dense(d) = &batch.columns[0] else {
            panic!("dense")
        };
        let expected: Vec<u8> = batch.indices.iter().flat_map(|&i| pair(i as u32)).collect();
        assert_eq!(&d.data[..], &expected[..], "step {step}");
    }
    loader.close();
}

#[test]
fn incomplete_and_inconsistent_sets_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = |name: &str| {
        let path = dir.path().join(name);
        build_dense(&path, 10, options(Codec::Raw, Some(4), None), 10)
            .close(false)
            .unwrap();
        path
    };
    let msg = |path: &Path| open(path, Kind::Dense).unwrap_err().to_string();

    // A writer that never closed: shards, no manifest.
    let path = dir.path().join("unclosed");
    let w = build_dense(&path, 10, options(Codec::Raw, Some(4), None), 10);
    drop(w);
    assert!(
        msg(&path).contains("holds stores but no manifest.json"),
        "{}",
        msg(&path)
    );

    let path = fresh("missing");
    std::fs::remove_dir_all(path.join("shard-000001")).unwrap();
    let m = msg(&path);
    assert!(
        m.contains("shard \"shard-000001\" listed in the manifest.json is missing"),
        "{m}"
    );

    let path = fresh("count");
    rewrite_manifest(&path, |v| {
        v["shards"][0]["records"] = 5.into();
        v["records"] = 11.into();
    });
    let m = msg(&path);
    assert!(m.contains("it holds 4 records, the manifest says 5"), "{m}");

    let path = fresh("bytes");
    rewrite_manifest(&path, |v| v["shards"][2]["data_bytes"] = 1.into());
    assert!(msg(&path).contains("it holds 16 payload bytes, the manifest says 1"));

    let path = fresh("dtype");
    rewrite_manifest(&path, |v| v["dtype"] = "<i4".into());
    assert!(msg(&path).contains("disagrees with its manifest.json: it stores"));

    let path = fresh("codec");
    rewrite_manifest(&path, |v| v["codec"] = "zstd".into());
    assert!(msg(&path).contains("its codec is raw, the set's zstd"));

    let path = fresh("duplicate");
    rewrite_manifest(&path, |v| v["shards"][1]["path"] = "shard-000000".into());
    assert!(msg(&path).contains("listed twice"));

    let path = fresh("escape");
    rewrite_manifest(&path, |v| v["shards"][0]["path"] = "../missing".into());
    assert!(msg(&path).contains("no empty, '.' or '..' parts"));

    let path = fresh("garbage");
    std::fs::write(path.join(MANIFEST_FILE), b"\x00\x01not json").unwrap();
    let e = open(&path, Kind::Dense).unwrap_err();
    assert!(matches!(e, Error::InvalidFormat(_)), "{e}");
    assert_eq!(e.code(), Some(-8));

    // A shard whose writer never closed, named by a hand-made manifest.
    let path = fresh("uncommitted");
    let meta = path.join("shard-000002").join("meta.zr");
    let mut bytes = std::fs::read(&meta).unwrap();
    bytes[16..20].copy_from_slice(&0u32.to_le_bytes());
    std::fs::write(&meta, bytes).unwrap();
    let m = msg(&path);
    assert!(
        m.contains("shard \"shard-000002\" of the set") && m.contains("never closed"),
        "{m}"
    );
}

#[test]
fn create_refuses_a_used_root_and_leaves_no_debris_on_failure() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("x"), b"").unwrap();
    let e = DatasetWriter::create(
        path.to_str().unwrap(),
        u4_pairs(),
        options(Codec::Raw, Some(2), None),
    )
    .unwrap_err();
    assert!(matches!(e, Error::AlreadyExists(_)), "{e}");
    // zstd_dict without a dictionary fails at the first shard: the set's
    // root it created goes with it.
    let path = dir.path().join("nodict");
    let e = DatasetWriter::create(
        path.to_str().unwrap(),
        u4_pairs(),
        options(Codec::ZstdDict, Some(2), None),
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(!path.exists());
    let e = DatasetWriter::create(
        path.to_str().unwrap(),
        u4_pairs(),
        options(Codec::Raw, Some(0), None),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "shard_records and shard_bytes must be positive"
    );
}

#[test]
fn independent_shards_commit_into_a_set() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("built");
    let root_s = root.to_str().unwrap();
    let storage = StorageOptions::new();
    // Two tasks write their parts in any order; commit fixes the order.
    let b = write_shard(
        root_s,
        "part-b",
        u4_pairs(),
        Codec::Zstd,
        None,
        &storage,
        |w| w.append_dense(&(5..8).flat_map(pair).collect::<Vec<u8>>()),
    )
    .unwrap();
    let a = write_shard(
        root_s,
        "part-a",
        u4_pairs(),
        Codec::Zstd,
        None,
        &storage,
        |w| w.append_dense(&(0..5).flat_map(pair).collect::<Vec<u8>>()),
    )
    .unwrap();
    assert_eq!((a.records, b.records), (5, 3));
    let m = commit_set(
        root_s,
        &u4_pairs(),
        Codec::Zstd,
        vec![a.clone(), b.clone()],
        &storage,
    )
    .unwrap();
    assert_eq!(m.records, 8);
    let r = open(&root, Kind::Dense).unwrap();
    let mut out = vec![0u8; 16];
    r.gather_fixed(&[7, 0], 8, &mut out).unwrap();
    assert_eq!(out, [pair(7), pair(0)].concat());
    // A commit naming a shard that is not there publishes nothing.
    let other = dir.path().join("bad");
    std::fs::create_dir(&other).unwrap();
    let e = commit_set(
        other.to_str().unwrap(),
        &u4_pairs(),
        Codec::Zstd,
        vec![a],
        &storage,
    )
    .unwrap_err();
    assert!(e.to_string().contains("is missing"), "{e}");
    assert!(!other.join(MANIFEST_FILE).exists());
    // The manifest parses as written.
    let text = std::fs::read(root.join(MANIFEST_FILE)).unwrap();
    assert_eq!(Manifest::parse(&text, "x").unwrap(), m);
}
