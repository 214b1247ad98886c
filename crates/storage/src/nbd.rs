//! An NBD client: an export on another server (qemu-nbd, nbdkit, another cryptblk) as
//! [`Storage`], so that a volume's ciphertext can live there and the server only ever sees
//! ciphertext.
//!
//! Requests are pipelined: any number of threads call [`Storage::read_at`] and friends at
//! once, each sends its request under the connection's write lock, and the replies are
//! read leader/follower style: whichever waiting thread holds the read lock reads replies
//! until its own arrives (straight into the caller's buffer), handing other threads'
//! replies over through the pending table and waking just their threads; when it is done
//! it wakes one waiting thread to read next. A lone caller thus reads its own reply with no
//! thread switch. When the server offers `NBD_FLAG_CAN_MULTI_CONN`, requests are spread over
//! several connections.
//!
//! A connection that breaks (server gone, socket error, protocol violation) fails the
//! requests in flight on it with `EIO`; the next request connects again, so a server that
//! comes back is used again (its export must still have the same size).
//!
//! Replies are simple replies only (structured replies are not negotiated), which every
//! server must support.

use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use cryptblk_device::Storage;

use cryptblk_nbd_wire::proto::*;
use cryptblk_nbd_wire::{NbdClientTls, Socket, TlsStream};

/// Where an export is, and how to reach it: `nbd://HOST[:PORT]/EXPORT`,
/// `nbd+unix:///EXPORT?socket=PATH`, or either over TLS (`nbds://`, `nbds+unix://`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    /// The server's address.
    pub address: NbdAddress,
    /// The export name (empty: the server's default export).
    pub export: String,
    /// TLS (`nbds` schemes): the connection is refused unless the server switches to TLS
    /// and proves its identity.
    pub tls: Option<NbdUriTls>,
}

/// The TLS parameters of an `nbds://` or `nbds+unix://` URI (libnbd's query parameters).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NbdUriTls {
    /// `tls-certificates=DIR`: `ca-cert.pem` to trust, and `client-cert.pem` with
    /// `client-key.pem` to present if there; without it, the system's CA bundle.
    pub certificates: Option<PathBuf>,
    /// `tls-hostname=NAME`: the name the server's certificate must carry; by default the
    /// URI's host, or `localhost` over a unix socket.
    pub hostname: Option<String>,
    /// Update the send key every this many records instead of only near the cipher's
    /// limit (tests; see [`NbdClientTls::with_key_update_after`]).
    #[doc(hidden)]
    pub key_update_after: Option<u64>,
}

/// An NBD server's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdAddress {
    /// TCP: host name or address, and port.
    Tcp(String, u16),
    /// A unix socket.
    Unix(PathBuf),
}

/// The NBD port IANA assigned.
pub(crate) const DEFAULT_PORT: u16 = 10809;

impl NbdUri {
    /// Whether `s` is meant as an NBD URI (`nbd:`, `nbd+unix:`, `nbds:` ...): such a device
    /// argument is never taken as a file name.
    pub fn is_uri(s: &str) -> bool {
        s.starts_with("nbd://")
            || s.starts_with("nbd+")
            || s.starts_with("nbds://")
            || s.starts_with("nbds+")
    }

    /// Parses the NBD URI specification's TCP and unix forms, with or without TLS:
    /// `nbd[s]://HOST[:PORT][/EXPORT]` (IPv6 hosts in brackets) and
    /// `nbd[s]+unix:///[EXPORT]?socket=PATH`. Over TLS the query may add
    /// `tls-certificates=DIR` and `tls-hostname=NAME`. The export name and query values are
    /// percent-decoded.
    pub fn parse(s: &str) -> io::Result<NbdUri> {
        let bad = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{s}: not a usable NBD URI ({why})"),
            )
        };
        let (scheme, rest) = s.split_once("://").ok_or_else(|| bad("no '://'"))?;
        let (tls, unix) = match scheme {
            "nbd" => (false, false),
            "nbds" => (true, false),
            "nbd+unix" => (false, true),
            "nbds+unix" => (true, true),
            _ => {
                return Err(bad(
                    "the scheme must be nbd, nbds, nbd+unix or nbds+unix (vsock is not supported)",
                ));
            }
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.split_once('/') {
            Some((a, p)) => (a, p),
            None => (rest, ""),
        };
        let mut socket = None;
        let mut uri_tls = tls.then(NbdUriTls::default);
        for kv in query.into_iter().flat_map(|q| q.split('&')) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let v = percent_decode(v).map_err(bad)?;
            match (k, uri_tls.as_mut()) {
                ("socket", _) if unix => socket = Some(v),
                ("tls-certificates", Some(t)) => t.certificates = Some(PathBuf::from(v)),
                ("tls-hostname", Some(t)) => t.hostname = Some(v),
                _ => {
                    return Err(bad(&format!(
                        "unsupported query parameter '{k}' for {scheme}://"
                    )));
                }
            }
        }
        if unix {
            if !authority.is_empty() {
                return Err(bad("a unix socket URI takes no host"));
            }
            let socket = socket.ok_or_else(|| bad("no ?socket="))?;
            if socket.is_empty() {
                return Err(bad("empty socket path"));
            }
            return Ok(NbdUri {
                address: NbdAddress::Unix(PathBuf::from(socket)),
                export: percent_decode(path).map_err(bad)?,
                tls: uri_tls,
            });
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
            (h, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let port = match port {
            Some(p) => p.parse().map_err(|_| bad("bad port"))?,
            None => DEFAULT_PORT,
        };
        Ok(NbdUri {
            address: NbdAddress::Tcp(host.to_string(), port),
            export: percent_decode(path).map_err(bad)?,
            tls: uri_tls,
        })
    }

    /// This URI's TLS configuration (certificates read now), if it asks for TLS.
    fn client_tls(&self) -> io::Result<Option<NbdClientTls>> {
        let Some(t) = &self.tls else { return Ok(None) };
        let name = match (&t.hostname, &self.address) {
            (Some(h), _) => h.as_str(),
            (None, NbdAddress::Tcp(h, _)) => h.as_str(),
            (None, NbdAddress::Unix(_)) => "localhost",
        };
        let tls = NbdClientTls::from_dir(t.certificates.as_deref(), name)?;
        Ok(Some(match t.key_update_after {
            Some(n) => tls.with_key_update_after(n),
            None => tls,
        }))
    }
}

