//! TLS for NBD (`NBD_OPT_STARTTLS`): the server's identity, an optional CA that client
//! certificates must chain to, a client's trust and identity ([`NbdClientTls`]), and the
//! stream that carries the rest of a connection, on either side, once TLS has started.
//!
//! rustls runs the handshake (TLS 1.3, or 1.2 for clients without it: the kernel's
//! nbd-client); the transmission phase then protects its
//! records itself ([`record`]), one key per direction: the thread that reads opens records
//! under the receive lock, writers seal under the send lock, and neither ever waits for the
//! other. (One rustls session shared by both directions had to be locked for either, and
//! two cryptblk ends deadlocked when each one's writer, blocked in `send`, held the lock its
//! own reader needed to decrypt what the other end was waiting to have read.) rustls keeps
//! the key schedule: it derives the next traffic secret at each key update and takes the
//! session tickets a server sends.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::kernel::KernelConnection;
use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection, WebPkiClientVerifier};
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::{
    AlertDescription, ClientConfig, ConnectionTrafficSecrets, ExtractedSecrets, RootCertStore,
    ServerConfig,
};

use crate::socket::{Socket, lock};

mod record;
use record::{
    ALERT, APPLICATION_DATA, HANDSHAKE, HEADER_LEN, MAX_CIPHERTEXT, MAX_PLAINTEXT, Outbox,
};
use record::{OVERHEAD, RecordKey};

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
    key_update_after: Option<u64>,
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

/// The server's suites in its order of preference, which it applies: TLS 1.3's as rustls
/// lists them (AES-GCM first), then TLS 1.2's with ChaCha20-Poly1305 first. rustls caps
/// a TLS 1.2 AES-GCM key at 2^24 records, one per 4 KiB reply, so a TLS 1.2 client (the
/// kernel's nbd-client) would be cut off after minutes of small I/O; ChaCha20's key has
/// no such limit.
fn server_provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    let rank = |s: &rustls::SupportedCipherSuite| match s {
        rustls::SupportedCipherSuite::Tls13(_) => 0,
        rustls::SupportedCipherSuite::Tls12(t) if t.common.confidentiality_limit == u64::MAX => 1,
        rustls::SupportedCipherSuite::Tls12(_) => 2,
    };
    p.cipher_suites.sort_by_key(rank);
    Arc::new(p)
}

impl NbdTls {
    /// From PEM files: `cert` holds the server's certificate chain (its own first), `key`
    /// its private key (PKCS#8, PKCS#1 or SEC1). With `client_ca`, a client must present a
    /// certificate signed by one of the CA certificates in that file, or the TLS handshake
    /// fails.
    pub fn from_pem_files(cert: &Path, key: &Path, client_ca: Option<&Path>) -> io::Result<Self> {
        let certs = read_certs(cert)?;
        let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| invalid(key, e))?;
        let provider = server_provider();
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
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
        let mut config = builder
            .with_single_cert(certs, key_der)
            .map_err(|e| invalid(cert, format!("certificate and key: {e}")))?;
        // The record layer after the handshake is ours (see the module docs).
        config.enable_secret_extraction = true;
        config.ignore_client_order = true;
        Ok(NbdTls {
            config: Arc::new(config),
            verifies_clients: client_ca.is_some(),
            key_update_after: None,
        })
    }

    /// Whether clients must present a certificate signed by the configured CA.
    pub fn verifies_clients(&self) -> bool {
        self.verifies_clients
    }

    /// Sends a key update after every `records` records instead of only near the cipher's
    /// limit (2^23 records for AES-GCM): for tests, which cannot send hundreds of GB.
    #[doc(hidden)]
    pub fn with_key_update_after(mut self, records: u64) -> Self {
        self.key_update_after = Some(records.max(1));
        self
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
    key_update_after: Option<u64>,
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
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| io::Error::other(e.to_string()))?
            .with_root_certificates(read_roots(&ca)?);
        let cert = dir.map(|d| d.join("client-cert.pem"));
        let mut config = match cert.filter(|c| c.exists()) {
            Some(cert) => {
                let key = cert.with_file_name("client-key.pem");
                let key_der = PrivateKeyDer::from_pem_file(&key).map_err(|e| invalid(&key, e))?;
                builder
                    .with_client_auth_cert(read_certs(&cert)?, key_der)
                    .map_err(|e| invalid(&cert, format!("certificate and key: {e}")))?
            }
            None => builder.with_no_client_auth(),
        };
        config.enable_secret_extraction = true;
        Ok(NbdClientTls {
            config: Arc::new(config),
            server_name: name,
            key_update_after: None,
        })
    }

    /// As [`NbdTls::with_key_update_after`].
    #[doc(hidden)]
    pub fn with_key_update_after(mut self, records: u64) -> Self {
        self.key_update_after = Some(records.max(1));
        self
    }
}

/// Which side of the handshake a [`TlsStream`] takes, and when it updates its send key.
pub struct TlsSide {
    role: Role,
    key_update_after: Option<u64>,
}

