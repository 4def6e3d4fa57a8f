//! Layout detection on stores written by later loaderx releases (the
//! fixtures under `tests/fixtures/later/`, made by `make_fixtures.py`).

use std::path::PathBuf;

use loaderx::schema::Kind;
use loaderx::store::{Layout, StoreReader};

fn fixture(release: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/later")
        .join(release)
        .join(name)
}

#[test]
fn each_layout_is_detected() {
    let cases = [
        (
            "2.0.0",
            "ragged_i32_rank2_raw",
            Kind::Ragged,
            Layout::V2_0_0,
        ),
        (
            "2.0.7",
            "ragged_i32_rank2_raw",
            Kind::Ragged,
            Layout::V2_0_1,
        ),
        ("2.0.7", "dense_f32_raw", Kind::Dense, Layout::V2_0_0),
        ("2.2.1", "dense_f32_zstd", Kind::Dense, Layout::V2_2),
        ("2.2.1", "ragged_i32_rank3_zstd", Kind::Ragged, Layout::V2_2),
        ("2.4.7", "dense_u8_zstd_dict", Kind::Dense, Layout::V2_3_3),
        (
            "2.8.12",
            "ragged_u8_rank1_zstd_dict",
            Kind::Ragged,
            Layout::V2_8_12,
        ),
        (
            "2.8.18",
            "ragged_i32_rank2_zstd",
            Kind::Ragged,
            Layout::V2_8_18,
        ),
        (
            "2.8.19",
            "dense_u8_raw_9_shards3",
            Kind::Dense,
            Layout::V2_8_18,
        ),
        (
            "2.8.19",
            "ragged_i32_rank2_zstd",
            Kind::Ragged,
            Layout::V2_8_19,
        ),
    ];
    for (release, name, kind, want) in cases {
        let r = StoreReader::open(fixture(release, name), kind)
            .unwrap_or_else(|e| panic!("{release}/{name}: {e}"));
        assert_eq!(r.layout().unwrap(), want, "{release}/{name}");
    }
}

#[test]
fn sharded_records_come_back_in_order() {
    // Nine 4-byte records 1..=36 round-robin over three data files.
    let r = StoreReader::open(fixture("2.3.3", "dense_u8_raw_9_shards3"), Kind::Dense).unwrap();
    let out = r.gather_dense(&(0..9).collect::<Vec<u64>>()).unwrap();
    assert_eq!(&out[..], &(1u8..=36).collect::<Vec<u8>>()[..]);
    let batch = StoreReader::open(fixture("2.8.19", "ragged_i32_rank3_zstd"), Kind::Ragged)
        .unwrap()
        .gather_ragged(&[1, 0])
        .unwrap();
    assert_eq!(batch.shape(0), &[2, 1, 1]);
    assert_eq!(batch.shape(1), &[1, 2, 3]);
}
