//! Replays the `open_gather` fuzz corpus and the saved regressions on stable
//! Rust, through the same harness the fuzz target runs (`fuzz/harness.rs`).
//!
//! Every file under `fuzz/corpus/` and `fuzz/regressions/` is one input: its
//! store files are written to a temporary directory, opened as Dense and as
//! Ragged and gathered; any panic, disagreement between batch and
//! record-by-record gathers, or allocation beyond the requested logical
//! sizes fails the test, naming the file.
//!
//! Inputs under a `known/` folder are crashes not fixed yet: they are
//! replayed only by the ignored `known_crashes` test.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

#[path = "../../../fuzz/harness.rs"]
mod harness;

// Allocation accounting is process-wide: one replay at a time.
#[global_allocator]
static ALLOC: harness::CountingAlloc = harness::CountingAlloc;
static SERIAL: Mutex<()> = Mutex::new(());

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn inputs(root: &Path, known: bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.is_file() {
                let in_known = path
                    .strip_prefix(root)
                    .map(|rel| rel.components().any(|c| c.as_os_str() == "known"))
                    .unwrap_or(false);
                let is_input = path.extension().is_none_or(|e| e == "bin");
                if is_input && in_known == known {
                    out.push(path);
                }
            }
        }
    }
    out.sort();
    out
}

fn replay(files: &[PathBuf]) -> Vec<String> {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let work = tempfile::tempdir().expect("temp dir");
    let store = work.path().join("store");
    let mut failures = Vec::new();
    for file in files {
        let bytes = std::fs::read(file).expect("reading a corpus file");
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| harness::run(&bytes, &store))) {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic".into());
            failures.push(format!("{}: {why}", file.display()));
        }
    }
    failures
}

#[test]
fn corpus_and_regressions_replay_cleanly() {
    let root = fuzz_dir();
    let mut files = inputs(&root.join("corpus"), false);
    files.extend(inputs(&root.join("regressions"), false));
    assert!(
        !files.is_empty(),
        "no fuzz inputs found under {}",
        root.display()
    );
    let failures = replay(&files);
    eprintln!("replayed {} fuzz inputs", files.len());
    assert!(
        failures.is_empty(),
        "{} of {} fuzz inputs failed:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

#[test]
fn encoding_round_trips() {
    let meta: Vec<u8> = (0..4200u32)
        .map(|i| if (40..4096).contains(&i) { 0 } else { i as u8 })
        .collect();
    let enc = harness::encode(&meta, Some(b"data"), Some(b"dict"), b"\x01\x02\x00");
    let files = harness::decode(&enc);
    assert_eq!(files.meta, meta);
    assert_eq!(files.data, Some(&b"data"[..]));
    assert_eq!(files.dict, Some(&b"dict"[..]));
    assert_eq!(files.script, b"\x01\x02\x00");
    let short = harness::encode(b"abc", None, None, b"");
    let files = harness::decode(&short);
    assert_eq!(
        (files.meta.as_slice(), files.data, files.dict),
        (&b"abc"[..], None, None)
    );
    // Any bytes decode, clamped.
    let files = harness::decode(&[1, 0xff, 0xff, 0xff, 0xff, 9]);
    assert_eq!(files.meta.len(), 4096);
}

#[test]
#[ignore = "known crashes, not fixed yet (fuzz/regressions/**/known/)"]
fn known_crashes() {
    let root = fuzz_dir();
    let files = inputs(&root.join("regressions"), true);
    let failures = replay(&files);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn allocation_accounting_sees_allocations() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (v, used) = harness::measure(|| vec![1u8; 4 << 20]);
    assert_eq!(v.len(), 4 << 20);
    assert!(used >= 4 << 20, "measured {used} bytes");
}
