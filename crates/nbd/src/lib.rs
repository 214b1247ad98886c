//! An NBD server (fixed newstyle handshake, simple and structured replies, TLS) over any
//! [`cryptblk_device::BlockDevice`]: a frontend. The wire format and the TLS layer are
//! `cryptblk-nbd-wire`'s, shared with the client (`cryptblk-storage`'s `NbdStorage`).
//!
//! ```no_run
//! use std::sync::Arc;
//! use cryptblk_device::MemoryDevice;
//! use cryptblk_nbd::NbdServer;
//!
//! let server = NbdServer::builder()
//!     .export("disk", Arc::new(MemoryDevice::new(64 << 20, 512)))
//!     .description("a RAM disk")
//!     .threads_per_connection(4)
//!     .build()?;
//! let handle = server.shutdown_handle();
//! // elsewhere: handle.shutdown();
//! server.serve_unix("/tmp/disk.sock")?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # Threading
//!
//! One thread per connection does the handshake; in transmission it becomes one of
//! `threads_per_connection` threads that share the connection leader/follower style: a thread
//! holds the socket's read lock only while it reads one request (header and write payload),
//! then serves it by calling the device itself and sends the reply under the write lock
//! (header and data in one `write`). Requests are thus served on the thread that read them,
//! several are in flight per connection, and replies go out in completion order.
//!
//! # Memory
//!
//! Each thread keeps a small data buffer of its own (up to 128 KiB of data) for small
//! requests. Larger requests (up to the protocol's 32 MiB) take a buffer from a server-wide
//! pool capped at `max_buffer_bytes` (default 256 MiB): when the pool is exhausted, the
//! request waits until another one returns its buffer. Buffers are held only while a request
//! is being read, served and answered, never by an idle thread; a client that stalls while
//! holding one (payload not coming, replies not read) is dropped after `stall_timeout`, so
//! the wait always ends. Worst case for the whole server:
//!
//! `max_connections × (threads_per_connection + 1) × 128 KiB + max_buffer_bytes`
//!
//! (the `+ 1` is the connection's receive buffer), i.e. 276 MiB with the defaults, plus
//! thread stacks and up to 16 connections being refused (128 KiB each). The pool is emptied
//! whenever the last connection closes.
//!
//! Writing to a socket whose peer is gone raises `SIGPIPE`; Rust programs ignore it by
//! default, other hosts must ignore it too.

#![forbid(unsafe_code)]

mod conn;
mod pool;
mod shared;

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use cryptblk_device::BlockDevice;
use cryptblk_nbd_wire::{AnyStream, TlsStream, lock};
pub use cryptblk_nbd_wire::{NbdTls, TlsMode, proto};
use pool::BufferPool;
pub use shared::Stats;
use shared::{ConnGuard, Counters, Export, Shared, WakeAddr};

/// Default number of threads serving one connection.
pub const DEFAULT_THREADS_PER_CONNECTION: usize = 4;
/// Default time a connection's reading thread polls for the next request before sleeping.
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(50);
/// Default cap on simultaneous connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 32;
pub use cryptblk_nbd_wire::proto::MAX_STRING_LEN;
/// Refused connections answered at once (each gets a short-lived thread); beyond, dropped.
const MAX_REJECTING: usize = 16;
/// Default cap on the bytes of all large-request buffers of the server together.
pub const DEFAULT_MAX_BUFFER_BYTES: usize = 256 << 20;
/// Smallest accepted `max_buffer_bytes`: one maximum-size request must fit.
pub const MIN_MAX_BUFFER_BYTES: usize = proto::MAX_PAYLOAD as usize + conn::HEADROOM;

struct ExportConfig {
    name: String,
    description: Option<String>,
    device: Arc<dyn BlockDevice>,
    read_only: bool,
}

/// Builds an [`NbdServer`]; see [`NbdServer::builder`].
pub struct NbdServerBuilder {
    exports: Vec<ExportConfig>,
    threads_per_connection: usize,
    max_connections: usize,
    allow_remote: bool,
    handshake_timeout: Duration,
    stall_timeout: Duration,
    busy_poll: Duration,
    max_buffer_bytes: usize,
    tls: Option<(NbdTls, TlsMode)>,
    misuse: Option<&'static str>,
}