enum Role {
    Server(Arc<ServerConfig>),
    Client(Arc<ClientConfig>, ServerName<'static>),
}

impl From<&NbdTls> for TlsSide {
    fn from(t: &NbdTls) -> TlsSide {
        TlsSide {
            role: Role::Server(t.config.clone()),
            key_update_after: t.key_update_after,
        }
    }
}

impl From<&NbdClientTls> for TlsSide {
    fn from(t: &NbdClientTls) -> TlsSide {
        TlsSide {
            role: Role::Client(t.config.clone(), t.server_name.clone()),
            key_update_after: t.key_update_after,
        }
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

/// rustls after the handshake (`rustls::kernel`): the next traffic secret at each key
/// update, and the session tickets a server sends its clients.
enum KeySchedule {
    Server(KernelConnection<ServerConnectionData>),
    Client(KernelConnection<ClientConnectionData>),
}

impl KeySchedule {
    fn next_tx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            KeySchedule::Server(k) => k.update_tx_secret(),
            KeySchedule::Client(k) => k.update_tx_secret(),
        }
    }
    fn next_rx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            KeySchedule::Server(k) => k.update_rx_secret(),
            KeySchedule::Client(k) => k.update_rx_secret(),
        }
    }
    /// Records one key may protect: the suite's confidentiality limit (rustls': 2^23 or
    /// 2^24 for AES-GCM, none for ChaCha20-Poly1305).
    fn record_limit(&self) -> u64 {
        let suite = match self {
            KeySchedule::Server(k) => k.negotiated_cipher_suite(),
            KeySchedule::Client(k) => k.negotiated_cipher_suite(),
        };
        match suite {
            rustls::SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
            rustls::SupportedCipherSuite::Tls12(s) => s.common.confidentiality_limit,
        }
    }
    fn is_tls12(&self) -> bool {
        let version = match self {
            KeySchedule::Server(k) => k.protocol_version(),
            KeySchedule::Client(k) => k.protocol_version(),
        };
        version == rustls::ProtocolVersion::TLSv1_2
    }
}

/// What a handshake leaves: the traffic secrets, rustls' key schedule, ciphertext that
/// arrived after the handshake, and any plaintext rustls already opened from it.
struct Handshaken {
    secrets: ExtractedSecrets,
    schedule: KeySchedule,
    leftover: Vec<u8>,
    plaintext: Vec<u8>,
}

/// One side of an unbuffered rustls handshake.
trait Handshake: Sized {
    type Data;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn finish(self) -> Result<(ExtractedSecrets, KeySchedule), rustls::Error>;
}

/// `Handshake` for rustls' unbuffered connection of one side.
macro_rules! handshake_side {
    ($conn:ty, $data:ty, $side:ident) => {
        impl Handshake for $conn {
            type Data = $data;
            fn process<'c, 'i>(
                &'c mut self,
                incoming: &'i mut [u8],
            ) -> UnbufferedStatus<'c, 'i, Self::Data> {
                self.process_tls_records(incoming)
            }
            fn finish(self) -> Result<(ExtractedSecrets, KeySchedule), rustls::Error> {
                let (secrets, k) = self.dangerous_into_kernel_connection()?;
                Ok((secrets, KeySchedule::$side(k)))
            }
        }
    };
}

handshake_side!(UnbufferedServerConnection, ServerConnectionData, Server);
handshake_side!(UnbufferedClientConnection, ClientConnectionData, Client);

/// How much of `buf` to give rustls next: the record starting it, once all of it is there,
/// or just the header where that header cannot start a TLS record (not a record type and
/// version 3.x, or longer than any record rustls takes), so that rustls refuses it now.
fn record_end(buf: &[u8]) -> Option<usize> {
    /// rustls refuses any record header announcing this much or more (2^14 + 2048).
    const RUSTLS_MAX_RECORD: usize = (1 << 14) + 2048;
    let header = buf.get(..HEADER_LEN)?;
    let len = u16::from_be_bytes([header[3], header[4]]) as usize;
    if !(20..=23).contains(&header[0]) || header[1] != 3 || len >= RUSTLS_MAX_RECORD {
        return Some(HEADER_LEN);
    }
    (buf.len() >= HEADER_LEN + len).then_some(HEADER_LEN + len)
}

