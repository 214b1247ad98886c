//! Counters a server keeps, read by `status`.

use std::sync::atomic::AtomicU64;

/// What a server has done so far; every field only grows except `connected`.
#[derive(Debug, Default)]
pub struct Stats {
    /// 1 while a frontend (a VM) is attached.
    pub connected: AtomicU64,
    /// Frontends attached so far (a reconnect counts again).
    pub connections_total: AtomicU64,
    /// Read requests served.
    pub reads: AtomicU64,
    /// Write requests served.
    pub writes: AtomicU64,
    /// Flush requests.
    pub flushes: AtomicU64,
    /// Discard segments served.
    pub discards: AtomicU64,
    /// Write-zeroes segments served.
    pub write_zeroes: AtomicU64,
    /// Bytes read by the guest.
    pub bytes_read: AtomicU64,
    /// Bytes written by the guest.
    pub bytes_written: AtomicU64,
    /// Requests answered with an error (or dropped for want of a status byte).
    pub errors: AtomicU64,
}