impl NbdServerBuilder {
    /// Adds an export. The first export is also the default one (empty name).
    pub fn export(mut self, name: impl Into<String>, device: Arc<dyn BlockDevice>) -> Self {
        self.exports.push(ExportConfig {
            name: name.into(),
            description: None,
            device,
            read_only: false,
        });
        self
    }

    /// Sets the description of the export added last.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        match self.exports.last_mut() {
            Some(e) => e.description = Some(description.into()),
            None => self.misuse = Some("description() called before export()"),
        }
        self
    }

    /// Serves the export added last read-only (it is anyway if the device is).
    pub fn read_only(mut self, read_only: bool) -> Self {
        match self.exports.last_mut() {
            Some(e) => e.read_only = read_only,
            None => self.misuse = Some("read_only() called before export()"),
        }
        self
    }

    /// Threads serving each connection (requests in flight per connection); 1 to 64, default 4.
    pub fn threads_per_connection(mut self, k: usize) -> Self {
        self.threads_per_connection = k;
        self
    }

    /// Connections served at once; more are refused politely. Default 32.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n;
        self
    }

    /// Allows `serve_tcp` on non-loopback addresses to clients nobody identifies: without
    /// it, only TLS required with client certificates ([`NbdTls::verifies_clients`]) may
    /// listen there. With it and no TLS, anyone who can connect reads and writes the
    /// plaintext (with TLS but no client certificates: the same, encrypted on the wire).
    pub fn allow_remote(mut self, allow: bool) -> Self {
        self.allow_remote = allow;
        self
    }

    /// TLS with this identity (`NBD_OPT_STARTTLS`): `Required` makes every client switch
    /// to it before anything else, and lets `serve_tcp` listen on any address; `Optional`
    /// also serves plaintext clients; `Off` is the same as no TLS.
    pub fn tls(mut self, tls: NbdTls, mode: TlsMode) -> Self {
        self.tls = Some((tls, mode));
        self
    }

    /// Longest time a client may take for the whole handshake (from accept to choosing an
    /// export) before the connection is dropped, however it dribbles its bytes. Default 10 s.
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Longest a client may stall while it holds pool memory or a reply: the payload of a
    /// write over 128 KiB must arrive in full, and each reply must be taken by the socket,
    /// within this time, or the connection is dropped (a stalled client would otherwise pin
    /// its buffers forever and starve the others). Default 60 s.
    pub fn stall_timeout(mut self, timeout: Duration) -> Self {
        self.stall_timeout = timeout;
        self
    }

    /// How long the thread waiting for a connection's next request polls the socket
    /// before it sleeps in `read`. A request that arrives within this time is picked up
    /// without a wake-up (a futex, often an inter-processor interrupt, and on virtual
    /// machines an exit), which is most of a queue-depth-1 round trip. The poller yields
    /// its CPU between tries, so it costs only time no other thread wanted, at most this
    /// much after each request. Default [`DEFAULT_BUSY_POLL`]; zero turns
    /// polling off.
    pub fn busy_poll(mut self, poll: Duration) -> Self {
        self.busy_poll = poll;
        self
    }

    /// Cap on the memory of all large-request buffers together (see the crate docs,
    /// "Memory"); at least [`MIN_MAX_BUFFER_BYTES`]. Default 256 MiB.
    pub fn max_buffer_bytes(mut self, bytes: usize) -> Self {
        self.max_buffer_bytes = bytes;
        self
    }

    /// Checks the configuration and makes the server; `InvalidInput` says what is wrong
    /// (no export, a duplicate export name, zero threads or connections, a buffer cap
    /// below [`MIN_MAX_BUFFER_BYTES`]...).
    pub fn build(self) -> io::Result<NbdServer> {
        let invalid = |msg: String| Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        if let Some(m) = self.misuse {
            return invalid(m.into());
        }
        if self.exports.is_empty() {
            return invalid("an NBD server needs at least one export".into());
        }
        if !(1..=64).contains(&self.threads_per_connection) {
            return invalid(format!(
                "threads_per_connection must be 1..=64, not {}",
                self.threads_per_connection
            ));
        }
        if self.max_connections == 0 {
            return invalid("max_connections must be at least 1".into());
        }
        if self.handshake_timeout.is_zero() || self.stall_timeout.is_zero() {
            return invalid("handshake_timeout and stall_timeout must not be zero".into());
        }
        if self.max_buffer_bytes < MIN_MAX_BUFFER_BYTES {
            return invalid(format!(
                "max_buffer_bytes must be at least {MIN_MAX_BUFFER_BYTES} (one 32 MiB request)"
            ));
        }
        let mut exports = Vec::new();
        for e in self.exports {
            if e.name.len() > MAX_STRING_LEN
                || e.description
                    .as_ref()
                    .is_some_and(|d| d.len() > MAX_STRING_LEN)
            {
                return invalid(format!(
                    "export name or description longer than {MAX_STRING_LEN} bytes"
                ));
            }
            if exports.iter().any(|x: &Export| x.name == e.name) {
                return invalid(format!("duplicate export name {:?}", e.name));
            }
            let bs = e.device.block_size();
            if !bs.is_power_of_two() || bs > 65536 {
                return invalid(format!(
                    "export {:?}: block size {bs} is not a power of two up to 64 KiB",
                    e.name
                ));
            }
            exports.push(Export {
                name: e.name,
                description: e.description,
                read_only: e.read_only || e.device.read_only(),
                can_discard: e.device.can_discard(),
                device: e.device,
                block_size: bs,
            });
        }
        let (tls, tls_required) = match self.tls {
            Some((t, TlsMode::Optional)) => (Some(t), false),
            Some((t, TlsMode::Required)) => (Some(t), true),
            Some((_, TlsMode::Off)) | None => (None, false),
        };
        Ok(NbdServer {
            shared: Arc::new(Shared {
                exports,
                threads_per_connection: self.threads_per_connection,
                handshake_timeout: self.handshake_timeout,
                stall_timeout: self.stall_timeout,
                busy_poll: self.busy_poll,
                shutting_down: AtomicBool::new(false),
                counters: Counters::default(),
                buffers: BufferPool::new(self.max_buffer_bytes),
                max_connections: self.max_connections,
                allow_remote: self.allow_remote,
                tls,
                tls_required,
                rejecting: AtomicUsize::new(0),
                next_id: AtomicU64::new(0),
                conns: Mutex::new(HashMap::new()),
                conns_changed: Condvar::new(),
                wake: Mutex::new(None),
            }),
        })
    }
}