/// Runs `conn`'s handshake on `raw` until application data may flow, before `deadline`.
/// rustls gets one record more only when it asks for more: records after the handshake's
/// last one stay for the record layer (rustls would otherwise open them, or act on a key
/// update in them, and keep its answer to itself).
fn handshake<H: Handshake>(
    mut conn: H,
    raw: &Socket,
    deadline: Option<Instant>,
) -> io::Result<Handshaken> {
    let mut incoming = vec![0u8; 2 * (HEADER_LEN + MAX_CIPHERTEXT)];
    let mut used = 0;
    // incoming[..fed] is what rustls has been given.
    let mut fed = 0;
    let mut outgoing: Vec<u8> = Vec::new();
    let mut plaintext = Vec::new();
    let io_deadline = || -> io::Result<()> {
        let left = match deadline {
            None => None,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "TLS handshake too slow",
                    ));
                }
                Some(left.max(Duration::from_millis(1)))
            }
        };
        raw.set_read_timeout(left);
        raw.set_write_timeout(left);
        Ok(())
    };
    loop {
        let UnbufferedStatus { mut discard, state } = conn.process(&mut incoming[..fed]);
        let mut more = false;
        let mut done = false;
        match state {
            Err(e) => {
                // rustls queues an alert that says why: send it, best effort. (The buffer
                // goes with it: rustls may still hold places in it.)
                incoming.copy_within(discard..used, 0);
                let _ = send_alerts(&mut conn, &mut incoming[..fed - discard], raw);
                return Err(tls_error(e));
            }
            Ok(ConnectionState::EncodeTlsData(mut enc)) => {
                let at = outgoing.len();
                outgoing.resize(at + 4096, 0);
                loop {
                    match enc.encode(&mut outgoing[at..]) {
                        Ok(n) => {
                            outgoing.truncate(at + n);
                            break;
                        }
                        Err(EncodeError::InsufficientSize(s)) => {
                            outgoing.resize(at + s.required_size, 0)
                        }
                        Err(e) => return Err(io::Error::other(format!("TLS: {e}"))),
                    }
                }
            }
            Ok(ConnectionState::TransmitTlsData(t)) => {
                io_deadline()?;
                raw.write_all(&outgoing)?;
                outgoing.clear();
                t.done();
            }
            Ok(ConnectionState::BlockedHandshake) => more = true,
            Ok(ConnectionState::ReadTraffic(mut r)) => {
                // Application data already behind the handshake's last message.
                while let Some(rec) = r.next_record() {
                    let rec = rec.map_err(tls_error)?;
                    discard += rec.discard;
                    plaintext.extend_from_slice(rec.payload);
                }
            }
            Ok(ConnectionState::WriteTraffic(_)) => done = true,
            Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "TLS: the peer closed the connection during the handshake",
                ));
            }
            Ok(_) => return Err(io::Error::other("TLS: unexpected handshake state")),
        }
        incoming.copy_within(discard..used, 0);
        used -= discard;
        fed -= discard;
        if done {
            break;
        }
        if more {
            if let Some(n) = record_end(&incoming[fed..used]) {
                fed += n;
                continue;
            }
            if used == incoming.len() {
                // A flight larger than two records (long certificate chains): rustls needs
                // all of a handshake message in the buffer at once.
                if incoming.len() >= MAX_HANDSHAKE_FLIGHT {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "TLS: handshake message too large",
                    ));
                }
                incoming.resize(2 * incoming.len(), 0);
            }
            io_deadline()?;
            let n = raw.read_some(&mut incoming[used..]).map_err(|e| {
                if e.kind() == io::ErrorKind::WouldBlock {
                    io::Error::new(io::ErrorKind::TimedOut, "TLS handshake too slow")
                } else {
                    e
                }
            })?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "TLS: the peer hung up during the handshake",
                ));
            }
            used += n;
        }
    }
    if fed != 0 {
        return Err(io::Error::other(
            "TLS: rustls kept handshake records it had processed",
        ));
    }
    let (secrets, schedule) = conn.finish().map_err(tls_error)?;
    incoming.truncate(used);
    Ok(Handshaken {
        secrets,
        schedule,
        leftover: incoming,
        plaintext,
    })
}

/// Sends the alert rustls queued after a failed handshake step; `incoming` is the
/// handshake's unprocessed input, as rustls last saw it. One call only: after some
/// errors rustls has not discarded the bad record, and a second call would process it
/// (and try to alert) again.
fn send_alerts<H: Handshake>(conn: &mut H, incoming: &mut [u8], raw: &Socket) -> io::Result<()> {
    let mut out = vec![0u8; 512];
    let mut len = 0;
    if let Ok(ConnectionState::EncodeTlsData(mut enc)) = conn.process(incoming).state
        && let Ok(n) = enc.encode(&mut out)
    {
        len = n;
    }
    raw.write_all(&out[..len])
}

/// The receiving direction: ciphertext read from the socket at `buf[start..end]`, the
/// opened content of the last record at `buf[plain]`.
struct Rx {
    key: RecordKey,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    plain: std::ops::Range<usize>,
    /// Plaintext rustls opened during the handshake, handed out first.
    early: Vec<u8>,
    /// A handshake message (key update, session ticket) not yet complete.
    handshake: Vec<u8>,
    /// The peer's close_notify arrived: the stream has ended.
    closed: bool,
    /// An earlier record failed: every read fails from then on.
    failed: bool,
}

/// The sending direction: its key, and the records sealed but not yet written.
struct Tx {
    key: RecordKey,
    buf: Outbox,
    /// Records after which the key is updated (well below the cipher's limit). A client
    /// defers it to [`TlsStream::update_key_now`], called with nothing in flight, up to
    /// `update_by`, where it updates anyway.
    update_at: u64,
    update_by: u64,
    /// A write failed (the peer may hold part of a record) or a fatal alert or
    /// close_notify went out: nothing more may be sent.
    failed: bool,
}