impl std::fmt::Display for NbdUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = if self.tls.is_some() { "s" } else { "" };
        match &self.address {
            NbdAddress::Tcp(h, p) if h.contains(':') => {
                write!(f, "nbd{s}://[{h}]:{p}/{}", self.export)
            }
            NbdAddress::Tcp(h, p) => write!(f, "nbd{s}://{h}:{p}/{}", self.export),
            NbdAddress::Unix(sock) => {
                write!(
                    f,
                    "nbd{s}+unix:///{}?socket={}",
                    self.export,
                    sock.display()
                )
            }
        }
    }
}

fn percent_decode(s: &str) -> Result<String, &'static str> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).ok_or("bad percent escape")?;
            let hex = std::str::from_utf8(hex).map_err(|_| "bad percent escape")?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| "bad percent escape")?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "export name is not UTF-8")
}

/// Options of an [`NbdStorage`].
#[derive(Debug, Clone)]
pub struct NbdClientOptions {
    /// Connections to open when the server offers multi-conn (1 otherwise); default 4.
    pub connections: usize,
    /// Refuse to write (and do not ask for write access).
    pub read_only: bool,
    /// How long connecting and the handshake may take; default 10 s.
    pub connect_timeout: Duration,
}

impl Default for NbdClientOptions {
    fn default() -> Self {
        NbdClientOptions {
            connections: 4,
            read_only: false,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// How often a request waiting for a TLS key update (or the update waiting for the
/// requests in flight) looks again: it happens once per 64 GiB.
const QUIESCE_POLL: Duration = Duration::from_micros(200);

/// Largest payload of one request: every server takes 32 MiB (qemu-nbd's limit).
const MAX_CHUNK: usize = 32 << 20;

/// An NBD export as [`Storage`].
pub struct NbdStorage {
    uri: NbdUri,
    options: NbdClientOptions,
    size: u64,
    flags: u16,
    conns: Vec<Slot>,
    next_conn: AtomicUsize,
    next_handle: AtomicU64,
    /// Set by [`Storage::close`]: no connection is made again.
    closed: AtomicBool,
}

/// One connection of an [`NbdStorage`], connected again after it broke.
struct Slot {
    conn: Mutex<Option<Arc<Conn>>>,
}

struct Conn {
    /// For shutting the socket down without waiting for a writer stuck in `send`.
    ctl: Stream,
    send: Mutex<Stream>,
    recv: Mutex<Stream>,
    pending: Mutex<Pending>,
}

/// A thread waiting for its reply: woken (unparked) only when its reply is in, or to take
/// over reading replies; a condition variable woke every waiter for every reply.
struct Waiter {
    /// For a read, the length of its data.
    len: usize,
    thread: std::thread::Thread,
}

#[derive(Default)]
struct Pending {
    /// Requests sent and not yet answered, by handle.
    waiting: HashMap<u64, Waiter>,
    /// Replies read by another thread: the result, and a read's data.
    done: HashMap<u64, io::Result<Vec<u8>>>,
    /// The connection broke: every request still waiting fails.
    broken: bool,
    /// A TLS key update waits for the requests in flight to finish; new ones wait for it.
    quiescing: bool,
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// Either of the above after `NBD_OPT_STARTTLS`: one session shared by the sending
    /// and the reading side.
    Tls(Arc<TlsStream>),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tls(t) => Stream::Tls(t.clone()),
        })
    }
    fn set_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Stream::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Stream::Tls(s) => {
                s.raw().set_read_timeout(t);
                s.raw().set_write_timeout(t);
                Ok(())
            }
        }
    }
    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
            Stream::Tls(s) => {
                s.raw().shutdown(Shutdown::Both);
                Ok(())
            }
        };
    }
    /// The TLS handshake on this (plaintext) stream, before `deadline`.
    fn start_tls(self, tls: &NbdClientTls, deadline: Instant) -> io::Result<Stream> {
        let raw = match self {
            Stream::Tcp(s) => Socket::Tcp(s),
            Stream::Unix(s) => Socket::Unix(s),
            Stream::Tls(t) => return Ok(Stream::Tls(t)),
        };
        let t = TlsStream::new(raw, tls.into());
        t.start(Some(deadline)).map_err(|e| {
            // A server that cannot prove who it is (or refuses this client) is one that
            // cannot be used: refused, unless it was only slow.
            let kind = match e.kind() {
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => io::ErrorKind::TimedOut,
                _ => io::ErrorKind::ConnectionRefused,
            };
            io::Error::new(kind, format!("TLS handshake: {e}"))
        })?;
        Ok(Stream::Tls(Arc::new(t)))
    }
    /// Writes `a` then `b` with as few system calls (or TLS records) as the stream allows.
    fn write_all2(&mut self, a: &[u8], b: &[u8]) -> io::Result<()> {
        if let Stream::Tls(t) = self {
            return t.write_all2(a, b);
        }
        let (mut a, mut b) = (a, b);
        while !a.is_empty() {
            let n = self.write_vectored(&[IoSlice::new(a), IoSlice::new(b)])?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            if n < a.len() {
                a = &a[n..];
            } else {
                b = &b[n - a.len()..];
                a = &[];
            }
        }
        self.write_all(b)
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::Tls(t) => t.read_some(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            Stream::Tls(t) => t.write_all(buf).map(|()| buf.len()),
        }
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Tls(_) => {
                let b = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| b);
                self.write(b)
            }
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn protocol(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

/// Why a request failed: before anything of it reached the server (it may be sent again on
/// another connection), or after.
enum Failure {
    NotSent(io::Error),
    Failed(io::Error),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Failure {
        Failure::Failed(e)
    }
}

/// What the handshake learnt about the export.
struct Negotiated {
    stream: Stream,
    size: u64,
    flags: u16,
}

fn connect(uri: &NbdUri, options: &NbdClientOptions) -> io::Result<Negotiated> {
    let expired = Arc::new(AtomicBool::new(false));
    negotiate(uri, options, &expired).map_err(|e| match e.kind() {
        // A socket read timeout surfaces as EAGAIN; the whole negotiation's deadline as
        // whatever the socket shut down under it said: either way, say what it is.
        _ if expired.load(Relaxed) => timed_out(options),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timed_out(options),
        // The server hung up mid-negotiation (a refused client certificate can look so).
        io::ErrorKind::UnexpectedEof => io::Error::new(
            io::ErrorKind::ConnectionAborted,
            format!("the server closed the connection during negotiation: {e}"),
        ),
        _ => e,
    })
}

fn timed_out(options: &NbdClientOptions) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "the server did not complete the negotiation within {:.1} s",
            options.connect_timeout.as_secs_f64()
        ),
    )
}