/// Stops a running server from another thread; cloneable.
#[derive(Clone)]
pub struct ShutdownHandle {
    shared: Arc<Shared>,
}

impl ShutdownHandle {
    /// Stops accepting connections; the `serve_*` call then lets in-flight requests finish,
    /// closes the connections, flushes the devices and returns. Calling it before `serve_*`
    /// makes `serve_*` return at once.
    pub fn shutdown(&self) {
        self.shared.shutdown();
    }

    /// Counters, readable while the server runs.
    /// The counters now.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }
}

/// An NBD server over one or more [`BlockDevice`]s. A server is meant to serve once: after a
/// shutdown, further `serve_*` calls return immediately.
pub struct NbdServer {
    shared: Arc<Shared>,
}

impl NbdServer {
    /// A builder with the defaults: no export yet, [`DEFAULT_THREADS_PER_CONNECTION`],
    /// [`DEFAULT_MAX_CONNECTIONS`], loopback only, 10 s handshake and 60 s stall timeouts,
    /// [`DEFAULT_BUSY_POLL`], [`DEFAULT_MAX_BUFFER_BYTES`].
    pub fn builder() -> NbdServerBuilder {
        NbdServerBuilder {
            exports: Vec::new(),
            threads_per_connection: DEFAULT_THREADS_PER_CONNECTION,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            allow_remote: false,
            handshake_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(60),
            busy_poll: DEFAULT_BUSY_POLL,
            max_buffer_bytes: DEFAULT_MAX_BUFFER_BYTES,
            tls: None,
            misuse: None,
        }
    }

