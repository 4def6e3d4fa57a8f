//! The process-wide worker pool shared by every gather, append and loader.
//!
//! One pool keeps the process from oversubscribing its cores when several
//! stores and loaders work at once. It is a dedicated rayon pool rather than
//! rayon's global one, so an application's own use of rayon is untouched.

use std::sync::OnceLock;

static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();

/// Environment variable that overrides the pool size.
pub const THREADS_ENV: &str = "LOADERX_NUM_THREADS";

/// The pool size used when [`THREADS_ENV`] is unset:
/// `max(physical cores, 3/4 of logical cores)`, at least 1.
///
/// Three quarters of the logical CPUs leaves room for the caller, packing and
/// transforms on SMT machines, while never using fewer threads than there are
/// physical cores.
pub fn default_threads() -> usize {
    let logical = num_cpus::get();
    let physical = num_cpus::get_physical();
    physical.max(logical * 3 / 4).max(1)
}

/// The number of threads the pool has (or will have once started).
pub fn threads() -> usize {
    pool().current_num_threads()
}

/// The shared pool, started on first use.
pub fn pool() -> &'static rayon::ThreadPool {
    POOL.get_or_init(|| {
        let n = std::env::var(THREADS_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(default_threads);
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("loaderx-{i}"))
            .build()
            .expect("failed to start the loaderx worker pool")
    })
}

/// Splits `n` items into contiguous tasks for the pool: about four tasks per
/// thread for load balance, but never tasks smaller than `min_len` items, so
/// small requests run as one task without waking the pool.
pub(crate) fn task_len(n: usize, min_len: usize) -> usize {
    let target = n.div_ceil(threads() * 4);
    target.max(min_len).max(1)
}