/// One deadline for a whole negotiation, however the server spreads its bytes out (a reply
/// every few seconds, or endless replies, would each renew a per-read timeout): at the
/// deadline a watchdog thread shuts the socket down under the negotiation, unless it was
/// disarmed (dropped) first.
struct NegotiationDeadline {
    done: Arc<(Mutex<bool>, std::sync::Condvar)>,
}

impl NegotiationDeadline {
    fn arm(socket: &Stream, deadline: Instant, expired: Arc<AtomicBool>) -> io::Result<Self> {
        let socket = socket.try_clone()?;
        let done = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let d = done.clone();
        std::thread::Builder::new()
            .name("nbd-negotiation-deadline".into())
            .spawn(move || {
                let (m, cv) = &*d;
                let mut g = lock(m);
                while !*g {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        expired.store(true, Relaxed);
                        socket.shutdown();
                        return;
                    }
                    g = cv
                        .wait_timeout(g, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            })?;
        Ok(NegotiationDeadline { done })
    }
}

impl Drop for NegotiationDeadline {
    fn drop(&mut self) {
        let (m, cv) = &*self.done;
        *lock(m) = true;
        cv.notify_all();
    }
}

fn negotiate(
    uri: &NbdUri,
    options: &NbdClientOptions,
    expired: &Arc<AtomicBool>,
) -> io::Result<Negotiated> {
    let timeout = Some(options.connect_timeout);
    let deadline = Instant::now() + options.connect_timeout;
    // Certificates first: a bad directory is the user's error, whatever the server.
    let options_tls = uri.client_tls()?;
    let stream = match &uri.address {
        NbdAddress::Tcp(host, port) => {
            use std::net::ToSocketAddrs;
            let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host}: no address"));
            let mut found = None;
            for a in (host.as_str(), *port).to_socket_addrs()? {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                match TcpStream::connect_timeout(&a, left) {
                    Ok(s) => {
                        found = Some(s);
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            let s = found.ok_or(last)?;
            s.set_nodelay(true)?;
            Stream::Tcp(s)
        }
        NbdAddress::Unix(path) => Stream::Unix(UnixStream::connect(path)?),
    };
    stream.set_timeout(timeout)?;
    // Disarmed when this function returns, whichever way.
    let _deadline = NegotiationDeadline::arm(&stream, deadline, expired.clone())?;
    let mut s = stream;
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello)?;
    if u64::from_be_bytes(hello[..8].try_into().expect("8")) != NBDMAGIC {
        return Err(protocol("not an NBD server (bad magic)"));
    }
    if u64::from_be_bytes(hello[8..16].try_into().expect("8")) != IHAVEOPT {
        return Err(protocol("the server speaks only oldstyle NBD negotiation"));
    }
    let hs_flags = u16::from_be_bytes([hello[16], hello[17]]);
    if hs_flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(protocol(
            "the server does not speak fixed newstyle negotiation",
        ));
    }
    let no_zeroes = hs_flags & FLAG_NO_ZEROES != 0;
    let client_flags = FLAG_C_FIXED_NEWSTYLE | if no_zeroes { FLAG_C_NO_ZEROES } else { 0 };
    s.write_all(&client_flags.to_be_bytes())?;
    if let Some(tls) = &options_tls {
        s = starttls(s, tls, deadline)?;
    }
    let tls = match &s {
        Stream::Tls(t) => Some(t.clone()),
        _ => None,
    };
    opt_go(s, uri, no_zeroes).map_err(|e| match (tls, e.kind()) {
        // A server that refused our certificate after the handshake (TLS 1.3 lets the
        // client finish first) may have hung up before our first option reached it: its
        // alert, if it sent one, says why better than EPIPE.
        (Some(t), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) => {
            match t.read_some(&mut [0u8; 256]) {
                Err(alert) if alert.kind() == io::ErrorKind::ConnectionRefused => alert,
                _ => e,
            }
        }
        _ => e,
    })
}

/// Replies to NBD_OPT_GO taken at most (information replies, then the final one).
const MAX_GO_REPLIES: usize = 64;

/// NBD_OPT_GO for the URI's export, on a negotiated (and maybe encrypted) stream.
fn opt_go(mut s: Stream, uri: &NbdUri, no_zeroes: bool) -> io::Result<Negotiated> {
    // NBD_OPT_GO: the export name, no information requests.
    let name = uri.export.as_bytes();
    if name.len() > MAX_STRING_LEN {
        return Err(protocol("export name too long"));
    }
    let mut data = Vec::with_capacity(6 + name.len());
    data.extend_from_slice(&(name.len() as u32).to_be_bytes());
    data.extend_from_slice(name);
    data.extend_from_slice(&0u16.to_be_bytes());
    send_option(&mut s, OPT_GO, &data)?;
    let mut export: Option<(u64, u16)> = None;
    for replies in 0.. {
        // A server's information replies are a handful; an endless stream is hostile.
        if replies == MAX_GO_REPLIES {
            return Err(protocol(format!(
                "the server sent more than {MAX_GO_REPLIES} replies to NBD_OPT_GO"
            )));
        }
        let (kind, body) = read_option_reply(&mut s, OPT_GO)?;
        match kind {
            REP_ACK => break,
            REP_INFO
                if body.len() >= 12 && u16::from_be_bytes([body[0], body[1]]) == INFO_EXPORT =>
            {
                let size = u64::from_be_bytes(body[2..10].try_into().expect("8"));
                let flags = u16::from_be_bytes([body[10], body[11]]);
                export = Some((size, flags));
            }
            REP_ERR_UNSUP => {
                // An old server: NBD_OPT_EXPORT_NAME, which has no error reply.
                return export_name(s, name, no_zeroes);
            }
            k if k & (1 << 31) != 0 => {
                let msg = String::from_utf8_lossy(&body).into_owned();
                let what = match k {
                    REP_ERR_UNKNOWN => "no such export",
                    REP_ERR_POLICY => "refused by the server's policy",
                    REP_ERR_TLS_REQD => "the server requires TLS (use nbds://)",
                    REP_ERR_SHUTDOWN => "the server is shutting down",
                    _ => "refused",
                };
                let kind = if k == REP_ERR_UNKNOWN {
                    io::ErrorKind::NotFound
                } else {
                    io::ErrorKind::ConnectionRefused
                };
                return Err(io::Error::new(
                    kind,
                    format!(
                        "export '{}': {what}{}",
                        uri.export,
                        if msg.is_empty() {
                            String::new()
                        } else {
                            format!(": {msg}")
                        }
                    ),
                ));
            }
            _ => {}
        }
    }
    let (size, flags) =
        export.ok_or_else(|| protocol("NBD_OPT_GO answered without the export's size"))?;
    Ok(Negotiated {
        stream: s,
        size,
        flags,
    })
}

/// `NBD_OPT_STARTTLS`, then the handshake: the rest of the negotiation and every request
/// go through TLS. A server that will not switch is an error, never a plaintext fallback.
fn starttls(mut s: Stream, tls: &NbdClientTls, deadline: Instant) -> io::Result<Stream> {
    send_option(&mut s, OPT_STARTTLS, &[])?;
    let (kind, body) = read_option_reply(&mut s, OPT_STARTTLS)?;
    if kind != REP_ACK {
        let msg = String::from_utf8_lossy(&body);
        return Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!(
                "the server does not offer TLS (NBD_OPT_STARTTLS refused{}{msg})",
                if msg.is_empty() { "" } else { ": " }
            ),
        ));
    }
    s.start_tls(tls, deadline)
}

