//! A vhost-user-blk frontend: serves any [`cryptblk_device::BlockDevice`] to a virtual
//! machine (QEMU, Cloud Hypervisor, crosvm) as a virtio-blk disk over a vhost-user socket.
//! The protocol is rust-vmm's (`vhost`, `vhost-user-backend`, `virtio-queue`,
//! `vm-memory`); this crate is the virtio-blk device behind it.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::os::unix::net::UnixListener;
//! use cryptblk_device::MemoryDevice;
//! use cryptblk_vhost_user_blk::VhostUserBlkServer;
//!
//! let listener = UnixListener::bind("/run/user/1000/disk.sock")?;
//! let server = VhostUserBlkServer::builder(Arc::new(MemoryDevice::new(64 << 20, 4096)))
//!     .queues(2)
//!     .id("volume-uuid")
//!     .build(listener)?;
//! let handle = server.shutdown_handle();
//! // elsewhere: handle.shutdown();
//! server.run()?; // serves one VM at a time until shut down, then flushes
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # Design
//!
//! The guest's virtqueues and buffers live in memory it shares with this process. Each
//! queue has its own thread (rust-vmm's epoll worker), which serves that queue's requests
//! itself, in order: a read is read and decrypted straight into the guest's buffer where
//! the buffer is one contiguous run of guest memory (else into the queue's bounce buffer,
//! in one call, then copied out); a write is copied out of the guest's buffer (which must
//! not change) into the bounce buffer and encrypted there in place. Features: multiqueue,
//! event index, indirect descriptors, a write-back cache with flush, discard (when the
//! device allows it) and write-zeroes, `GET_ID`, read-only, `blk_size` = the device's
//! block size, `seg_max`/`size_max`.
//!
//! # Reconnect
//!
//! The server outlives its frontend: when a VM disconnects (or QEMU's `reconnect=` chardev
//! re-attaches after this process was replaced), the next connection on the same socket
//! gets a fresh device state. Requests complete in the order they became available, so
//! after a crash the used index in guest memory says exactly which are done; QEMU rewinds
//! to it and sends the rest again. (`VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD` is not offered:
//! `vhost-user-backend` does not implement it, and in-order completion makes it
//! unnecessary for a device with one thread per queue.)

#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod backend;
#[allow(unsafe_code)]
pub mod client;
#[allow(unsafe_code)]
mod request;
mod stats;

pub use stats::Stats;

use backend::{BlkBackend, Memory, Settings};
use cryptblk_device::BlockDevice;
use request::{ID_BYTES, Limits};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

/// Largest number of sectors one discard or write-zeroes segment may cover (1 GiB).
pub(crate) const MAX_DWZ_SECTORS: u32 = 1 << 21;
/// Largest number of segments in one discard or write-zeroes request.
pub(crate) const MAX_DWZ_SEGMENTS: u32 = 64;

/// Default virtqueue size (descriptors per queue).
pub const DEFAULT_QUEUE_SIZE: u16 = 256;
/// Default largest segment (`size_max`). With [`DEFAULT_SEG_MAX`], a request can carry
/// 31.5 MiB: SeaBIOS divides `size_max * seg_max` by the block size into a 16-bit count
/// of blocks per request, and a product of 32 MiB or more (at 512-byte blocks) wraps to 0,
/// after which its boot probe sends empty reads forever.
pub const DEFAULT_SIZE_MAX: u32 = 256 << 10;
/// Default most segments per request (`seg_max`): QEMU's own virtio-blk's figure for its
/// default queue size (128 - 2).
pub const DEFAULT_SEG_MAX: u32 = 126;

/// Settings for a [`VhostUserBlkServer`].
pub struct Builder {
    dev: Arc<dyn BlockDevice>,
    queues: u16,
    queue_size: u16,
    size_max: u32,
    seg_max: u32,
    read_only: bool,
    id: String,
    busy_poll: Duration,
}

impl Builder {
    /// How long a queue thread watches its ring for the next request after serving one,
    /// before it sleeps until kicked (default 50 µs; zero: never). At low queue depth the
    /// next request often comes within it, saving a wake-up each way.
    pub fn busy_poll(mut self, d: Duration) -> Self {
        self.busy_poll = d;
        self
    }
    /// Virtqueues, each served by its own thread (default 1, at most 64).
    pub fn queues(mut self, n: u16) -> Self {
        self.queues = n;
        self
    }
    /// Descriptors per virtqueue, a power of two (default 256, at most 32768).
    pub fn queue_size(mut self, n: u16) -> Self {
        self.queue_size = n;
        self
    }
    /// Largest segment the guest may send (default 256 KiB).
    pub fn size_max(mut self, n: u32) -> Self {
        self.size_max = n;
        self
    }
    /// Most data segments per request (default 126).
    pub fn seg_max(mut self, n: u32) -> Self {
        self.seg_max = n;
        self
    }
    /// Serve the device read-only even if it is writable.
    pub fn read_only(mut self, ro: bool) -> Self {
        self.read_only = ro;
        self
    }
    /// What `VIRTIO_BLK_T_GET_ID` answers (the guest's `/sys/block/vdX/serial`): at most
    /// 20 bytes are sent, cut at a character boundary.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// Checks the settings and takes the listening socket (bound by the caller, who chose
    /// its permissions). Nothing is accepted until [`VhostUserBlkServer::run`].
    pub fn build(self, listener: UnixListener) -> io::Result<VhostUserBlkServer> {
        let bad = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
        if self.queues == 0 || self.queues > 64 {
            return Err(bad(format!("{} queues: give 1 to 64", self.queues)));
        }
        if !self.queue_size.is_power_of_two() || self.queue_size > 32768 {
            return Err(bad(format!(
                "queue size {}: give a power of two up to 32768",
                self.queue_size
            )));
        }
        let bs = self.dev.block_size();
        if self.size_max < bs || self.seg_max == 0 {
            return Err(bad(format!(
                "size_max {} / seg_max {}: a segment must hold a block ({bs} bytes)",
                self.size_max, self.seg_max
            )));
        }
        let mut id = [0u8; ID_BYTES];
        let mut n = self.id.len().min(ID_BYTES);
        while !self.id.is_char_boundary(n) {
            n -= 1;
        }
        id[..n].copy_from_slice(&self.id.as_bytes()[..n]);
        let stats = Arc::new(Stats::default());
        let read_only = self.read_only || self.dev.read_only();
        let max_bytes = (u64::from(self.size_max) * u64::from(self.seg_max)).min(64 << 20) as usize;
        let settings = Settings {
            queues: usize::from(self.queues),
            queue_size: usize::from(self.queue_size),
            seg_max: self.seg_max,
            size_max: self.size_max,
            read_only,
            busy_poll: self.busy_poll,
        };
        let limits = Limits {
            max_bytes,
            id,
            read_only,
        };
        let backend = Arc::new(BlkBackend::new(self.dev, settings, limits, stats.clone()));
        let wake = listener.try_clone()?;
        listener.set_nonblocking(false)?;
        Ok(VhostUserBlkServer {
            backend,
            listener: Listener::from(listener),
            shared: Arc::new(Shared {
                stop: AtomicBool::new(false),
                listener: wake,
                current: Mutex::new(None),
                stats,
            }),
        })
    }
}