/// A connection that may switch to TLS: before [`TlsStream::start`] bytes pass straight
/// through to the socket, afterwards through the record layer.
pub struct TlsStream {
    raw: Socket,
    side: TlsSide,
    active: AtomicBool,
    rx: Mutex<Option<Rx>>,
    /// Held while records are sealed and written, so they reach the socket in order.
    tx: Mutex<Option<Tx>>,
    schedule: Mutex<Option<KeySchedule>>,
    /// The peer asked for a key update: the next sender updates its key first.
    update_requested: AtomicBool,
    /// Our send key is due for an update, which waits for [`TlsStream::update_key_now`].
    update_wanted: AtomicBool,
}

/// Ciphertext read from the socket at once: a 128 KiB write request's records in one
/// system call.
const RX_LEN: usize = 128 << 10;
/// Sealed records written to the socket at once (and the most a sender buffers).
const TX_BATCH: usize = 256 << 10;
/// The largest handshake message expected after the handshake (a session ticket).
const MAX_HANDSHAKE_MESSAGE: usize = 64 << 10;
/// The most handshake data buffered at once during the handshake.
const MAX_HANDSHAKE_FLIGHT: usize = 1 << 20;
/// TLS handshake message types after the handshake (RFC 8446 §4).
const HELLO_REQUEST: u8 = 0;
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;

fn no_session() -> io::Error {
    io::Error::other("no TLS session")
}

impl TlsStream {
    /// `raw` under a TLS layer that starts with [`TlsStream::start`] (`side`: which end).
    pub fn new(raw: Socket, side: TlsSide) -> TlsStream {
        TlsStream {
            raw,
            side,
            active: AtomicBool::new(false),
            rx: Mutex::new(None),
            tx: Mutex::new(None),
            schedule: Mutex::new(None),
            update_requested: AtomicBool::new(false),
            update_wanted: AtomicBool::new(false),
        }
    }

    /// The socket under the TLS layer.
    pub fn raw(&self) -> &Socket {
        &self.raw
    }

    /// Whether the handshake is done and records protect the bytes.
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// The TLS handshake, finished before `deadline` or failed.
    pub fn start(&self, deadline: Option<Instant>) -> io::Result<()> {
        let hs = match &self.side.role {
            Role::Server(c) => handshake(
                UnbufferedServerConnection::new(c.clone()).map_err(tls_error)?,
                &self.raw,
                deadline,
            )?,
            Role::Client(c, name) => handshake(
                UnbufferedClientConnection::new(c.clone(), name.clone()).map_err(tls_error)?,
                &self.raw,
                deadline,
            )?,
        };
        let Handshaken {
            secrets,
            schedule,
            mut leftover,
            plaintext,
        } = hs;
        let limit = schedule.record_limit();
        let tls12 = schedule.is_tls12();
        let update_at = self
            .side
            .key_update_after
            .unwrap_or(limit / 2)
            .min(limit / 2);
        // A server updates on time; a client lets its caller pick a quiet moment first
        // (see `update_key_now`), for up to half as many records again (still under 3/4
        // of the limit).
        let update_by = match self.side.role {
            // TLS 1.2 has no key updates: the session ends at the limit, as rustls ends it.
            _ if tls12 => limit,
            Role::Server(_) => update_at,
            Role::Client(..) => update_at.saturating_add(update_at / 2).min(limit / 4 * 3),
        };
        let end = leftover.len();
        leftover.resize(RX_LEN.max(end), 0);
        *lock(&self.rx) = Some(Rx {
            key: RecordKey::new(secrets.rx.0, secrets.rx.1, tls12)?,
            buf: leftover,
            start: 0,
            end,
            plain: 0..0,
            early: plaintext,
            handshake: Vec::new(),
            closed: false,
            failed: false,
        });
        *lock(&self.tx) = Some(Tx {
            key: RecordKey::new(secrets.tx.0, secrets.tx.1, tls12)?,
            buf: Outbox::new(),
            update_at,
            update_by,
            failed: false,
        });
        *lock(&self.schedule) = Some(schedule);
        self.active.store(true, Ordering::Release);
        Ok(())
    }