/// One option reply to `opt`: its type (`NBD_REP_*`) and data.
fn read_option_reply(s: &mut Stream, opt: u32) -> io::Result<(u32, Vec<u8>)> {
    let mut h = [0u8; 20];
    s.read_exact(&mut h)?;
    if u64::from_be_bytes(h[..8].try_into().expect("8")) != OPT_REPLY_MAGIC {
        return Err(protocol("bad option reply magic"));
    }
    let got = u32::from_be_bytes(h[8..12].try_into().expect("4"));
    let kind = u32::from_be_bytes(h[12..16].try_into().expect("4"));
    let len = u32::from_be_bytes(h[16..20].try_into().expect("4"));
    if got != opt || len > MAX_OPTION_LEN {
        return Err(protocol(format!("unexpected reply to option {opt}")));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body)?;
    Ok((kind, body))
}

fn send_option(s: &mut Stream, opt: u32, data: &[u8]) -> io::Result<()> {
    let mut m = Vec::with_capacity(16 + data.len());
    m.extend_from_slice(&IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m)
}

fn export_name(mut s: Stream, name: &[u8], no_zeroes: bool) -> io::Result<Negotiated> {
    send_option(&mut s, OPT_EXPORT_NAME, name)?;
    let mut r = [0u8; 10 + 124];
    let n = if no_zeroes { 10 } else { 134 };
    s.read_exact(&mut r[..n])
        .map_err(|e| io::Error::new(e.kind(), format!("export refused or server gone: {e}")))?;
    Ok(Negotiated {
        stream: s,
        size: u64::from_be_bytes(r[..8].try_into().expect("8")),
        flags: u16::from_be_bytes([r[8], r[9]]),
    })
}

