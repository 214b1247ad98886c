//! TLS for NBD (`NBD_OPT_STARTTLS`): the server's identity, an optional CA that client
//! certificates must chain to, a client's trust and identity ([`NbdClientTls`]), and the
//! stream that carries the rest of a connection, on either side, once TLS has started.
//!
//! The transmission phase reads on one thread while others write (see the crate docs), so
//! the one TLS session of a connection sits behind a lock that is held only to feed it
//! ciphertext, take plaintext out, or seal records; never across socket I/O. Records leave
//! under a second lock (`tx`), taken before the session's, so they reach the socket in the
//! order they were sealed. Holding the session while blocked in `send` deadlocked two
//! cryptblk ends: each one's writer waited for the other to read, and each one's reader
//! waited for its own writer's session lock to decrypt what it had read.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig, ServerConnection,
};

use crate::conn::AnyStream;
use crate::shared::lock;

/// Whether a server's clients must, may or cannot switch to TLS (`NBD_OPT_STARTTLS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// `NBD_OPT_STARTTLS` is refused as unsupported; the default.
    Off,
    /// Clients may upgrade; plaintext clients are served too.
    Optional,
    /// Every option but `NBD_OPT_STARTTLS` and `NBD_OPT_ABORT` is answered with
    /// `NBD_REP_ERR_TLS_REQD` until the connection is encrypted.
    Required,
}

/// A server's TLS identity: certificate chain and key, and optionally the CA that client
/// certificates must be signed by. Cheap to clone.
#[derive(Clone)]
pub struct NbdTls {
    pub(crate) config: Arc<ServerConfig>,
    verifies_clients: bool,
}

impl std::fmt::Debug for NbdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdTls")
            .field("verifies_clients", &self.verifies_clients)
            .finish_non_exhaustive()
    }
}

fn invalid(path: &Path, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{}: {what}", path.display()),
    )
}

fn read_certs(path: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| invalid(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, e))?;
    if certs.is_empty() {
        return Err(invalid(path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

fn read_roots(path: &Path) -> io::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for c in read_certs(path)? {
        roots.add(c).map_err(|e| invalid(path, e))?;
    }
    Ok(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl NbdTls {
    /// From PEM files: `cert` holds the server's certificate chain (its own first), `key`
    /// its private key (PKCS#8, PKCS#1 or SEC1). With `client_ca`, a client must present a
    /// certificate signed by one of the CA certificates in that file, or the TLS handshake
    /// fails.
    pub fn from_pem_files(cert: &Path, key: &Path, client_ca: Option<&Path>) -> io::Result<Self> {
        let certs = read_certs(cert)?;
        let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| invalid(key, e))?;
        let provider = provider();
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| io::Error::other(e.to_string()))?;
        let builder = match client_ca {
            Some(ca) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    Arc::new(read_roots(ca)?),
                    provider,
                )
                .build()
                .map_err(|e| invalid(ca, e))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = builder
            .with_single_cert(certs, key_der)
            .map_err(|e| invalid(cert, format!("certificate and key: {e}")))?;
        Ok(NbdTls {
            config: Arc::new(config),
            verifies_clients: client_ca.is_some(),
        })
    }

    /// Whether clients must present a certificate signed by the configured CA.
    pub fn verifies_clients(&self) -> bool {
        self.verifies_clients
    }
}

/// The system's CA bundle (Debian's ca-certificates), trusted when an `nbds://` URI names
/// no certificate directory.
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// What an NBD client trusts and presents over TLS, read from a directory laid out as
/// libnbd and qemu expect: `ca-cert.pem` (the CA the server's certificate must chain to)
/// and, optionally, `client-cert.pem` with `client-key.pem` (this client's identity, for
/// servers that check client certificates). Cheap to clone.
#[derive(Clone)]
pub struct NbdClientTls {
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
}

impl std::fmt::Debug for NbdClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdClientTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl NbdClientTls {
    /// Trusts the CA certificates in `dir/ca-cert.pem` (or, with no `dir`, the system's
    /// bundle) and presents `dir/client-cert.pem` when it exists. The server's certificate
    /// must name `server_name` (a DNS name or an IP address).
    pub fn from_dir(dir: Option<&Path>, server_name: &str) -> io::Result<NbdClientTls> {
        let ca = match dir {
            Some(d) => d.join("ca-cert.pem"),
            None => Path::new(SYSTEM_CA_BUNDLE).to_path_buf(),
        };
        let name = ServerName::try_from(server_name.to_string()).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("TLS server name '{server_name}': {e}"),
            )
        })?;
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| io::Error::other(e.to_string()))?
            .with_root_certificates(read_roots(&ca)?);
        let cert = dir.map(|d| d.join("client-cert.pem"));
        let config = match cert.filter(|c| c.exists()) {
            Some(cert) => {
                let key = cert.with_file_name("client-key.pem");
                let key_der = PrivateKeyDer::from_pem_file(&key).map_err(|e| invalid(&key, e))?;
                builder
                    .with_client_auth_cert(read_certs(&cert)?, key_der)
                    .map_err(|e| invalid(&cert, format!("certificate and key: {e}")))?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(NbdClientTls {
            config: Arc::new(config),
            server_name: name,
        })
    }
}

