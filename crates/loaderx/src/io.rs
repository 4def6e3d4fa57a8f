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