impl NbdStorage {
    /// Connects to the export `uri` (one connection, or `options.connections` when the
    /// server offers multi-conn).
    pub fn connect(uri: &NbdUri, options: NbdClientOptions) -> io::Result<NbdStorage> {
        let first = connect(uri, &options)?;
        if first.flags & FLAG_HAS_FLAGS == 0 {
            return Err(protocol("transmission flags without NBD_FLAG_HAS_FLAGS"));
        }
        if !options.read_only && first.flags & FLAG_READ_ONLY != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("export '{}' is read-only", uri.export),
            ));
        }
        let n = if first.flags & FLAG_CAN_MULTI_CONN != 0 {
            options.connections.clamp(1, 16)
        } else {
            1
        };
        let (size, flags) = (first.size, first.flags);
        let mut conns = vec![Slot {
            conn: Mutex::new(Some(Arc::new(Conn::new(first.stream)?))),
        }];
        // The others connect on first use (NbdStorage::conn).
        conns.extend((1..n).map(|_| Slot {
            conn: Mutex::new(None),
        }));
        Ok(NbdStorage {
            uri: uri.clone(),
            options,
            size,
            flags,
            conns,
            next_conn: AtomicUsize::new(0),
            next_handle: AtomicU64::new(1),
            closed: AtomicBool::new(false),
        })
    }

    /// The export's transmission flags (`NBD_FLAG_*`).
    pub fn flags(&self) -> u16 {
        self.flags
    }

    /// Connections used (more than one only with multi-conn).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// A connection for the next request: round robin; one that broke (or was never
    /// made) connects now.
    fn conn(&self) -> io::Result<Arc<Conn>> {
        let i = self.next_conn.fetch_add(1, Relaxed) % self.conns.len();
        let mut slot = lock(&self.conns[i].conn);
        if self.closed.load(Relaxed) {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!("{}: request after the export was closed", self.uri),
            ));
        }
        if let Some(c) = slot.as_ref()
            && !lock(&c.pending).broken
        {
            return Ok(c.clone());
        }
        *slot = None;
        let n = connect(&self.uri, &self.options)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: reconnecting: {e}", self.uri)))?;
        if n.size != self.size {
            return Err(io::Error::other(format!(
                "{}: the export's size changed from {} to {} bytes",
                self.uri, self.size, n.size
            )));
        }
        let c = Arc::new(Conn::new(n.stream)?);
        *slot = Some(c.clone());
        Ok(c)
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > self.size)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: {len} bytes at {offset} are past the export's end ({})",
                    self.uri, self.size
                ),
            ));
        }
        Ok(())
    }

    fn command(
        &self,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
        out: &[u8],
        mut into: Option<&mut [u8]>,
    ) -> io::Result<()> {
        // A connection that broke while idle (the server restarted) is found out by the
        // request that tries to send on it; nothing reached the server, so the request goes
        // out again on a new connection, once.
        let mut retried = false;
        loop {
            let conn = self.conn()?;
            let handle = self.next_handle.fetch_add(1, Relaxed);
            match conn.request(handle, cmd, flags, offset, len, out, into.as_deref_mut()) {
                Err(Failure::NotSent(_)) if !retried => retried = true,
                Err(Failure::NotSent(e) | Failure::Failed(e)) => return Err(e),
                Ok(()) => return Ok(()),
            }
        }
    }
}

