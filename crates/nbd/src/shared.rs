//! The server's state shared by the accept loop and every connection: exports, limits,
//! counters, the buffer pool and the registry of open connections.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use cryptblk_device::BlockDevice;

use crate::pool::BufferPool;
use cryptblk_nbd_wire::{AnyStream, lock};

/// How long `serve_*` waits at shutdown for connections to finish their in-flight requests
/// before forcibly closing them (a client that stopped reading replies would otherwise block
/// shutdown forever).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

pub(crate) struct Export {
    pub(crate) name: String,
    pub(crate) description: Option<String>,
    pub(crate) device: Arc<dyn BlockDevice>,
    pub(crate) read_only: bool,
    pub(crate) can_discard: bool,
    pub(crate) block_size: u32,
}

impl Export {
    /// Advertised size: the device size now (a served volume can be resized), rounded
    /// down to the block size. A client learns it at its handshake.
    pub(crate) fn size(&self) -> u64 {
        let bs = u64::from(self.block_size);
        self.device.size() / bs * bs
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) connections_active: AtomicU64,
    pub(crate) connections_total: AtomicU64,
    pub(crate) connections_rejected: AtomicU64,
    pub(crate) reads: AtomicU64,
    pub(crate) read_bytes: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) write_bytes: AtomicU64,
    pub(crate) flushes: AtomicU64,
    pub(crate) trims: AtomicU64,
    pub(crate) trim_bytes: AtomicU64,
    pub(crate) write_zeroes: AtomicU64,
    pub(crate) write_zeroes_bytes: AtomicU64,
    pub(crate) fast_zero_refused: AtomicU64,
    pub(crate) block_status: AtomicU64,
    pub(crate) caches: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) protocol_errors: AtomicU64,
}

/// A snapshot of the server's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections open now (handshake or transmission; refused ones not counted).
    pub connections_active: u64,
    /// Connections accepted since the server was built (refused ones not counted).
    pub connections_total: u64,
    /// Connections refused because `max_connections` were open.
    pub connections_rejected: u64,
    /// Read requests that succeeded.
    pub reads: u64,
    /// Bytes read by successful read requests.
    pub read_bytes: u64,
    /// Write requests that succeeded.
    pub writes: u64,
    /// Bytes written by successful write requests.
    pub write_bytes: u64,
    /// Flush requests received (FUA on other requests not counted).
    pub flushes: u64,
    /// Trim (discard) requests that succeeded.
    pub trims: u64,
    /// Bytes of successful trims.
    pub trim_bytes: u64,
    /// Write-zeroes requests that succeeded.
    pub write_zeroes: u64,
    /// Bytes of successful write-zeroes requests.
    pub write_zeroes_bytes: u64,
    /// Fast write-zeroes requests refused with `ENOTSUP` (zeroing would not be faster than
    /// writing: the client writes instead); not counted in `errors`.
    pub fast_zero_refused: u64,
    /// Block-status requests answered.
    pub block_status: u64,
    /// Cache (prefetch) requests that succeeded.
    pub caches: u64,
    /// Requests answered with an error (invalid requests and backend failures).
    pub errors: u64,
    /// Connections dropped for protocol violations (bad magic, oversized option or payload,
    /// unknown client flags, handshake timeout...).
    pub protocol_errors: u64,
    /// Bytes of large-request buffers allocated now (in use or pooled for reuse).
    pub buffer_bytes: u64,
    /// Highest `buffer_bytes` so far; never above `max_buffer_bytes`.
    pub buffer_bytes_peak: u64,
    /// Requests that had to wait for the buffer pool.
    pub buffer_waits: u64,
}

pub(crate) enum WakeAddr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

pub(crate) struct Shared {
    pub(crate) exports: Vec<Export>,
    pub(crate) threads_per_connection: usize,
    pub(crate) handshake_timeout: Duration,
    pub(crate) stall_timeout: Duration,
    pub(crate) busy_poll: Duration,
    pub(crate) shutting_down: AtomicBool,
    pub(crate) counters: Counters,
    pub(crate) buffers: BufferPool,
    pub(crate) max_connections: usize,
    pub(crate) allow_remote: bool,
    /// TLS offered to clients (NBD_OPT_STARTTLS), when configured.
    pub(crate) tls: Option<cryptblk_nbd_wire::NbdTls>,
    /// Clients must switch to TLS before anything else.
    pub(crate) tls_required: bool,
    pub(crate) rejecting: AtomicUsize,
    pub(crate) next_id: AtomicU64,
    /// Open connections (a second handle on each socket, to shut it down from outside).
    pub(crate) conns: Mutex<HashMap<u64, AnyStream>>,
    pub(crate) conns_changed: Condvar,
    pub(crate) wake: Mutex<Option<WakeAddr>>,
}

