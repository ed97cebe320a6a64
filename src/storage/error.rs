//! The storage layer's one error type.

use std::fmt;
use std::path::PathBuf;

/// Everything a provider can refuse or fail at. Each variant names the provider or the
/// channel and says what an operator can do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageError {
    /// A publish would take the channel past its own `max_bytes` (0x97, C-021).
    ChannelFull {
        /// The channel.
        channel: String,
        /// Its `max_bytes`.
        max_bytes: u64,
        /// Bytes it holds now.
        used: u64,
        /// The refused record's size.
        size: u64,
    },
    /// A publish would eat into the provider's reserve or past its `max_bytes` (0x97).
    ProviderFull {
        /// The provider.
        provider: String,
        /// Its `max_bytes`.
        max_bytes: u64,
        /// The reserve publishes may not use.
        reserve: u64,
    },
    /// Another process holds the provider's lock file (B-520).
    Locked {
        /// The provider.
        provider: String,
        /// The lock file.
        lock: PathBuf,
    },
    /// The channel was never opened on this provider.
    UnknownChannel {
        /// The provider.
        provider: String,
        /// The channel asked for.
        channel: String,
    },
    /// No record at that offset (already resolved, removed, or never written).
    NoSuchRecord {
        /// The channel.
        channel: String,
        /// The offset asked for.
        offset: u64,
    },
    /// The operation does not apply to this kind of channel (a job operation on an
    /// append channel, say): a defect in the caller.
    WrongChannelKind {
        /// The channel.
        channel: String,
        /// What was attempted.
        operation: &'static str,
    },
    /// The database or a file failed (0x83 on a publish). The broker keeps running.
    Io {
        /// The provider.
        provider: String,
        /// What was being done.
        operation: String,
        /// The underlying error, as text.
        detail: String,
    },
    /// A snapshot file is not one this broker wrote, or is damaged.
    Snapshot {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The provider has shut down (its writer thread ended).
    Closed {
        /// The provider.
        provider: String,
    },
}

impl StorageError {
    /// The MQTT reason code a publish refused with this error is answered with:
    /// 0x97 (Quota exceeded) at a size bound, 0x83 (Implementation specific error)
    /// for everything else.
    pub fn reason_code(&self) -> u8 {
        match self {
            StorageError::ChannelFull { .. } | StorageError::ProviderFull { .. } => 0x97,
            _ => 0x83,
        }
    }

    /// Whether this is a size-bound refusal rather than a failure.
    pub fn is_full(&self) -> bool {
        self.reason_code() == 0x97
    }

    pub(crate) fn io(provider: &str, operation: &str, e: impl fmt::Display) -> StorageError {
        StorageError::Io {
            provider: provider.to_owned(),
            operation: operation.to_owned(),
            detail: e.to_string(),
        }
    }

    /// A channel's own `max_bytes` (C-021, A-178): a record of `size` bytes on the
    /// `used` it holds, less what the write `frees` (a latest value it replaces),
    /// must stay within it. The one rule both providers' appends and the QoS 2
    /// PUBREC check apply.
    ///
    /// # Errors
    /// [`StorageError::ChannelFull`] when it would not.
    pub fn check_channel_room(
        channel: &str,
        max_bytes: Option<u64>,
        used: u64,
        size: u64,
        frees: u64,
    ) -> Result<(), StorageError> {
        match max_bytes {
            Some(max) if (used + size).saturating_sub(frees) > max => {
                Err(StorageError::ChannelFull {
                    channel: channel.to_owned(),
                    max_bytes: max,
                    used,
                    size,
                })
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageError::ChannelFull {
                channel,
                max_bytes,
                used,
                size,
            } => write!(
                f,
                "channel {channel} is at its max_bytes ({used} of {max_bytes} bytes held, a record of {size} refused); consumers resolving or a larger max_bytes makes room"
            ),
            StorageError::ProviderFull {
                provider,
                max_bytes,
                reserve,
            } => write!(
                f,
                "storage provider {provider} is full (max_bytes {max_bytes}, of which {reserve} is held back for acknowledgements and dead-lettering); raise its max_bytes or lower its channels' retention"
            ),
            StorageError::Locked { provider, lock } => write!(
                f,
                "storage provider {provider} is in use by another broker: {} is locked; stop that broker, or give this configuration another file_path / snapshot_dir",
                lock.display()
            ),
            StorageError::UnknownChannel { provider, channel } => {
                write!(
                    f,
                    "channel {channel} is not open on storage provider {provider}; every configured channel (and each queue's __dlq) is opened at startup"
                )
            }
            StorageError::NoSuchRecord { channel, offset } => {
                write!(f, "channel {channel} holds no record at offset {offset}")
            }
            StorageError::WrongChannelKind { channel, operation } => {
                write!(f, "{operation} does not apply to channel {channel}")
            }
            StorageError::Io {
                provider,
                operation,
                detail,
            } => write!(
                f,
                "storage provider {provider} failed to {operation}: {detail}; check the disk (space, permissions) - the broker keeps running"
            ),
            StorageError::Snapshot { path, reason } => write!(
                f,
                "snapshot {} cannot be loaded: {reason}; move it aside to start without it",
                path.display()
            ),
            StorageError::Closed { provider } => {
                write!(
                    f,
                    "storage provider {provider} has shut down; nothing more is stored until the broker restarts"
                )
            }
        }
    }
}

impl std::error::Error for StorageError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// C-021 / A-178: a size bound answers 0x97, a failing write 0x83.
    #[test]
    fn full_is_quota_exceeded_and_failure_is_implementation_error() {
        let full = StorageError::ProviderFull {
            provider: "p".into(),
            max_bytes: 1,
            reserve: 1,
        };
        assert_eq!(full.reason_code(), 0x97);
        assert_eq!(
            StorageError::io("p", "commit", "disk I/O error").reason_code(),
            0x83
        );
    }
}