impl Conn {
    fn new(stream: Stream) -> io::Result<Conn> {
        // Transmission: no timeout (a flush may take long); a dead peer is a reset or EOF.
        stream.set_timeout(None)?;
        Ok(Conn {
            ctl: stream.try_clone()?,
            recv: Mutex::new(stream.try_clone()?),
            send: Mutex::new(stream),
            pending: Mutex::new(Pending::default()),
        })
    }

    /// Marks the connection broken and fails every request waiting on it.
    fn break_off(&self, p: &mut Pending, why: &io::Error) {
        if !p.broken {
            p.broken = true;
            self.ctl.shutdown();
        }
        let waiting: Vec<(u64, Waiter)> = p.waiting.drain().collect();
        for (h, w) in waiting {
            p.done.insert(
                h,
                Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    format!("NBD connection lost: {why}"),
                )),
            );
            w.thread.unpark();
        }
    }

    /// One thread still waiting for its reply, to wake (once the pending lock is let go)
    /// so that it takes over reading now that the reader is done; every waiter waits
    /// either for the read lock or to be woken.
    fn next_reader(p: &Pending) -> Option<std::thread::Thread> {
        p.waiting.values().next().map(|w| w.thread.clone())
    }

    /// Sends the TLS key update the stream wants (every 2^22 records) with no request in
    /// flight on this connection: the threads already waiting read their replies, new
    /// requests wait meanwhile. Once per 64 GiB sent, and nbdkit's GnuTLS loses a
    /// connection that takes the update while it is sending a reply.
    fn key_update_when_quiet(&self) -> io::Result<()> {
        let Stream::Tls(t) = &self.ctl else {
            return Ok(());
        };
        if !t.key_update_wanted() {
            return Ok(());
        }
        let mut p = lock(&self.pending);
        if p.quiescing || p.broken {
            // Another thread is on it (request() waits), or requests fail anyway.
            return Ok(());
        }
        p.quiescing = true;
        while !p.waiting.is_empty() && !p.broken {
            drop(p);
            std::thread::sleep(QUIESCE_POLL);
            p = lock(&self.pending);
        }
        let r = if p.broken {
            Ok(())
        } else {
            drop(p);
            let r = {
                let _send = lock(&self.send);
                t.update_key_now()
            };
            p = lock(&self.pending);
            r
        };
        p.quiescing = false;
        if let Err(e) = &r {
            self.break_off(&mut p, e);
        }
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn request(
        &self,
        handle: u64,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
        out: &[u8],
        mut into: Option<&mut [u8]>,
    ) -> Result<(), Failure> {
        self.key_update_when_quiet().map_err(Failure::NotSent)?;
        {
            let mut p = lock(&self.pending);
            while p.quiescing && !p.broken {
                drop(p);
                std::thread::sleep(QUIESCE_POLL);
                p = lock(&self.pending);
            }
            if p.broken {
                return Err(Failure::NotSent(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "NBD connection lost",
                )));
            }
            let len = into.as_ref().map_or(0, |b| b.len());
            let thread = std::thread::current();
            p.waiting.insert(handle, Waiter { len, thread });
        }
        let mut hdr = [0u8; REQUEST_LEN];
        hdr[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        hdr[4..6].copy_from_slice(&flags.to_be_bytes());
        hdr[6..8].copy_from_slice(&cmd.to_be_bytes());
        hdr[8..16].copy_from_slice(&handle.to_be_bytes());
        hdr[16..24].copy_from_slice(&offset.to_be_bytes());
        hdr[24..28].copy_from_slice(&len.to_be_bytes());
        let sent = {
            let mut s = lock(&self.send);
            s.write_all2(&hdr, out)
        };
        if let Err(e) = sent {
            let mut p = lock(&self.pending);
            self.break_off(&mut p, &e);
            p.done.remove(&handle);
            return Err(Failure::NotSent(io::Error::new(
                e.kind(),
                format!("NBD request not sent: {e}"),
            )));
        }
        // Wait for the reply: read replies ourselves while nobody else does.
        let mut p = lock(&self.pending);
        loop {
            if let Some(r) = p.done.remove(&handle) {
                let data = r?;
                if let Some(b) = into.as_deref_mut() {
                    b.copy_from_slice(&data);
                }
                return Ok(());
            }
            if p.broken && !p.waiting.contains_key(&handle) {
                // Never answered and no longer expected (cannot happen: breaking moves
                // every waiting request to `done`), but never spin on it.
                return Err(Failure::Failed(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "NBD connection lost",
                )));
            }
            match self.recv.try_lock() {
                Ok(mut r) => {
                    drop(p);
                    let mine = self.read_replies(&mut r, handle, into.as_deref_mut());
                    drop(r);
                    // Let a waiting thread take over reading. It is woken with the pending
                    // lock let go: on a busy CPU it may run at once, and would only block
                    // on that lock again (two more switches per hand-over).
                    let next = Self::next_reader(&lock(&self.pending));
                    if let Some(t) = next {
                        t.unpark();
                    }
                    if let Some(res) = mine {
                        return Ok(res?);
                    }
                    p = lock(&self.pending);
                }
                Err(TryLockError::WouldBlock) => {
                    // Whoever holds the read lock wakes this thread when its reply is in
                    // or when it lets go (an unpark before the park is not lost).
                    drop(p);
                    std::thread::park();
                    p = lock(&self.pending);
                }
                Err(TryLockError::Poisoned(e)) => {
                    // A reader panicked mid-reply: the stream is out of step.
                    drop(e);
                    let err = protocol("NBD reader panicked");
                    self.break_off(&mut p, &err);
                }
            }
        }
    }

    /// Reads replies until this thread's own (`handle`) arrives, its data into `into`;
    /// others' go to the pending table. `None` when the connection broke (the caller then
    /// finds its error in the table).
    fn read_replies(
        &self,
        r: &mut Stream,
        handle: u64,
        mut into: Option<&mut [u8]>,
    ) -> Option<io::Result<()>> {
        loop {
            {
                let p = lock(&self.pending);
                if p.broken || p.done.contains_key(&handle) {
                    return None;
                }
            }
            match self.read_one(r, handle, into.as_deref_mut()) {
                Ok(Some(res)) => return Some(res),
                Ok(None) => {}
                Err(e) => {
                    let mut p = lock(&self.pending);
                    self.break_off(&mut p, &e);
                    return None;
                }
            }
        }
    }

    /// One reply: `Ok(Some(result))` when it was ours, `Ok(None)` when it was another
    /// request's (handed over), `Err` when the stream is unusable.
    fn read_one(
        &self,
        r: &mut Stream,
        handle: u64,
        into: Option<&mut [u8]>,
    ) -> io::Result<Option<io::Result<()>>> {
        let mut h = [0u8; SIMPLE_REPLY_LEN];
        r.read_exact(&mut h)?;
        if u32::from_be_bytes(h[..4].try_into().expect("4")) != SIMPLE_REPLY_MAGIC {
            return Err(protocol("bad NBD reply magic"));
        }
        let error = u32::from_be_bytes(h[4..8].try_into().expect("4"));
        let got = u64::from_be_bytes(h[8..16].try_into().expect("8"));
        let status = || -> io::Result<()> {
            if error == 0 {
                Ok(())
            } else {
                Err(nbd_error(error))
            }
        };
        if got == handle {
            // A read's data follows only when it succeeded. Still listed as waiting until
            // it is in: a connection that breaks now fails this request too.
            if let (Some(buf), 0) = (into, error) {
                r.read_exact(buf)?;
            }
            lock(&self.pending).waiting.remove(&handle);
            return Ok(Some(status()));
        }
        let len = lock(&self.pending).waiting.get(&got).map(|w| w.len);
        let Some(len) = len else {
            return Err(protocol(format!("NBD reply for unknown handle {got}")));
        };
        let mut data = Vec::new();
        if error == 0 && len > 0 {
            data = vec![0u8; len];
            r.read_exact(&mut data)?;
        }
        let owner = {
            let mut p = lock(&self.pending);
            p.done.insert(got, status().map(|()| data));
            p.waiting.remove(&got)
        };
        // Woken with the pending lock let go (see `request`).
        if let Some(w) = owner {
            w.thread.unpark();
        }
        Ok(None)
    }
}

