//! The one-broker-per-provider lock (B-520 to B-522).
//!
//! A lock is a file of its own, held with an OS lock (`flock`) for the provider's
//! lifetime, so the database itself stays readable by `sqlite3` while the broker runs,
//! and a killed broker leaves nothing to clean up: the kernel releases the lock.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use super::error::StorageError;

/// A held provider lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct ProviderLock {
    _file: File,
    path: PathBuf,
}

impl ProviderLock {
    /// Takes the lock at `path` for `provider`.
    ///
    /// # Errors
    /// [`StorageError::Locked`] naming the provider and the lock when another process
    /// holds it; [`StorageError::Io`] when the file cannot be created.
    pub fn acquire(provider: &str, path: &Path) -> Result<ProviderLock, StorageError> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| {
                StorageError::io(provider, &format!("create lock {}", path.display()), e)
            })?;
        match file.try_lock() {
            Ok(()) => Ok(ProviderLock {
                _file: file,
                path: path.to_owned(),
            }),
            Err(TryLockError::WouldBlock) => Err(StorageError::Locked {
                provider: provider.to_owned(),
                lock: path.to_owned(),
            }),
            Err(TryLockError::Error(e)) => Err(StorageError::io(
                provider,
                &format!("lock {}", path.display()),
                e,
            )),
        }
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `<file_path>.lock` for a sqlite database.
pub fn sqlite_lock_path(file_path: &Path) -> PathBuf {
    let mut s = file_path.as_os_str().to_owned();
    s.push(".lock");
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_lock_is_the_file_path_with_lock_appended() {
        assert_eq!(
            sqlite_lock_path(Path::new("/var/lib/saguin/s.db")),
            PathBuf::from("/var/lib/saguin/s.db.lock")
        );
    }
}