    /// Plaintext from the peer, reading the socket when no opened record has any left.
    /// `Ok(0)` at a clean end (the peer's close_notify); EOF without one is an error.
    /// `buf` past the bytes returned may be overwritten too: records are opened straight
    /// into it where they fit (a TLS 1.3 record's type byte and padding, an alert or a
    /// handshake message, or zeros where a record failed to open, land there).
    pub fn read_some(&self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.is_active() {
            return self.raw.read_some(buf);
        }
        let mut g = lock(&self.rx);
        let rx = g.as_mut().ok_or_else(no_session)?;
        if rx.failed {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "TLS: the session failed earlier",
            ));
        }
        loop {
            if !rx.early.is_empty() {
                let n = buf.len().min(rx.early.len());
                buf[..n].copy_from_slice(&rx.early[..n]);
                rx.early.drain(..n);
                return Ok(n);
            }
            if !rx.plain.is_empty() {
                let n = buf.len().min(rx.plain.len());
                buf[..n].copy_from_slice(&rx.buf[rx.plain.start..rx.plain.start + n]);
                rx.plain.start += n;
                return Ok(n);
            }
            if rx.closed || buf.is_empty() {
                return Ok(0);
            }
            match self.next_record(rx, &mut *buf) {
                Ok(Some(n)) => return Ok(n),
                Ok(None) => {}
                Err((e, alert)) => {
                    // A socket timeout leaves the stream where it was; anything else ends it.
                    rx.failed = !matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    );
                    if let Some(alert) = alert {
                        self.try_send_alert(alert);
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Opens the next record in `rx`, reading the socket for it if needed. Application
    /// data goes straight to `to` where the whole record's plaintext fits there and the
    /// AEAD can put it there (`Some(bytes)`: `Some(0)` never, an empty record is `None`);
    /// otherwise it stays in `rx` for the reader to copy. A failure says which alert, if
    /// any, the peer should get.
    fn next_record(
        &self,
        rx: &mut Rx,
        to: &mut [u8],
    ) -> Result<Option<usize>, (io::Error, Option<AlertDescription>)> {
        let fatal = |what: &str, alert| {
            (
                io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {what}")),
                Some(alert),
            )
        };
        let avail = rx.end - rx.start;
        if avail >= HEADER_LEN {
            let header: [u8; HEADER_LEN] = rx.buf[rx.start..rx.start + HEADER_LEN]
                .try_into()
                .expect("five bytes");
            let len = u16::from_be_bytes([header[3], header[4]]) as usize;
            if !rx.key.takes_outer_type(header[0]) {
                return Err(fatal(
                    "unprotected record after the handshake",
                    AlertDescription::UnexpectedMessage,
                ));
            }
            if len > MAX_CIPHERTEXT {
                return Err(fatal("record too long", AlertDescription::RecordOverflow));
            }
            if avail >= HEADER_LEN + len {
                let record = rx.start + HEADER_LEN;
                rx.start = record + len;
                // Straight to `to` only where the whole plaintext fits: a record holds
                // no more than 2^14 bytes of content, but a peer may pad it out to 2^14
                // + 256.
                let direct = rx
                    .key
                    .opens_out_of_place(len)
                    .is_some_and(|n| n <= to.len());
                let body = &mut rx.buf[record..record + len];
                let (typ, content) = rx
                    .key
                    .open(header, body, direct.then_some(&mut *to))
                    .map_err(|e| (e, Some(AlertDescription::BadRecordMac)))?;
                let n = content.len();
                if n > MAX_PLAINTEXT {
                    return Err(fatal("record too long", AlertDescription::RecordOverflow));
                }
                if typ != HANDSHAKE && !rx.handshake.is_empty() {
                    return Err(fatal(
                        "handshake message split by other records",
                        AlertDescription::UnexpectedMessage,
                    ));
                }
                let bytes = if direct {
                    &to[content.clone()]
                } else {
                    &rx.buf[record + content.start..record + content.end]
                };
                match typ {
                    APPLICATION_DATA if direct => return Ok((n > 0).then_some(n)),
                    APPLICATION_DATA => {
                        rx.plain = record + content.start..record + content.end;
                    }
                    ALERT => {
                        let alert = <[u8; 2]>::try_from(bytes)
                            .map_err(|_| fatal("malformed alert", AlertDescription::DecodeError))?;
                        self.alert(rx, alert)?;
                    }
                    HANDSHAKE if n == 0 => {
                        return Err(fatal(
                            "empty handshake record",
                            AlertDescription::UnexpectedMessage,
                        ));
                    }
                    HANDSHAKE => {
                        rx.handshake.extend_from_slice(bytes);
                        self.handshake_messages(rx)?;
                    }
                    _ => {
                        return Err(fatal(
                            "record of an unexpected type",
                            AlertDescription::UnexpectedMessage,
                        ));
                    }
                }
                return Ok(None);
            }
        }
        // Not a whole record yet: make room for one, then read.
        if rx.start == rx.end {
            (rx.start, rx.end) = (0, 0);
        } else if rx.buf.len() - rx.end < HEADER_LEN + MAX_CIPHERTEXT {
            rx.buf.copy_within(rx.start..rx.end, 0);
            (rx.start, rx.end) = (0, avail);
        }
        let n = self
            .raw
            .read_some(&mut rx.buf[rx.end..])
            .map_err(|e| (e, None))?;
        if n == 0 {
            let what = if rx.start < rx.end {
                "the peer hung up in the middle of a record"
            } else {
                "the peer hung up without a close_notify"
            };
            return Err((
                io::Error::new(io::ErrorKind::UnexpectedEof, format!("TLS: {what}")),
                None,
            ));
        }
        rx.end += n;
        Ok(None)
    }

    /// An alert from the peer (level, description): close_notify ends the stream,
    /// anything else fails it.
    fn alert(
        &self,
        rx: &mut Rx,
        [level, description]: [u8; 2],
    ) -> Result<(), (io::Error, Option<AlertDescription>)> {
        match AlertDescription::from(description) {
            AlertDescription::CloseNotify => rx.closed = true,
            AlertDescription::UserCanceled => {}
            // TLS 1.2 warnings (no_renegotiation...) leave the session up.
            _ if level == 1 && rx.key.is_tls12() => {}
            a => return Err((tls_error(rustls::Error::AlertReceived(a)), None)),
        }
        Ok(())
    }

    /// Handshake messages after the handshake: key updates (either side) and session
    /// tickets (from a server).
    fn handshake_messages(&self, rx: &mut Rx) -> Result<(), (io::Error, Option<AlertDescription>)> {
        let fatal = |what: String, alert| {
            (
                io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {what}")),
                Some(alert),
            )
        };
        while rx.handshake.len() >= 4 {
            let h = &rx.handshake;
            let len = u32::from_be_bytes([0, h[1], h[2], h[3]]) as usize;
            if len > MAX_HANDSHAKE_MESSAGE {
                return Err(fatal(
                    format!("handshake message of {len} bytes"),
                    AlertDescription::DecodeError,
                ));
            }
            if h.len() < 4 + len {
                return Ok(());
            }
            let typ = h[0];
            let body = h[4..4 + len].to_vec();
            rx.handshake.drain(..4 + len);
            let mut schedule = lock(&self.schedule);
            let schedule = schedule.as_mut().ok_or_else(|| (no_session(), None))?;
            let tls12 = rx.key.is_tls12();
            match (typ, &mut *schedule) {
                // TLS 1.2: a server asking to renegotiate, which a client may ignore.
                (HELLO_REQUEST, KeySchedule::Client(_)) if tls12 && body.is_empty() => {}
                (KEY_UPDATE, _) if !tls12 => {
                    let request = match body[..] {
                        [r @ (0 | 1)] => r == 1,
                        [_] => {
                            return Err(fatal(
                                "key update with an unknown request value".into(),
                                AlertDescription::IllegalParameter,
                            ));
                        }
                        _ => {
                            return Err(fatal(
                                "malformed key update".into(),
                                AlertDescription::DecodeError,
                            ));
                        }
                    };
                    // The new key starts with the next record: nothing may follow in this one.
                    if !rx.handshake.is_empty() {
                        return Err(fatal(
                            "data after a key update in its record".into(),
                            AlertDescription::UnexpectedMessage,
                        ));
                    }
                    let (seq, secrets) = schedule.next_rx().map_err(|e| (tls_error(e), None))?;
                    rx.key = RecordKey::new(seq, secrets, false).map_err(|e| (e, None))?;
                    if request {
                        // Answered before our next record (RFC 8446 §4.6.3), by whichever
                        // writer sends it: the reader never writes to the socket, so it
                        // never waits for the peer to read.
                        self.update_requested.store(true, Ordering::Release);
                    }
                }
                (NEW_SESSION_TICKET, KeySchedule::Client(k)) if !tls12 => {
                    // Kept for resuming later connections; a bad one only costs that.
                    let _ = k.handle_new_session_ticket(&body);
                }
                _ => {
                    return Err(fatal(
                        format!("unexpected handshake message type {typ}"),
                        AlertDescription::UnexpectedMessage,
                    ));
                }
            }
        }
        Ok(())
    }

    /// Updates the send key first if the peer asked for it or the key is near its limit:
    /// a KeyUpdate record under the old key, everything after under the new one.
    fn update_if_due(&self, tx: &mut Tx) -> io::Result<()> {
        if tx.key.is_tls12() {
            // No key updates in TLS 1.2: at the limit (2^24 records for AES-GCM, none for
            // ChaCha20, which the server prefers) the session ends with a close_notify,
            // as rustls ends it.
            if tx.key.seq() >= tx.update_by {
                if tx.key.seal(ALERT, &[&[1, 0]], &mut tx.buf).is_ok() {
                    let _ = self.write_out(tx);
                }
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "TLS 1.2: the session's key has protected all it may: reconnect",
                ));
            }
            return Ok(());
        }
        // Checked before every record: a plain load, the swap only when it is set.
        let requested = self.update_requested.load(Ordering::Acquire)
            && self.update_requested.swap(false, Ordering::AcqRel);
        if !requested && tx.key.seq() < tx.update_by {
            if tx.key.seq() >= tx.update_at {
                self.update_wanted.store(true, Ordering::Release);
            }
            return Ok(());
        }
        self.update_key(tx)
    }

    /// Sends a KeyUpdate under the current key and switches to the next one.
    fn update_key(&self, tx: &mut Tx) -> io::Result<()> {
        self.update_wanted.store(false, Ordering::Release);
        // update_not_requested: our own update does not ask for the peer's.
        tx.key
            .seal(HANDSHAKE, &[&[KEY_UPDATE, 0, 0, 1, 0]], &mut tx.buf)?;
        let mut schedule = lock(&self.schedule);
        let schedule = schedule.as_mut().ok_or_else(no_session)?;
        let (seq, secrets) = schedule.next_tx().map_err(tls_error)?;
        tx.key = RecordKey::new(seq, secrets, false)?;
        Ok(())
    }

    /// A fatal alert for the peer, best effort and only if no writer is sending.
    fn try_send_alert(&self, alert: AlertDescription) {
        if let Ok(mut tx) = self.tx.try_lock()
            && let Some(tx) = tx.as_mut()
        {
            if !tx.failed
                && tx
                    .key
                    .seal(ALERT, &[&[2, u8::from(alert)]], &mut tx.buf)
                    .is_ok()
            {
                let _ = self.write_out(tx);
            }
            tx.buf.clear();
            tx.failed = true;
        }
    }

    /// Whether the send key is due for an update that waits for [`update_key_now`]
    /// (clients only).
    ///
    /// [`update_key_now`]: TlsStream::update_key_now
    pub fn key_update_wanted(&self) -> bool {
        self.update_wanted.load(Ordering::Acquire)
    }

    /// Updates the send key now. An NBD client calls this with no request in flight: a
    /// server built on GnuTLS with threads (nbdkit) mis-numbers a reply it is sending
    /// while another of its threads takes the update, and the connection fails.
    pub fn update_key_now(&self) -> io::Result<()> {
        let mut g = lock(&self.tx);
        let tx = g.as_mut().ok_or_else(no_session)?;
        if tx.failed {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "TLS: the session failed earlier",
            ));
        }
        let r = self.update_key(tx).and_then(|()| self.write_out(tx));
        if r.is_err() {
            tx.buf.clear();
            tx.failed = true;
        }
        r
    }

    /// Writes all of `buf`: through the record layer once TLS is on, straight before.
    pub fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        if !self.is_active() {
            return self.raw.write_all(buf);
        }
        self.write_all2(buf, &[])
    }

    /// `a` then `b`, in shared records (a request header and its payload need not take a
    /// record of their own each).
    pub fn write_all2(&self, a: &[u8], b: &[u8]) -> io::Result<()> {
        let mut g = lock(&self.tx);
        let tx = g.as_mut().ok_or_else(no_session)?;
        if tx.failed {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "TLS: the session failed earlier",
            ));
        }
        let r = self.seal_and_send(tx, a, b);
        if r.is_err() {
            // Records of a message only partly sealed or sent must never follow.
            tx.buf.clear();
            tx.failed = true;
        }
        r
    }

    fn seal_and_send(&self, tx: &mut Tx, mut a: &[u8], mut b: &[u8]) -> io::Result<()> {
        loop {
            self.update_if_due(tx)?;
            let from_a = a.len().min(MAX_PLAINTEXT);
            let from_b = b.len().min(MAX_PLAINTEXT - from_a);
            if from_a + from_b > 0 {
                tx.key
                    .seal(APPLICATION_DATA, &[&a[..from_a], &b[..from_b]], &mut tx.buf)?;
                a = &a[from_a..];
                b = &b[from_b..];
            }
            let done = a.is_empty() && b.is_empty();
            if done || tx.buf.len() + MAX_PLAINTEXT + OVERHEAD > TX_BATCH {
                self.write_out(tx)?;
            }
            if done {
                return Ok(());
            }
        }
    }

    /// Writes the sealed records to the socket and forgets them whatever happens: bytes
    /// once handed to the socket are never sent again (after a failed write the
    /// connection is done; a close_notify may still follow).
    fn write_out(&self, tx: &mut Tx) -> io::Result<()> {
        let r = self.raw.write_all(tx.buf.filled());
        tx.buf.clear();
        r
    }

    /// Ends the session politely (close_notify), best effort, before the socket closes.
    pub fn close(&self) {
        if !self.is_active() {
            return;
        }
        let mut g = lock(&self.tx);
        if let Some(tx) = g.as_mut()
            && !tx.failed
            && tx.key.seal(ALERT, &[&[1, 0]], &mut tx.buf).is_ok()
        {
            let _ = self.write_out(tx);
            tx.failed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    use rustls::{ClientConnection, StreamOwned};

    use super::*;

    /// A server identity for `localhost`, and a rustls client config (TLS `versions`)
    /// trusting it.
    fn identity(
        versions: &[&'static rustls::SupportedProtocolVersion],
        suites: &[rustls::SupportedCipherSuite],
    ) -> (NbdTls, Arc<ClientConfig>) {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (c, k) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        let tls = NbdTls::from_pem_files(&c, &k, None).unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let mut client_provider = rustls::crypto::ring::default_provider();
        if !suites.is_empty() {
            client_provider.cipher_suites = suites.to_vec();
        }
        let config = ClientConfig::builder_with_provider(Arc::new(client_provider))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (tls, Arc::new(config))
    }

    /// Our server on one end of a socket pair, echoing until the peer closes; a rustls
    /// client on the other end.
    fn echo_server(
        versions: &[&'static rustls::SupportedProtocolVersion],
        suites: &[rustls::SupportedCipherSuite],
    ) -> (
        Arc<TlsStream>,
        std::thread::JoinHandle<io::Result<()>>,
        StreamOwned<ClientConnection, UnixStream>,
    ) {
        let (tls, config) = identity(versions, suites);
        let (a, b) = UnixStream::pair().unwrap();
        a.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let server = Arc::new(TlsStream::new(Socket::Unix(b), (&tls).into()));
        let srv = server.clone();
        let echo = std::thread::spawn(move || {
            srv.start(None)?;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = srv.read_some(&mut buf)?;
                if n == 0 {
                    srv.close();
                    return Ok(());
                }
                srv.write_all(&buf[..n])?;
            }
        });
        let conn =
            ClientConnection::new(config, ServerName::try_from("localhost").unwrap()).unwrap();
        (server, echo, StreamOwned::new(conn, a))
    }

    fn echo_round(c: &mut StreamOwned<ClientConnection, UnixStream>, fill: u8) {
        let msg = vec![fill; 40_000];
        c.write_all(&msg).unwrap();
        let mut back = vec![0u8; msg.len()];
        c.read_exact(&mut back).unwrap();
        assert!(back == msg, "echo differs");
    }

    fn tx_seq(s: &TlsStream) -> u64 {
        lock(&s.tx).as_ref().unwrap().key.seq()
    }

    #[test]
    fn a_key_update_the_peer_asks_for_is_answered() {
        let (server, echo, mut c) = echo_server(&[&rustls::version::TLS13], &[]);
        echo_round(&mut c, 1);
        let before = tx_seq(&server);
        assert!(before >= 3, "{before}");
        for round in 2..6 {
            // rustls asks for the server's update along with its own.
            c.conn.refresh_traffic_keys().unwrap();
            echo_round(&mut c, round);
            // 40,000 bytes back are three records under a new key: the server updated
            // its send key (the rustls client could only read them if it did so right).
            assert_eq!(tx_seq(&server), 3, "round {round}");
        }
        c.conn.send_close_notify();
        c.flush().unwrap();
        echo.join().unwrap().unwrap();
        // The server's close_notify ends the client's stream cleanly.
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }

    #[test]
    fn a_tampered_record_fails_the_session_and_the_peer_hears_why() {
        let (_server, echo, mut c) = echo_server(&[&rustls::version::TLS13], &[]);
        echo_round(&mut c, 1);
        // An application-data record that does not decrypt.
        let mut bogus = vec![APPLICATION_DATA, 3, 3, 0, 40];
        bogus.extend_from_slice(&[0x42; 40]);
        c.sock.write_all(&bogus).unwrap();
        let e = echo.join().unwrap().unwrap_err();
        assert!(e.to_string().contains("bad record MAC"), "{e}");
        let mut buf = [0u8; 16];
        let e = c.read(&mut buf).unwrap_err();
        assert!(e.to_string().contains("BadRecordMac"), "{e}");
    }

    #[test]
    fn a_client_speaking_plain_nbd_instead_of_tls_is_refused_at_once() {
        let (tls, _) = identity(&[&rustls::version::TLS13], &[]);
        let (mut a, b) = UnixStream::pair().unwrap();
        let server = TlsStream::new(Socket::Unix(b), (&tls).into());
        // Not a TLS record: "IHAVEOPT" would announce a 0x5645-byte record.
        a.write_all(b"IHAVEOPT\0\0\0\x01\0\0\0\0").unwrap();
        let t0 = Instant::now();
        let e = server
            .start(Some(Instant::now() + Duration::from_secs(30)))
            .unwrap_err();
        assert_ne!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(t0.elapsed() < Duration::from_secs(10), "{e}");
        assert!(e.to_string().contains("TLS"), "{e}");
    }

    #[test]
    fn the_server_picks_aes_gcm_for_tls_1_3_and_chacha20_for_tls_1_2() {
        use rustls::crypto::ring::cipher_suite as cs;
        for (version, want) in [
            (&rustls::version::TLS13, cs::TLS13_AES_256_GCM_SHA384),
            (
                &rustls::version::TLS12,
                cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            ),
        ] {
            // The client offers everything, AES-GCM first.
            let (_server, echo, mut c) = echo_server(&[version], &[]);
            echo_round(&mut c, 1);
            assert_eq!(c.conn.negotiated_cipher_suite(), Some(want));
            c.conn.send_close_notify();
            c.flush().unwrap();
            echo.join().unwrap().unwrap();
        }
    }

    #[test]
    fn tls_1_2_clients_are_served_with_aes_gcm_and_chacha20() {
        use rustls::crypto::ring::cipher_suite as cs;
        for suite in [
            cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ] {
            let (server, echo, mut c) = echo_server(&[&rustls::version::TLS12], &[suite]);
            for round in 1..4 {
                echo_round(&mut c, round);
            }
            assert_eq!(c.conn.negotiated_cipher_suite(), Some(suite));
            assert!(lock(&server.tx).as_ref().unwrap().key.is_tls12());
            c.conn.send_close_notify();
            c.flush().unwrap();
            echo.join().unwrap().unwrap();
            let mut rest = Vec::new();
            c.read_to_end(&mut rest).unwrap();
            assert!(rest.is_empty(), "{suite:?}");
        }
    }

    #[test]
    fn a_peer_hanging_up_without_close_notify_is_an_error_not_an_end() {
        let (_server, echo, mut c) = echo_server(&[&rustls::version::TLS13], &[]);
        echo_round(&mut c, 1);
        c.sock.shutdown(std::net::Shutdown::Both).unwrap();
        let e = echo.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    }
}