/// The server's error number as an `io::Error` (the protocol's numbers are Linux's).
fn nbd_error(e: u32) -> io::Error {
    let errno = match e {
        EPERM | EIO | ENOMEM | EINVAL | ENOSPC | EOVERFLOW | ENOTSUP | ESHUTDOWN => e as i32,
        _ => EIO as i32,
    };
    io::Error::from_raw_os_error(errno)
}

impl Drop for NbdStorage {
    fn drop(&mut self) {
        self.disconnect();
    }
}

impl NbdStorage {
    /// NBD_CMD_DISC on each live connection, so the server sees a clean end; none is
    /// made again.
    fn disconnect(&self) {
        self.closed.store(true, Relaxed);
        for slot in &self.conns {
            if let Some(c) = lock(&slot.conn).take() {
                let mut hdr = [0u8; REQUEST_LEN];
                hdr[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
                hdr[6..8].copy_from_slice(&CMD_DISC.to_be_bytes());
                let mut s = lock(&c.send);
                let _ = s.write_all(&hdr);
                if let Stream::Tls(t) = &*s {
                    t.close();
                }
                s.shutdown();
            }
        }
    }
}

impl Storage for NbdStorage {
    fn size(&self) -> io::Result<u64> {
        Ok(self.size)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len())?;
        let mut off = offset;
        for chunk in buf.chunks_mut(MAX_CHUNK) {
            let len = chunk.len() as u32;
            self.command(CMD_READ, 0, off, len, &[], Some(chunk))?;
            off += u64::from(len);
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.options.read_only {
            return Err(io::Error::from_raw_os_error(EPERM as i32));
        }
        self.check(offset, buf.len())?;
        let mut off = offset;
        for chunk in buf.chunks(MAX_CHUNK) {
            let len = chunk.len() as u32;
            self.command(CMD_WRITE, 0, off, len, chunk, None)?;
            off += u64::from(len);
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        if self.options.read_only || self.flags & FLAG_SEND_FLUSH == 0 {
            // Without NBD_FLAG_SEND_FLUSH the server has no write cache to flush.
            return Ok(());
        }
        // With multi-conn a flush on one connection covers writes completed on all of
        // them; without it there is only one.
        self.command(CMD_FLUSH, 0, 0, 0, &[], None)
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.options.read_only {
            return Err(io::Error::from_raw_os_error(EPERM as i32));
        }
        // WRITE_ZEROES without NO_HOLE: zeros, deallocated where the server can; TRIM alone
        // would leave the contents undefined.
        if self.flags & FLAG_SEND_WRITE_ZEROES == 0 {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        self.check(offset, usize::try_from(len).unwrap_or(usize::MAX))?;
        let mut off = offset;
        let end = offset + len;
        while off < end {
            let n = (end - off).min(1 << 30) as u32;
            self.command(CMD_WRITE_ZEROES, 0, off, n, &[], None)?;
            off += u64::from(n);
        }
        Ok(())
    }

    fn prefetch(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.flags & FLAG_SEND_CACHE == 0 || len == 0 {
            return Ok(());
        }
        let len = len
            .min(self.size.saturating_sub(offset))
            .min(u32::MAX as u64) as u32;
        self.command(CMD_CACHE, 0, offset, len, &[], None)
    }

    fn close(&self) -> io::Result<()> {
        self.disconnect();
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "nbd, {}, {} connection{}",
            self.uri,
            self.conns.len(),
            if self.conns.len() == 1 { "" } else { "s" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn uris() {
        let u = NbdUri::parse("nbd://example.org/disk%20one").unwrap();
        assert_eq!(
            u.address,
            NbdAddress::Tcp("example.org".into(), DEFAULT_PORT)
        );
        assert_eq!(u.export, "disk one");
        let u = NbdUri::parse("nbd://127.0.0.1:10900").unwrap();
        assert_eq!(u.address, NbdAddress::Tcp("127.0.0.1".into(), 10900));
        assert_eq!(u.export, "");
        let u = NbdUri::parse("nbd://[::1]:10901/x").unwrap();
        assert_eq!(u.address, NbdAddress::Tcp("::1".into(), 10901));
        assert_eq!(u.to_string(), "nbd://[::1]:10901/x");
        let u = NbdUri::parse("nbd+unix:///exp?socket=/run/a%20b.sock").unwrap();
        assert_eq!(u.address, NbdAddress::Unix("/run/a b.sock".into()));
        assert_eq!(u.export, "exp");
        let u = NbdUri::parse("nbd+unix:///?socket=/s").unwrap();
        assert_eq!(u.export, "");
        for bad in [
            "nbd://",
            "nbd://:10809/x",
            "nbd://h:notaport/x",
            "nbd://h/x?tls=1",
            "nbd://h/x?tls-certificates=/d",
            "nbds://h/x?socket=/s",
            "nbds+unix:///x",
            "nbd+vsock:///x",
            "nbd+unix:///x",
            "nbd+unix://host/x?socket=/s",
            "nbd+unix:///x?socket=",
            "nbd://h/%zz",
            "nbd://[::1/x",
        ] {
            assert!(NbdUri::parse(bad).is_err(), "{bad} parsed");
            assert!(NbdUri::is_uri(bad) || bad.starts_with("nbd"), "{bad}");
        }
        let u =
            NbdUri::parse("nbds://h:99/e?tls-certificates=/etc/pki%20x&tls-hostname=srv").unwrap();
        assert_eq!(u.address, NbdAddress::Tcp("h".into(), 99));
        let t = u.tls.as_ref().unwrap();
        assert_eq!(t.certificates.as_deref(), Some(Path::new("/etc/pki x")));
        assert_eq!(t.hostname.as_deref(), Some("srv"));
        assert_eq!(u.to_string(), "nbds://h:99/e");
        let u = NbdUri::parse("nbds+unix:///e?socket=/s&tls-certificates=/d").unwrap();
        assert_eq!(u.address, NbdAddress::Unix("/s".into()));
        assert_eq!(u.tls.unwrap().hostname, None);
        assert_eq!(
            NbdUri::parse("nbds://h").unwrap().tls,
            Some(NbdUriTls::default())
        );
        assert_eq!(NbdUri::parse("nbd://h").unwrap().tls, None);
        assert!(!NbdUri::is_uri("/dev/sda"));
        assert!(!NbdUri::is_uri("nbd.img"));
        assert!(!NbdUri::is_uri("nbds.img"));
        assert!(NbdUri::is_uri("nbds+unix:///x?socket=/s"));
    }
}