/// Which side of the handshake a [`TlsStream`] takes.
pub(crate) enum TlsSide {
    Server(Arc<ServerConfig>),
    Client(Arc<ClientConfig>, ServerName<'static>),
}

impl From<&NbdTls> for TlsSide {
    fn from(t: &NbdTls) -> TlsSide {
        TlsSide::Server(t.config.clone())
    }
}

impl From<&NbdClientTls> for TlsSide {
    fn from(t: &NbdClientTls) -> TlsSide {
        TlsSide::Client(t.config.clone(), t.server_name.clone())
    }
}

/// A TLS failure as an I/O error: the peer refusing us or failing to prove who it is is
/// a refused connection (so a client reports an unusable server, not bad input); anything
/// else is bad data on the wire.
fn tls_error(e: rustls::Error) -> io::Error {
    let kind = match e {
        rustls::Error::AlertReceived(_)
        | rustls::Error::InvalidCertificate(_)
        | rustls::Error::NoCertificatesPresented => io::ErrorKind::ConnectionRefused,
        _ => io::ErrorKind::InvalidData,
    };
    io::Error::new(kind, format!("TLS: {e}"))
}

/// The socket itself, as `Read`/`Write` for rustls.
struct Raw<'a>(&'a AnyStream);

impl Read for Raw<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read_some(buf)
    }
}

impl Write for Raw<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_all(buf)?;
        Ok(buf.len())
    }
    /// All the records rustls has ready in one system call (a 128 KiB reply is eight).
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.0.write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One TLS session.
struct Session {
    conn: Connection,
}

/// Ciphertext read from the socket, `buf[start..end]` not yet fed to the session.
struct Rx {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Session {
    /// Sends whatever the session has to say (records, alerts, tickets) straight to the
    /// socket: only while nobody else uses the connection (the handshake).
    fn flush(&mut self, raw: &AnyStream) -> io::Result<()> {
        while self.conn.wants_write() {
            self.conn.write_tls(&mut Raw(raw))?;
        }
        Ok(())
    }