impl Shared {
    pub(crate) fn stats(&self) -> Stats {
        let c = &self.counters;
        let (buffer_bytes, buffer_bytes_peak, buffer_waits) = self.buffers.usage();
        Stats {
            buffer_bytes,
            buffer_bytes_peak,
            buffer_waits,
            connections_active: c.connections_active.load(Relaxed),
            connections_total: c.connections_total.load(Relaxed),
            connections_rejected: c.connections_rejected.load(Relaxed),
            reads: c.reads.load(Relaxed),
            read_bytes: c.read_bytes.load(Relaxed),
            writes: c.writes.load(Relaxed),
            write_bytes: c.write_bytes.load(Relaxed),
            flushes: c.flushes.load(Relaxed),
            trims: c.trims.load(Relaxed),
            trim_bytes: c.trim_bytes.load(Relaxed),
            write_zeroes: c.write_zeroes.load(Relaxed),
            write_zeroes_bytes: c.write_zeroes_bytes.load(Relaxed),
            fast_zero_refused: c.fast_zero_refused.load(Relaxed),
            block_status: c.block_status.load(Relaxed),
            caches: c.caches.load(Relaxed),
            errors: c.errors.load(Relaxed),
            protocol_errors: c.protocol_errors.load(Relaxed),
        }
    }

    pub(crate) fn shutdown(&self) {
        self.shutting_down.store(true, Relaxed);
        // Wake the accept loop with a connection of our own; it sees the flag and stops.
        match &*lock(&self.wake) {
            Some(WakeAddr::Unix(p)) => drop(UnixStream::connect(p)),
            Some(WakeAddr::Tcp(a)) => drop(TcpStream::connect_timeout(a, Duration::from_secs(1))),
            None => {}
        }
    }

    /// Registers an accepted connection; `None` if the server is over its limit.
    /// The caller must turn the id into a [`ConnGuard`].
    pub(crate) fn register(&self, stream: &AnyStream, enforce_limit: bool) -> Option<u64> {
        let clone = stream.try_clone().ok()?;
        let mut conns = lock(&self.conns);
        if enforce_limit && conns.len() >= self.max_connections {
            return None;
        }
        let id = self.next_id.fetch_add(1, Relaxed);
        conns.insert(id, clone);
        self.counters
            .connections_active
            .store(conns.len() as u64, Relaxed);
        self.counters.connections_total.fetch_add(1, Relaxed);
        Some(id)
    }

    /// Stops all connections: first lets them finish what they have read, then (after the
    /// grace period) closes them outright; returns when none is left.
    pub(crate) fn drain(&self) {
        let mut conns = lock(&self.conns);
        for s in conns.values() {
            s.shutdown(Shutdown::Read);
        }
        let deadline = std::time::Instant::now() + SHUTDOWN_GRACE;
        while !conns.is_empty() {
            let now = std::time::Instant::now();
            if now >= deadline {
                for s in conns.values() {
                    s.shutdown(Shutdown::Both);
                }
                conns = self
                    .conns_changed
                    .wait(conns)
                    .unwrap_or_else(|e| e.into_inner());
                continue;
            }
            conns = self
                .conns_changed
                .wait_timeout(conns, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    pub(crate) fn flush_all(&self) -> io::Result<()> {
        let mut result = Ok(());
        for e in &self.exports {
            if !e.read_only
                && let Err(err) = e.device.flush()
            {
                result = Err(err);
            }
        }
        result
    }
}

/// Unregisters a connection when its thread ends (even by panic).
pub(crate) struct ConnGuard<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) id: u64,
}

impl Drop for ConnGuard<'_> {
    fn drop(&mut self) {
        let mut conns = lock(&self.shared.conns);
        conns.remove(&self.id);
        self.shared
            .counters
            .connections_active
            .store(conns.len() as u64, Relaxed);
        if conns.is_empty() {
            // Idle: give the pooled buffers back to the system.
            self.shared.buffers.trim();
        }
        self.shared.conns_changed.notify_all();
    }
}