    /// A handle that stops the server from another thread.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            shared: self.shared.clone(),
        }
    }

    /// The counters now.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Listens on a Unix socket at `path` and serves until shut down (blocking). A stale
    /// socket file (nothing listening) is replaced; a live one or a non-socket file is an
    /// error. The socket file is removed on return.
    pub fn serve_unix(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let path = path.as_ref();
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
                Ok(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("{}: a server is already listening", path.display()),
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    std::fs::remove_file(path)?
                }
                Err(e) => return Err(e),
            },
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", path.display()),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(path)?;
        let result = self.serve_unix_listener(listener);
        let _ = std::fs::remove_file(path);
        result
    }

    /// Serves on an already bound Unix listener (bound to a path) until shut down.
    pub fn serve_unix_listener(&self, listener: UnixListener) -> io::Result<()> {
        let path = listener.local_addr()?.as_pathname().map(Path::to_path_buf);
        let Some(path) = path else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the Unix listener must be bound to a path",
            ));
        };
        self.serve(WakeAddr::Unix(path), || {
            listener.accept().map(|(s, _)| AnyStream::from(s))
        })
    }

    /// Listens on TCP and serves until shut down (blocking). Non-loopback addresses are
    /// refused unless TLS is required with client certificates or the builder had
    /// `allow_remote(true)`.
    pub fn serve_tcp(&self, addr: impl ToSocketAddrs) -> io::Result<()> {
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
        for a in &addrs {
            self.check_remote(a)?;
        }
        self.serve_tcp_listener(TcpListener::bind(&addrs[..])?)
    }

    /// Serves on an already bound TCP listener until shut down (same loopback rule).
    pub fn serve_tcp_listener(&self, listener: TcpListener) -> io::Result<()> {
        let mut local = listener.local_addr()?;
        self.check_remote(&local)?;
        if local.ip().is_unspecified() {
            local.set_ip(match local {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        self.serve(WakeAddr::Tcp(local), || {
            let (s, _) = listener.accept()?;
            let _ = s.set_nodelay(true);
            Ok(AnyStream::from(s))
        })
    }

    /// Serves one already connected client on the calling thread until it disconnects
    /// (counted in the stats; not subject to `max_connections`).
    pub fn serve_unix_stream(&self, stream: UnixStream) {
        let stream = self.wrap(AnyStream::from(stream));
        if let Some(id) = self.shared.register(&stream, false) {
            let _guard = ConnGuard {
                shared: &self.shared,
                id,
            };
            conn::serve(&self.shared, &stream, false);
        }
    }

    fn check_remote(&self, a: &SocketAddr) -> io::Result<()> {
        let authenticated = self.shared.tls_required
            && self
                .shared
                .tls
                .as_ref()
                .is_some_and(|t| t.verifies_clients());
        if !self.shared.allow_remote && !authenticated && !a.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "refusing to serve NBD on non-loopback address {a} without TLS required \
                     with client certificates, or allow_remote(true)"
                ),
            ));
        }
        Ok(())
    }

    /// The connection as served: under a TLS layer when the server has TLS.
    fn wrap(&self, stream: AnyStream) -> AnyStream {
        match (&self.shared.tls, stream) {
            (Some(t), AnyStream::Plain(s)) => AnyStream::Tls(Box::new(TlsStream::new(s, t.into()))),
            (_, stream) => stream,
        }
    }

    fn serve(
        &self,
        wake: WakeAddr,
        mut accept: impl FnMut() -> io::Result<AnyStream>,
    ) -> io::Result<()> {
        *lock(&self.shared.wake) = Some(wake);
        while !self.shared.shutting_down.load(Relaxed) {
            let stream = match accept() {
                Ok(s) => s,
                Err(e) => match e.kind() {
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted => continue,
                    // Out of descriptors or memory: back off instead of spinning.
                    _ => {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                },
            };
            if self.shared.shutting_down.load(Relaxed) {
                break;
            }
            self.spawn_connection(stream);
        }
        *lock(&self.shared.wake) = None;
        self.shared.drain();
        self.shared.flush_all()
    }

    fn spawn_connection(&self, stream: AnyStream) {
        let stream = self.wrap(stream);
        let shared = self.shared.clone();
        let builder = std::thread::Builder::new().name("nbd-conn".into());
        if let Some(id) = shared.register(&stream, true) {
            let spawned = builder.spawn(move || {
                let _guard = ConnGuard {
                    shared: &shared,
                    id,
                };
                conn::serve(&shared, &stream, false);
            });
            if let Err(_e) = spawned {
                // The closure never ran: unregister here.
                drop(ConnGuard {
                    shared: &self.shared,
                    id,
                });
            }
            return;
        }
        shared.counters.connections_rejected.fetch_add(1, Relaxed);
        if shared.rejecting.fetch_add(1, Relaxed) >= MAX_REJECTING {
            shared.rejecting.fetch_sub(1, Relaxed);
            stream.shutdown(Shutdown::Both);
            return;
        }
        let spawned = builder.spawn(move || {
            conn::serve(&shared, &stream, true);
            shared.rejecting.fetch_sub(1, Relaxed);
        });
        if spawned.is_err() {
            self.shared.rejecting.fetch_sub(1, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;
