//! A loader gathers Dense columns into memory its consumer lends, and
//! falls back to its own buffers when none is free.

use std::ptr::NonNull;
use std::sync::Arc;

use loaderx::lent::{BatchBytes, LentPool};
use loaderx::loader::{Column, Loader, LoaderConfig, Packed, Source};
use loaderx::sampler::Mode;
use loaderx::store::{DenseReader, DenseWriter, RaggedReader, RaggedRecord, RaggedWriter};
use loaderx::{Codec, DType};

/// Lends `count` boxed regions of `len` bytes; returns their start addresses.
fn lend(pool: &LentPool, count: usize, len: usize) -> Vec<usize> {
    (0..count)
        .map(|_| {
            let mut region = vec![0u8; len].into_boxed_slice();
            let ptr = NonNull::new(region.as_mut_ptr()).unwrap();
            // SAFETY: the box becomes the owner, so the memory lives as long
            // as the pool needs it, and nothing else touches it.
            unsafe { pool.lend(ptr, len, Box::new(region)) };
            ptr.as_ptr() as usize
        })
        .collect()
}

#[test]
fn dense_columns_land_in_lent_memory_and_ragged_ones_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = DenseWriter::create(
        dir.path().join("d"),
        DType::parse("<u4").unwrap(),
        &[2],
        Codec::Zstd,
        None,
    )
    .unwrap();
    let values: Vec<u8> = (0u32..200).flat_map(|v| v.to_le_bytes()).collect();
    w.append(&values).unwrap();
    w.close().unwrap();
    let mut r = RaggedWriter::create(
        dir.path().join("r"),
        DType::parse("|u1").unwrap(),
        Codec::Raw,
        None,
    )
    .unwrap();
    let payloads: Vec<[u8; 3]> = (0..100u8).map(|i| [i; 3]).collect();
    let records: Vec<RaggedRecord<'_>> = payloads
        .iter()
        .map(|p| RaggedRecord {
            shape: &[3],
            payload: p,
        })
        .collect();
    r.append(&records).unwrap();
    r.close().unwrap();

    let pool = LentPool::new();
    let regions = lend(&pool, 8, 10 * 8);
    let sources: Vec<Arc<dyn Source>> = vec![
        Arc::new(DenseReader::open(dir.path().join("d")).unwrap()),
        Arc::new(Packed(RaggedReader::open(dir.path().join("r")).unwrap())),
    ];
    let config = LoaderConfig {
        batch_size: 10,
        mode: Mode::Sequential,
        prefetch: 2,
        lent: Some(Arc::clone(&pool)),
        ..LoaderConfig::default()
    };
    let mut loader = Loader::new(sources, config).unwrap();
    for step in 0..25u64 {
        let batch = loader.next().unwrap().unwrap();
        let Column::Dense(d) = &batch.columns[0] else {
            panic!("dense")
        };
        let BatchBytes::Lent(buf) = &d.data else {
            panic!("step {step}: not in lent memory")
        };
        assert!(regions.contains(&(buf.as_ptr() as usize)));
        let expected: Vec<u8> = batch
            .indices
            .iter()
            .flat_map(|&i| [2 * i as u32, 2 * i as u32 + 1])
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(&d.data[..], &expected[..], "step {step}");
        assert!(matches!(batch.columns[1], Column::Packed(_)));
    }
    loader.close();
    let stats = pool.stats();
    assert_eq!((stats.lent >= 25, stats.fallback), (true, 0));
    drop(loader);
    assert_eq!(pool.stats().free, 8, "every region came back");
}

#[test]
fn no_free_region_means_an_engine_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = DenseWriter::create(
        dir.path(),
        DType::parse("|u1").unwrap(),
        &[4],
        Codec::Raw,
        None,
    )
    .unwrap();
    w.append(&(0u8..64).collect::<Vec<u8>>()).unwrap();
    w.close().unwrap();
    let pool = LentPool::new();
    lend(&pool, 1, 7); // smaller than a batch of 2 records
    let config = LoaderConfig {
        batch_size: 2,
        mode: Mode::Sequential,
        lent: Some(Arc::clone(&pool)),
        ..LoaderConfig::default()
    };
    let mut loader = Loader::new(
        vec![Arc::new(DenseReader::open(dir.path()).unwrap())],
        config,
    )
    .unwrap();
    let batch = loader.next().unwrap().unwrap();
    let Column::Dense(d) = &batch.columns[0] else {
        panic!("dense")
    };
    assert!(matches!(d.data, BatchBytes::Heap(_)));
    assert_eq!(&d.data[..], &[0, 1, 2, 3, 4, 5, 6, 7]);
    loader.close();
    assert!(pool.stats().fallback >= 1);
    assert_eq!(pool.stats().lent, 0);
}
