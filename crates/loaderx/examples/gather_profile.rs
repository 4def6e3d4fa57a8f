//! Where a gather's time goes: the same random batches decoded one record at
//! a time on one thread (the codec's own cost), then as whole batches on the
//! worker pool. The ratio says how close the pool gets to the cores' limit.
//!
//! ```text
//! cargo run --release -p loaderx --example gather_profile -- STORE [dense|ragged]
//! ```

use std::time::Instant;

use loaderx::store::{DataAccess, StoreReader};
use loaderx::Kind;

fn main() -> Result<(), loaderx::Error> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: gather_profile STORE [dense|ragged]");
    let kind = match args.next().as_deref() {
        Some("ragged") => Kind::Ragged,
        _ => Kind::Dense,
    };
    let reader = StoreReader::open_with(&path, kind, DataAccess::from_env())?;
    let n = reader.len();
    // 40 batches of 256 indices from a fixed LCG, so runs are comparable.
    let mut state = 12345u64;
    let plans: Vec<Vec<u64>> = (0..40)
        .map(|_| {
            (0..256)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (state >> 33) % n
                })
                .collect()
        })
        .collect();
    let mut logical = 0u64;
    for plan in &plans {
        for &i in plan {
            logical += reader.loc(i)?.logic_length as u64;
        }
    }
    let mib = logical as f64 / 1048576.0;

    let start = Instant::now();
    for plan in &plans {
        for &i in plan {
            reader.gather_var(&[i])?;
        }
    }
    let single = start.elapsed().as_secs_f64();

    // Warm the batch-buffer cache as the Python layer keeps it warm.
    for plan in plans.iter().take(2) {
        loaderx::buffers::recycle(reader.gather_var(plan)?.0);
    }
    let start = Instant::now();
    for plan in &plans {
        loaderx::buffers::recycle(reader.gather_var(plan)?.0);
    }
    let pooled = start.elapsed().as_secs_f64();

    println!(
        "{path} ({}, {:?}): one thread, one record at a time {:.0} MiB/s; \
         pool of {} threads, whole batches {:.0} MiB/s = {:.2}x one thread",
        reader.codec().name(),
        reader.data_access(),
        mib / single,
        loaderx::pool::threads(),
        mib / pooled,
        single / pooled
    );
    Ok(())
}