    /// Moves every record the session has ready into `out`, in order.
    fn take_records(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        while self.conn.wants_write() {
            self.conn.write_tls(out)?;
        }
        Ok(())
    }
}

/// A connection that may switch to TLS: before [`TlsStream::start`] bytes pass straight
/// through to the socket, afterwards through the session.
pub(crate) struct TlsStream {
    raw: AnyStream,
    side: TlsSide,
    active: AtomicBool,
    session: Mutex<Option<Session>>,
    /// The reading thread's buffer for ciphertext from the socket (one reader at a time).
    rx: Mutex<Rx>,
    /// Held while sealed records go to the socket (taken before `session`); its buffer
    /// carries them from the session to the socket.
    tx: Mutex<Vec<u8>>,
}

/// Ciphertext read from the socket at once: a 128 KiB write request's records in one
/// system call.
const RX_LEN: usize = 128 << 10;

impl TlsStream {
    pub(crate) fn new(raw: AnyStream, side: TlsSide) -> TlsStream {
        TlsStream {
            raw,
            side,
            active: AtomicBool::new(false),
            session: Mutex::new(None),
            rx: Mutex::new(Rx {
                buf: Vec::new(),
                start: 0,
                end: 0,
            }),
            tx: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn raw(&self) -> &AnyStream {
        &self.raw
    }

    pub(crate) fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// The TLS handshake, finished before `deadline` or failed.
    pub(crate) fn start(&self, deadline: Option<Instant>) -> io::Result<()> {
        let mut conn: Connection = match &self.side {
            TlsSide::Server(c) => ServerConnection::new(c.clone()).map_err(tls_error)?.into(),
            TlsSide::Client(c, name) => ClientConnection::new(c.clone(), name.clone())
                .map_err(tls_error)?
                .into(),
        };
        let left = || {
            deadline.map(|d| {
                d.saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1))
            })
        };
        while conn.is_handshaking() {
            if let Some(d) = deadline
                && Instant::now() >= d
            {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "TLS handshake too slow",
                ));
            }
            self.raw.set_read_timeout(left());
            self.raw.set_write_timeout(left());
            if let Err(e) = conn.complete_io(&mut Raw(&self.raw)) {
                // Tell the client why, if rustls has an alert for it.
                let _ = conn.write_tls(&mut Raw(&self.raw));
                return Err(e);
            }
        }
        let mut s = Session { conn };
        s.flush(&self.raw)?;
        *lock(&self.session) = Some(s);
        self.active.store(true, Ordering::Release);
        Ok(())
    }

    /// Plaintext from the session, reading the socket (outside the lock) when the session
    /// has none. `Ok(0)` at a clean end (the client's close_notify, or EOF).
    pub(crate) fn read_some(&self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.is_active() {
            return self.raw.read_some(buf);
        }
        let mut rx = lock(&self.rx);
        let rx = &mut *rx;
        if rx.buf.is_empty() {
            rx.buf = vec![0u8; RX_LEN];
        }
        loop {
            {
                let mut g = lock(&self.session);
                let s = g
                    .as_mut()
                    .ok_or_else(|| io::Error::other("no TLS session"))?;
                match s.conn.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if rx.start < rx.end {
                    rx.start += s.conn.read_tls(&mut &rx.buf[rx.start..rx.end])?;
                    let r = s.conn.process_new_packets();
                    let reply = s.conn.wants_write();
                    drop(g);
                    let mut sent = Ok(());
                    if reply {
                        // An alert or a key update to answer. Only if no writer is sending
                        // (waiting here for one could close the deadlock circle again);
                        // otherwise that writer, or the next, sends it with its own records.
                        if let Ok(mut tx) = self.tx.try_lock() {
                            sent = self.send_pending(&mut tx);
                        }
                    }
                    // The TLS error, if any, says more than a failed send of its alert.
                    r.map_err(tls_error)?;
                    sent?;
                    continue;
                }
            }
            // Nothing buffered anywhere: wait for the socket without holding the session.
            let n = self.raw.read_some(&mut rx.buf)?;
            (rx.start, rx.end) = (0, n);
            if n == 0 {
                // EOF: the reader then says whether the client closed properly.
                let mut g = lock(&self.session);
                let s = g
                    .as_mut()
                    .ok_or_else(|| io::Error::other("no TLS session"))?;
                s.conn.read_tls(&mut io::empty())?;
                s.conn.process_new_packets().map_err(tls_error)?;
                return match s.conn.reader().read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                    r => r,
                };
            }
        }
    }

    pub(crate) fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        if !self.is_active() {
            return self.raw.write_all(buf);
        }
        self.write_all2(buf, &[])
    }

    /// `a` then `b` through the session, in shared records (a request header and its
    /// payload need not take a record of their own each).
    pub(crate) fn write_all2(&self, mut a: &[u8], mut b: &[u8]) -> io::Result<()> {
        let mut tx = lock(&self.tx);
        while !a.is_empty() || !b.is_empty() {
            {
                let mut g = lock(&self.session);
                let s = g
                    .as_mut()
                    .ok_or_else(|| io::Error::other("no TLS session"))?;
                // As much as the session takes at once (its send buffer limit, 64 KiB).
                let n = s
                    .conn
                    .writer()
                    .write_vectored(&[io::IoSlice::new(a), io::IoSlice::new(b)])?;
                let from_a = n.min(a.len());
                a = &a[from_a..];
                b = &b[n - from_a..];
                s.take_records(&mut tx)?;
                if n == 0 && tx.is_empty() {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "TLS session takes no more data",
                    ));
                }
            }
            self.write_out(&mut tx)?;
        }
        Ok(())
    }

    /// Writes the records in `tx` to the socket and empties it whatever happens: bytes once
    /// handed to the socket are never sent again (after a failed write the connection is
    /// done; a close_notify may still follow).
    fn write_out(&self, tx: &mut Vec<u8>) -> io::Result<()> {
        let r = self.raw.write_all(tx);
        tx.clear();
        r
    }

    /// Sends the records the session has ready, under `tx` (held by the caller).
    fn send_pending(&self, tx: &mut Vec<u8>) -> io::Result<()> {
        {
            let mut g = lock(&self.session);
            if let Some(s) = g.as_mut() {
                s.take_records(tx)?;
            }
        }
        self.write_out(tx)
    }

    /// Ends the session politely (close_notify), best effort, before the socket closes.
    pub(crate) fn close(&self) {
        if !self.is_active() {
            return;
        }
        let mut tx = lock(&self.tx);
        if let Some(s) = lock(&self.session).as_mut() {
            s.conn.send_close_notify();
        }
        let _ = self.send_pending(&mut tx);
    }
}
