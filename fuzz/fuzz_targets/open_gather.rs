//! Fuzz target: arbitrary meta.zr / data.zr / dict.zr contents are opened as
//! Dense and as Ragged and gathered. See `../harness.rs` for the input
//! encoding and the checks; `crates/loaderx/tests/fuzz_corpus.rs` replays the
//! corpus through the same harness on stable Rust.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

#[path = "../harness.rs"]
mod harness;

#[global_allocator]
static ALLOC: harness::CountingAlloc = harness::CountingAlloc;

fn workdir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = PathBuf::from("/dev/shm");
        let base = if base.is_dir() {
            base
        } else {
            std::env::temp_dir()
        };
        base.join(format!("loaderx-fuzz-{}", std::process::id()))
            .join("store")
    })
}

fuzz_target!(|data: &[u8]| {
    harness::run(data, workdir());
});