/// State the server shares with its [`ShutdownHandle`]s.
struct Shared {
    stop: AtomicBool,
    /// A duplicate of the listening socket, for waking a blocked `accept`.
    listener: UnixListener,
    /// The attached frontend's connection, to cut it on shutdown.
    current: Mutex<Option<vhost_user_backend::ShutdownHandle>>,
    stats: Arc<Stats>,
}

/// Stops a running [`VhostUserBlkServer`] from another thread.
#[derive(Clone)]
pub struct ShutdownHandle(Arc<Shared>);

impl ShutdownHandle {
    /// Detaches the frontend (the request being served finishes first) and ends
    /// [`VhostUserBlkServer::run`], which then flushes the device.
    pub fn shutdown(&self) {
        let s = &self.0;
        s.stop.store(true, Ordering::SeqCst);
        if let Some(c) = s.current.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            c.shutdown();
        }
        // SAFETY: shutdown(2) on a socket this struct owns (a dup of the listener, open as
        // long as `s` is); it wakes an `accept` blocked on the same socket with EINVAL.
        #[allow(unsafe_code)]
        unsafe {
            libc::shutdown(s.listener.as_raw_fd(), libc::SHUT_RDWR);
        }
    }
    /// The server's counters.
    pub fn stats(&self) -> &Stats {
        &self.0.stats
    }
}

/// A vhost-user-blk device on a listening socket.
pub struct VhostUserBlkServer {
    backend: Arc<BlkBackend>,
    listener: Listener,
    shared: Arc<Shared>,
}

impl VhostUserBlkServer {
    /// Starts the settings for serving `dev`.
    pub fn builder(dev: Arc<dyn BlockDevice>) -> Builder {
        Builder {
            dev,
            queues: 1,
            queue_size: DEFAULT_QUEUE_SIZE,
            size_max: DEFAULT_SIZE_MAX,
            seg_max: DEFAULT_SEG_MAX,
            read_only: false,
            id: String::new(),
            busy_poll: Duration::from_micros(50),
        }
    }

    /// A handle that stops [`run`](Self::run) from another thread.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.shared.clone())
    }

    /// The server's counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.shared.stats.clone()
    }

    /// The virtio-blk configuration space as the guest reads it (`struct virtio_blk_config`).
    pub fn config_space(&self) -> Vec<u8> {
        self.backend.config_space().to_vec()
    }

    /// Serves frontends one after another (a VM, then the same VM reconnecting) until
    /// shut down; then flushes the device. A frontend's protocol error ends its
    /// connection, not the server.
    pub fn run(mut self) -> io::Result<()> {
        let stats = self.shared.stats.clone();
        while !self.shared.stop.load(Ordering::SeqCst) {
            let mem: Memory = GuestMemoryAtomic::new(GuestMemoryMmap::new());
            let mut daemon =
                VhostUserDaemon::new("vhost-user-blk".into(), self.backend.clone(), mem)
                    .map_err(|e| io::Error::other(format!("vhost-user daemon: {e:?}")))?;
            if let Err(e) = daemon.start(&mut self.listener) {
                if self.shared.stop.load(Ordering::SeqCst) {
                    break;
                }
                return Err(io::Error::other(format!("vhost-user accept: {e:?}")));
            }
            {
                let mut cur = self
                    .shared
                    .current
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                *cur = daemon.shutdown_handle();
                if self.shared.stop.load(Ordering::SeqCst)
                    && let Some(c) = cur.as_ref()
                {
                    c.shutdown();
                }
            }
            stats.connected.store(1, Ordering::Relaxed);
            stats.connections_total.fetch_add(1, Ordering::Relaxed);
            let ended = daemon.wait();
            *self
                .shared
                .current
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = None;
            stats.connected.store(0, Ordering::Relaxed);
            for h in daemon.get_epoll_handlers() {
                h.send_exit_event();
            }
            // Dropping the daemon joins its queue threads: no request is in progress after.
            drop(daemon);
            if let Err(e) = ended
                && !self.shared.stop.load(Ordering::SeqCst)
            {
                eprintln!("vhost-user-blk: frontend connection ended: {e:?}");
            }
            self.backend.dev.flush()?;
        }
        self.backend.dev.flush()
    }
}
