//! Positional file I/O and advisory locks.
//!
//! Reads and writes name their absolute offset, so many threads can share one
//! file handle without a seek cursor. Locks are the operating system's
//! advisory whole-file locks (`flock` on Unix), the same kind loaderx 2.0.0
//! takes, so writers and readers of both implementations exclude each other.

use std::fs::{File, TryLockError};
use std::io;
use std::path::Path;

use crate::error::{Error, Result};

/// Writes all of `buf` at `offset`.
pub(crate) fn write_all_at(file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::write_all_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        let mut done = 0usize;
        while done < buf.len() {
            let n = std::os::windows::fs::FileExt::seek_write(
                file,
                &buf[done..],
                offset + done as u64,
            )?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "short positional write",
                ));
            }
            done += n;
        }
        Ok(())
    }
}

/// Fills `buf` from `offset`; a file that ends first is an `UnexpectedEof` error.
pub(crate) fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        let mut done = 0usize;
        while done < buf.len() {
            let n = std::os::windows::fs::FileExt::seek_read(
                file,
                &mut buf[done..],
                offset + done as u64,
            )?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            done += n;
        }
        Ok(())
    }
}

/// Which side of the store lifetime lock a handle holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockMode {
    /// A writer: alone.
    Exclusive,
    /// A reader: shared with other readers.
    Shared,
}

/// Takes the lifetime lock on `meta.zr` without waiting: a conflicting
/// holder is reported at once as [`Error::Busy`].
pub(crate) fn try_lock(file: &File, mode: LockMode, path: &Path) -> Result<()> {
    let result = match mode {
        LockMode::Exclusive => file.try_lock(),
        LockMode::Shared => file.try_lock_shared(),
    };
    match result {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => Err(Error::Busy(match mode {
            LockMode::Exclusive => format!(
                "{} is open elsewhere (readers or another writer hold its lock)",
                path.display()
            ),
            LockMode::Shared => format!(
                "{} is being written (a writer holds its lock)",
                path.display()
            ),
        })),
        Err(TryLockError::Error(e)) => Err(Error::io(format!("locking {}", path.display()), e)),
    }
}

/// Flushes a directory entry list to stable storage (Unix; a no-op elsewhere).
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(format!("syncing directory {}", dir.display()), e))
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// Makes sure the process may hold `more` extra open files, raising the
/// soft limit toward the hard one when it would not: a store set keeps two
/// files open per shard, and a thousand-shard set passes the common default
/// of 1024. (Go's runtime raises the soft limit the same way at start.)
pub(crate) fn ensure_file_room(more: usize) -> Result<()> {
    #[cfg(unix)]
    {
        // Files already open are unknown; keep a margin for them.
        let want = (more as libc::rlim_t).saturating_add(256);
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we own.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            return Ok(());
        }
        if lim.rlim_cur == libc::RLIM_INFINITY || lim.rlim_cur >= want {
            return Ok(());
        }
        let target = if lim.rlim_max == libc::RLIM_INFINITY {
            want
        } else {
            want.min(lim.rlim_max)
        };
        if target <= lim.rlim_cur {
            return Err(Error::InvalidArgument(format!(
                "opening {more} files would pass this process's open-file limit ({}); \
                 raise it (ulimit -n) or use fewer, larger shards",
                lim.rlim_max
            )));
        }
        let raised = libc::rlimit {
            rlim_cur: target,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we own; raising the soft limit
        // up to the hard one needs no privilege.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) };
    }
    #[cfg(not(unix))]
    {
        let _ = more;
    }
    Ok(())
}

#[cfg(unix)]
mod bus_guard {
    use std::ffi::{c_int, c_void};

    extern "C" {
        // src/guard.c, compiled by build.rs.
        pub fn loaderx_install_bus_guard() -> c_int;
        pub fn loaderx_guarded_copy(dst: *mut c_void, src: *const c_void, n: usize) -> c_int;
    }

    pub static INSTALLED: std::sync::Once = std::sync::Once::new();
}

/// Copies `src`, bytes of a memory-mapped file, into `dst` (same length). A
/// fault while reading the map — the file cut short by another process, or
/// an I/O error on its device — is an `UnexpectedEof` error rather than a
/// `SIGBUS` that ends the process.
pub(crate) fn copy_from_map(dst: &mut [u8], src: &[u8]) -> io::Result<()> {
    debug_assert_eq!(dst.len(), src.len());
    #[cfg(unix)]
    {
        bus_guard::INSTALLED.call_once(|| {
            // SAFETY: installs a process-wide SIGBUS handler that only jumps
            // for faults inside loaderx_guarded_copy and passes every other
            // SIGBUS on to the handler found before it (or the default).
            unsafe { bus_guard::loaderx_install_bus_guard() };
        });
        // SAFETY: `dst` and `src` are valid for `src.len()` bytes and do not
        // overlap (one is caller memory, the other a read-only map); a
        // fault while reading `src` returns -1 from the copy instead of
        // unwinding any Rust frame (only memcpy's C frame is left).
        let rc = unsafe {
            bus_guard::loaderx_guarded_copy(
                dst.as_mut_ptr().cast(),
                src.as_ptr().cast(),
                src.len().min(dst.len()),
            )
        };
        if rc != 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the mapped file faulted (SIGBUS): it was cut short or could not be read",
            ));
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        dst.copy_from_slice(src);
        Ok(())
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn a_copy_from_a_map_cut_short_is_an_error_not_a_signal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 64 << 10]).unwrap();
        let file = File::open(&path).unwrap();
        // SAFETY: a private test file; the test cuts it short on purpose.
        let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
        let mut out = vec![0u8; 4096];
        copy_from_map(&mut out, &map[8192..12288]).unwrap();
        assert_eq!(out, vec![7u8; 4096]);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(4096)
            .unwrap();
        // The pages past the new end are gone: touching them raises SIGBUS,
        // which the guard turns into an error (twice: it re-arms).
        for _ in 0..2 {
            let err = copy_from_map(&mut out, &map[8192..12288]).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        }
        copy_from_map(&mut out, &map[..4096]).unwrap();
        // Other threads are guarded independently.
        let map = std::sync::Arc::new(map);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let map = map.clone();
                std::thread::spawn(move || {
                    let mut out = vec![0u8; 4096];
                    copy_from_map(&mut out, &map[16384..20480]).is_err()
                })
            })
            .collect();
        assert!(threads.into_iter().all(|t| t.join().unwrap()));
    }
}
