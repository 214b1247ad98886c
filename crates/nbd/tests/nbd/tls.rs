//! NBD over TLS (NBD_OPT_STARTTLS): a scripted rustls client for the protocol rules and the
//! certificate checks, then real clients (nbdinfo and nbdcopy from libnbd, qemu-img); then
//! this crate's client (`nbds://`) against this crate's server, nbdkit and qemu-nbd. All
//! with certificates made here by a throwaway CA.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{Serving, run, tool};
use cryptblk_device::{BlockDevice, MemoryDevice, Storage};
use cryptblk_nbd::proto::*;
use cryptblk_nbd::{NbdServer, NbdTls, TlsMode};
use cryptblk_storage::{NbdClientOptions, NbdStorage, NbdUri};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

const MIB: u64 = 1 << 20;

/// A CA able to sign server and client certificates.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// A leaf certificate and its key (PEM): a server's for localhost and 127.0.0.1, or a
    /// client's.
    fn issue(&self, server: bool) -> (String, String) {
        let names = if server {
            vec!["localhost".to_string()]
        } else {
            Vec::new()
        };
        let mut p = CertificateParams::new(names).unwrap();
        p.distinguished_name.push(
            DnType::CommonName,
            if server { "localhost" } else { "nbd client" },
        );
        if server {
            p.subject_alt_names
                .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        }
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Certificates in a directory laid out as libnbd and qemu expect (ca-cert.pem,
/// client-cert.pem, client-key.pem), plus the server's and a stranger CA's.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("cryptblk test CA");
        let (server_cert, server_key) = ca.issue(true);
        let (client_cert, client_key) = ca.issue(false);
        let other = Ca::new("someone else's CA");
        let (other_cert, other_key) = other.issue(false);
        let files = [
            ("ca-cert.pem", ca.cert.pem()),
            ("server-cert.pem", server_cert),
            ("server-key.pem", server_key),
            ("client-cert.pem", client_cert),
            ("client-key.pem", client_key),
            ("other-ca-cert.pem", other.cert.pem()),
            ("other-client-cert.pem", other_cert),
            ("other-client-key.pem", other_key),
        ];
        for (name, pem) in files {
            std::fs::write(dir.path().join(name), pem).unwrap();
        }
        Pki { dir }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    fn server_tls(&self, verify_clients: bool) -> NbdTls {
        let ca = self.path("ca-cert.pem");
        NbdTls::from_pem_files(
            &self.path("server-cert.pem"),
            &self.path("server-key.pem"),
            verify_clients.then_some(ca.as_path()),
        )
        .unwrap()
    }

    /// A rustls client trusting `ca`, presenting the client certificate `client` if any.
    fn client_config(&self, ca: &str, client: Option<&str>) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(self.path(ca)).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let b = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        Arc::new(match client {
            Some(prefix) => {
                let chain: Vec<_> =
                    CertificateDer::pem_file_iter(self.path(&format!("{prefix}-cert.pem")))
                        .unwrap()
                        .map(Result::unwrap)
                        .collect();
                let key =
                    PrivateKeyDer::from_pem_file(self.path(&format!("{prefix}-key.pem"))).unwrap();
                b.with_client_auth_cert(chain, key).unwrap()
            }
            None => b.with_no_client_auth(),
        })
    }
}

fn server(tls: Option<(NbdTls, TlsMode)>) -> (Arc<MemoryDevice>, Arc<NbdServer>) {
    let dev = Arc::new(MemoryDevice::new(8 * MIB, 512));
    let mut b = NbdServer::builder().export("disk", dev.clone());
    if let Some((t, mode)) = tls {
        b = b.tls(t, mode);
    }
    (dev, Arc::new(b.build().unwrap()))
}

/// Option haggling over any stream (plaintext or TLS).
fn send_opt(s: &mut impl Write, opt: u32, data: &[u8]) {
    let mut b = Vec::new();
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b).unwrap();
    s.flush().unwrap();
}

fn read_n(s: &mut impl Read, n: usize) -> Vec<u8> {
    let mut b = vec![0; n];
    s.read_exact(&mut b).unwrap();
    b
}

/// One option reply: (type, data).
fn opt_reply(s: &mut impl Read, opt: u32) -> (u32, Vec<u8>) {
    let h = read_n(s, 20);
    assert_eq!(
        u64::from_be_bytes(h[0..8].try_into().unwrap()),
        OPT_REPLY_MAGIC
    );
    assert_eq!(u32::from_be_bytes(h[8..12].try_into().unwrap()), opt);
    let typ = u32::from_be_bytes(h[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
    (typ, read_n(s, len))
}

/// NBD_OPT_GO for "disk"; the final reply's type.
fn go(s: &mut (impl Read + Write)) -> u32 {
    let mut d = 4u32.to_be_bytes().to_vec();
    d.extend_from_slice(b"disk");
    d.extend_from_slice(&0u16.to_be_bytes());
    send_opt(s, OPT_GO, &d);
    loop {
        let (typ, _) = opt_reply(s, OPT_GO);
        if typ != REP_INFO {
            return typ;
        }
    }
}

/// A simple-reply request; returns the error and the data read.
fn request(
    s: &mut (impl Read + Write),
    typ: u16,
    offset: u64,
    len: u32,
    payload: &[u8],
) -> (u32, Vec<u8>) {
    let r = Request {
        magic: REQUEST_MAGIC,
        flags: 0,
        typ,
        cookie: 7,
        offset,
        len,
    };
    let mut b = r.encode().to_vec();
    b.extend_from_slice(payload);
    s.write_all(&b).unwrap();
    s.flush().unwrap();
    let h = read_n(s, 16);
    assert_eq!(
        u32::from_be_bytes(h[0..4].try_into().unwrap()),
        SIMPLE_REPLY_MAGIC
    );
    let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
    let data = if typ == CMD_READ && err == 0 {
        read_n(s, len as usize)
    } else {
        Vec::new()
    };
    (err, data)
}

/// A client on a socketpair served by `serve_unix_stream`, greeted, flags sent.
fn connect(srv: &Arc<NbdServer>) -> (UnixStream, std::thread::JoinHandle<()>) {
    let (mut a, b) = UnixStream::pair().unwrap();
    a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let s = srv.clone();
    let t = std::thread::spawn(move || s.serve_unix_stream(b));
    let g = read_n(&mut a, 18);
    assert_eq!(&g[0..16], b"NBDMAGICIHAVEOPT");
    a.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    (a, t)
}

/// STARTTLS, acknowledged, then the TLS handshake as `config`'s client.
fn start_tls(
    mut a: UnixStream,
    config: Arc<rustls::ClientConfig>,
) -> rustls::StreamOwned<rustls::ClientConnection, UnixStream> {
    send_opt(&mut a, OPT_STARTTLS, &[]);
    assert_eq!(opt_reply(&mut a, OPT_STARTTLS).0, REP_ACK);
    let conn =
        rustls::ClientConnection::new(config, ServerName::try_from("localhost").unwrap()).unwrap();
    rustls::StreamOwned::new(conn, a)
}

#[test]
fn required_tls_refuses_plaintext_then_serves_over_tls() {
    let pki = Pki::new();
    let (dev, srv) = server(Some((pki.server_tls(false), TlsMode::Required)));
    let (mut a, t) = connect(&srv);
    // Before TLS: every option but STARTTLS and ABORT is refused, and the server survives.
    send_opt(&mut a, OPT_LIST, &[]);
    let (typ, msg) = opt_reply(&mut a, OPT_LIST);
    assert_eq!(typ, REP_ERR_TLS_REQD, "{}", String::from_utf8_lossy(&msg));
    assert_eq!(go(&mut a), REP_ERR_TLS_REQD);
    let mut s = start_tls(a, pki.client_config("ca-cert.pem", None));
    // STARTTLS again, inside TLS: invalid.
    send_opt(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(opt_reply(&mut s, OPT_STARTTLS).0, REP_ERR_INVALID);
    assert_eq!(go(&mut s), REP_ACK);
    let data: Vec<u8> = (0..256 * 1024u32)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    assert_eq!(
        request(&mut s, CMD_WRITE, 4096, data.len() as u32, &data).0,
        0
    );
    let (err, back) = request(&mut s, CMD_READ, 4096, data.len() as u32, &[]);
    assert_eq!(err, 0);
    assert!(
        back == data,
        "data read over TLS differs from what was written"
    );
    let mut on_dev = vec![0u8; data.len()];
    dev.read_at(&mut on_dev, 4096).unwrap();
    assert!(
        on_dev == data,
        "the device did not get the data written over TLS"
    );
    // Disconnect; the server side ends.
    let r = Request {
        magic: REQUEST_MAGIC,
        flags: 0,
        typ: CMD_DISC,
        cookie: 1,
        offset: 0,
        len: 0,
    };
    s.write_all(&r.encode()).unwrap();
    s.flush().unwrap();
    t.join().unwrap();
    assert_eq!(srv.stats().protocol_errors, 0);
}

#[test]
fn export_name_without_tls_is_hung_up_on() {
    let pki = Pki::new();
    let (_, srv) = server(Some((pki.server_tls(false), TlsMode::Required)));
    let (mut a, t) = connect(&srv);
    send_opt(&mut a, OPT_EXPORT_NAME, b"disk");
    let mut b = [0u8; 16];
    assert_eq!(
        a.read(&mut b).unwrap(),
        0,
        "the server must hang up, not serve"
    );
    t.join().unwrap();
}

#[test]
fn optional_tls_serves_plaintext_and_tls_clients() {
    let pki = Pki::new();
    let (_, srv) = server(Some((pki.server_tls(false), TlsMode::Optional)));
    let (mut a, t) = connect(&srv);
    assert_eq!(go(&mut a), REP_ACK);
    assert_eq!(request(&mut a, CMD_READ, 0, 4096, &[]).0, 0);
    drop(a);
    t.join().unwrap();
    let (a, t) = connect(&srv);
    let mut s = start_tls(a, pki.client_config("ca-cert.pem", None));
    assert_eq!(go(&mut s), REP_ACK);
    assert_eq!(request(&mut s, CMD_READ, 0, 4096, &[]).0, 0);
    drop(s);
    t.join().unwrap();
}

#[test]
fn starttls_without_tls_configured_is_unsupported() {
    let (_, srv) = server(None);
    let (mut a, t) = connect(&srv);
    send_opt(&mut a, OPT_STARTTLS, &[]);
    assert_eq!(opt_reply(&mut a, OPT_STARTTLS).0, REP_ERR_UNSUP);
    assert_eq!(go(&mut a), REP_ACK);
    drop(a);
    t.join().unwrap();
}

/// The TLS handshake as the given client; true when it completes and the server answers.
fn tls_works(pki: &Pki, srv: &Arc<NbdServer>, ca: &str, client: Option<&str>) -> bool {
    let (a, t) = connect(srv);
    let mut s = start_tls(a, pki.client_config(ca, client));
    let mut d = 4u32.to_be_bytes().to_vec();
    d.extend_from_slice(b"disk");
    d.extend_from_slice(&0u16.to_be_bytes());
    let mut b = Vec::new();
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&OPT_GO.to_be_bytes());
    b.extend_from_slice(&(d.len() as u32).to_be_bytes());
    b.extend_from_slice(&d);
    let mut reply = [0u8; 20];
    let ok = s.write_all(&b).is_ok() && s.flush().is_ok() && s.read_exact(&mut reply).is_ok();
    drop(s);
    t.join().unwrap();
    ok
}

#[test]
fn client_certificates_are_checked_against_the_ca() {
    let pki = Pki::new();
    let (_, srv) = server(Some((pki.server_tls(true), TlsMode::Required)));
    assert!(tls_works(&pki, &srv, "ca-cert.pem", Some("client")));
    let errors = srv.stats().protocol_errors;
    assert!(
        !tls_works(&pki, &srv, "ca-cert.pem", None),
        "a client without a certificate got in"
    );
    assert!(
        !tls_works(&pki, &srv, "ca-cert.pem", Some("other-client")),
        "a client certificate from another CA got in"
    );
    assert_eq!(srv.stats().protocol_errors, errors + 2);
}

#[test]
fn a_client_trusting_another_ca_refuses_the_server() {
    let pki = Pki::new();
    let (_, srv) = server(Some((pki.server_tls(false), TlsMode::Required)));
    assert!(!tls_works(&pki, &srv, "other-ca-cert.pem", None));
}

#[test]
fn bad_certificate_files_are_clear_errors() {
    let pki = Pki::new();
    let e = NbdTls::from_pem_files(&pki.path("ca-cert.pem"), &pki.path("ca-cert.pem"), None)
        .unwrap_err();
    assert!(e.to_string().contains("ca-cert.pem"), "{e}");
    let e = NbdTls::from_pem_files(
        &pki.path("server-cert.pem"),
        &pki.path("client-key.pem"),
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("certificate and key"), "{e}");
    let e = NbdTls::from_pem_files(&pki.path("missing.pem"), &pki.path("server-key.pem"), None)
        .unwrap_err();
    assert!(e.to_string().contains("missing.pem"), "{e}");
}

/// A non-loopback listener serves only clients that are identified: TLS required with
/// client certificates. TLS without them encrypts the wire but lets anyone in.
#[test]
fn non_loopback_tcp_needs_tls_required_with_client_certificates() {
    let pki = Pki::new();
    for (tls, allowed) in [
        (None, false),
        (Some((pki.server_tls(false), TlsMode::Optional)), false),
        (Some((pki.server_tls(true), TlsMode::Optional)), false),
        (Some((pki.server_tls(false), TlsMode::Required)), false),
        (Some((pki.server_tls(true), TlsMode::Required)), true),
    ] {
        let (_, srv) = server(tls);
        let l = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        if allowed {
            let h = srv.shutdown_handle();
            h.shutdown();
            srv.serve_tcp_listener(l).unwrap();
        } else {
            let e = srv.serve_tcp_listener(l).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        }
    }
}

/// A server with TLS required on a unix socket, its certificates, and a 16 MiB export.
fn serving(verify_clients: bool) -> (Pki, Serving) {
    let pki = Pki::new();
    let dev = Arc::new(MemoryDevice::new(16 * MIB, 512));
    let srv = NbdServer::builder()
        .export("disk", dev)
        .tls(pki.server_tls(verify_clients), TlsMode::Required)
        .build()
        .unwrap();
    (pki, Serving::start(srv))
}

fn tls_uri(pki: &Pki, s: &Serving) -> String {
    format!(
        "nbds+unix:///disk?socket={}&tls-certificates={}",
        s.path.display(),
        pki.dir.path().display()
    )
}

/// nbdcopy writes `data` to `uri` and reads it back: the same bytes.
fn nbdcopy_round_trip(uri: &str, data: &[u8]) {
    let nbdcopy = tool("nbdcopy", "libnbd-bin");
    let dir = tempfile::tempdir().unwrap();
    let (src, back) = (dir.path().join("src"), dir.path().join("back"));
    std::fs::write(&src, data).unwrap();
    run(Command::new(&nbdcopy).args([src.to_str().unwrap(), uri]));
    run(Command::new(&nbdcopy).args([uri, back.to_str().unwrap()]));
    assert!(
        std::fs::read(&back).unwrap() == data,
        "nbdcopy's round trip over TLS differs"
    );
}

#[test]
fn nbdinfo_and_nbdcopy_over_tls_with_a_client_certificate() {
    let nbdinfo = tool("nbdinfo", "libnbd-bin");
    let (pki, s) = serving(true);
    let out = run(Command::new(&nbdinfo).args(["--json", &tls_uri(&pki, &s)]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["exports"][0]["export-size"], 16 * MIB);
    // Plain nbd+unix against TLS required: refused.
    let plain = format!("nbd+unix:///disk?socket={}", s.path.display());
    let out = Command::new(&nbdinfo).arg(&plain).output().unwrap();
    assert!(!out.status.success(), "a plaintext client was served");
    // Data in and out through TLS.
    let data: Vec<u8> = (0..16 * MIB as usize)
        .map(|i| (i * 131 / 4096) as u8)
        .collect();
    nbdcopy_round_trip(&tls_uri(&pki, &s), &data);
    let h = s.stop();
    assert_eq!(h.stats().connections_active, 0);
}

#[test]
fn qemu_img_over_tls_and_refused_without_the_ca() {
    let qemu_img = tool("qemu-img", "qemu-utils");
    let (pki, s) = serving(true);
    let opts = |dir: &Path| {
        vec![
            "--object".to_string(),
            format!(
                "tls-creds-x509,id=tls0,endpoint=client,dir={}",
                dir.display()
            ),
            "--image-opts".to_string(),
            format!(
                "driver=nbd,server.type=unix,server.path={},export=disk,tls-creds=tls0,tls-hostname=localhost",
                s.path.display()
            ),
        ]
    };
    let mut args = vec!["info".to_string(), "--output=json".to_string()];
    args.extend(opts(pki.dir.path()));
    let out = run(Command::new(&qemu_img).args(&args));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["virtual-size"], 16 * MIB);
    // A directory whose CA did not sign the server (nor the client certificate): refused.
    let wrong = tempfile::tempdir().unwrap();
    for (from, to) in [
        ("other-ca-cert.pem", "ca-cert.pem"),
        ("other-client-cert.pem", "client-cert.pem"),
        ("other-client-key.pem", "client-key.pem"),
    ] {
        std::fs::copy(pki.path(from), wrong.path().join(to)).unwrap();
    }
    let mut args = vec!["info".to_string()];
    args.extend(opts(wrong.path()));
    let out = Command::new(&qemu_img).args(&args).output().unwrap();
    assert!(!out.status.success(), "qemu-img got in with the wrong CA");
    s.stop();
}

/// A GnuTLS client held to TLS 1.2, as the kernel's nbd-client is (its default priority
/// has no TLS 1.3): qemu-img with `priority=NORMAL:-VERS-ALL:+VERS-TLS1.2` writes 4 MiB
/// through the server's TLS 1.2 record layer and reads them back.
#[test]
fn a_tls_1_2_only_gnutls_client_writes_and_reads_back() {
    let qemu_img = tool("qemu-img", "qemu-utils");
    let (pki, s) = serving(true);
    let object = format!(
        "tls-creds-x509,id=tls0,endpoint=client,dir={},priority=NORMAL:-VERS-ALL:+VERS-TLS1.2",
        pki.dir.path().display()
    );
    let target = format!(
        "driver=nbd,server.type=unix,server.path={},export=disk,tls-creds=tls0,tls-hostname=localhost",
        s.path.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let (src, back) = (dir.path().join("src"), dir.path().join("back"));
    let data: Vec<u8> = (0..4 * MIB as usize)
        .map(|i| (i.wrapping_mul(40_503) >> 7) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    run(Command::new(&qemu_img)
        .args(["convert", "-n", "-f", "raw", "--object", &object])
        .arg(&src)
        .args(["--target-image-opts", &target]));
    run(Command::new(&qemu_img)
        .args(["convert", "--object", &object, "--image-opts", &target])
        .args(["-O", "raw"])
        .arg(&back));
    let got = std::fs::read(&back).unwrap();
    assert!(
        got[..data.len()] == data[..],
        "TLS 1.2 round trip through qemu-img differs"
    );
    s.stop();
}

// ---- cryptblk as the TLS client (nbds://, nbds+unix://) ----

fn client_uri(sock: &Path, certs: &Path) -> NbdUri {
    NbdUri::parse(&format!(
        "nbds+unix:///disk?socket={}&tls-certificates={}",
        sock.display(),
        certs.display()
    ))
    .unwrap()
}

/// A certificate directory holding `files` of the Pki, under their libnbd names.
fn cert_dir(pki: &Pki, files: &[(&str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (from, to) in files {
        std::fs::copy(pki.path(from), d.path().join(to)).unwrap();
    }
    d
}

/// Writes, reads back from 4 threads at once, and compares.
fn round_trip(st: &Arc<NbdStorage>) {
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let st = st.clone();
            std::thread::spawn(move || {
                for i in 0..16u64 {
                    let len = [512usize, 4096, 65536, 200_000][(i % 4) as usize] & !511;
                    let off = (u64::from(t) * 16 + i) * 256 * 1024;
                    let data: Vec<u8> = (0..len).map(|j| (j as u8) ^ t ^ (i as u8)).collect();
                    st.write_at(&data, off).unwrap();
                    let mut back = vec![0u8; len];
                    st.read_at(&mut back, off).unwrap();
                    assert!(back == data, "thread {t} request {i}: read back differs");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    st.sync().unwrap();
}

fn connect_err(uri: &NbdUri) -> std::io::Error {
    NbdStorage::connect(uri, NbdClientOptions::default())
        .err()
        .expect("connected where it must not")
}

#[test]
fn our_client_over_tls_to_our_server_and_refusals() {
    let (pki, s) = serving(true);
    let st = Arc::new(
        NbdStorage::connect(
            &client_uri(&s.path, pki.dir.path()),
            NbdClientOptions::default(),
        )
        .unwrap(),
    );
    assert_eq!(st.size().unwrap(), 16 * MIB);
    round_trip(&st);
    drop(st);
    // Plaintext against TLS required: the error says to use TLS.
    let plain = NbdUri::parse(&format!("nbd+unix:///disk?socket={}", s.path.display())).unwrap();
    let e = connect_err(&plain);
    assert!(e.to_string().contains("requires TLS"), "{e}");
    // No client certificate, but the server checks them.
    let d = cert_dir(&pki, &[("ca-cert.pem", "ca-cert.pem")]);
    let e = connect_err(&client_uri(&s.path, d.path()));
    assert!(e.to_string().contains("TLS"), "{e}");
    // A CA that did not sign the server's certificate.
    let d = cert_dir(
        &pki,
        &[
            ("other-ca-cert.pem", "ca-cert.pem"),
            ("client-cert.pem", "client-cert.pem"),
            ("client-key.pem", "client-key.pem"),
        ],
    );
    let e = connect_err(&client_uri(&s.path, d.path()));
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
    // The right CA, but the server's certificate does not name this host.
    let mut u = client_uri(&s.path, pki.dir.path());
    u.tls.as_mut().unwrap().hostname = Some("elsewhere.example".into());
    let e = connect_err(&u);
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
    // A certificate directory without the CA file: a clear error naming it.
    let empty = tempfile::tempdir().unwrap();
    let e = connect_err(&client_uri(&s.path, empty.path()));
    assert!(e.to_string().contains("ca-cert.pem"), "{e}");
    let h = s.stop();
    assert_eq!(h.stats().connections_active, 0);
}

#[test]
fn nbds_to_a_server_without_tls_is_refused() {
    let dev = Arc::new(MemoryDevice::new(MIB, 512));
    let s = Serving::start(NbdServer::builder().export("disk", dev).build().unwrap());
    let pki = Pki::new();
    let e = connect_err(&client_uri(&s.path, pki.dir.path()));
    assert!(e.to_string().contains("does not offer TLS"), "{e}");
    s.stop();
}

/// A sparse file for an external server.
fn backing(dir: &Path) -> std::path::PathBuf {
    let f = dir.join("remote.img");
    std::fs::File::create(&f)
        .unwrap()
        .set_len(16 * MIB)
        .unwrap();
    f
}

/// What the client wrote is in the server's file.
fn round_trip_into(st: Arc<NbdStorage>, file: &Path) {
    let data: Vec<u8> = (0..MIB as usize).map(|i| (i / 512) as u8 ^ 0x5a).collect();
    st.write_at(&data, 3 * MIB).unwrap();
    st.sync().unwrap();
    round_trip(&st);
    st.write_at(&data, 3 * MIB).unwrap();
    st.sync().unwrap();
    drop(st);
    let f = std::fs::read(file).unwrap();
    assert!(
        f[3 * MIB as usize..4 * MIB as usize] == data[..],
        "the server's file lacks what went over TLS"
    );
}

/// nbdkit serving `file` on `sock` with TLS required, the Pki's certificates, and client
/// certificates checked if `verify_peer`.
fn nbdkit_tls(pki: &Pki, file: &Path, sock: &Path, verify_peer: bool) -> crate::common::External {
    let mut args = vec![
        "--tls=require".to_string(),
        format!("--tls-certificates={}", pki.dir.path().display()),
    ];
    if verify_peer {
        args.push("--tls-verify-peer".into());
    }
    crate::common::nbdkit_with(file, sock, &args)
}

#[test]
fn our_client_over_tls_to_nbdkit_with_a_client_certificate() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let file = backing(dir.path());
    let sock = dir.path().join("k.sock");
    let _k = nbdkit_tls(&pki, &file, &sock, true);
    let st = NbdStorage::connect(
        &client_uri(&sock, pki.dir.path()),
        NbdClientOptions::default(),
    )
    .unwrap();
    round_trip_into(Arc::new(st), &file);
    // nbdkit checks client certificates here: without one, refused.
    let d = cert_dir(&pki, &[("ca-cert.pem", "ca-cert.pem")]);
    connect_err(&client_uri(&sock, d.path()));
}

#[test]
fn our_client_over_tls_to_qemu_nbd_on_tcp() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let file = backing(dir.path());
    // qemu-nbd on TCP 127.0.0.1 (the server certificate's IP address), checking clients.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = Command::new(crate::common::tool("qemu-nbd", "qemu-utils"));
    cmd.args([
        "--format",
        "raw",
        "--persistent",
        "--shared",
        "4",
        "--bind",
        "127.0.0.1",
    ])
    .args(["--port", &port.to_string(), "--export-name", "disk"])
    .arg("--object")
    .arg(format!(
        "tls-creds-x509,id=tls0,endpoint=server,verify-peer=on,dir={}",
        pki.dir.path().display()
    ))
    .args(["--tls-creds", "tls0"])
    .arg(&file)
    .stdout(std::process::Stdio::null());
    let _q = crate::common::External {
        child: cmd.spawn().unwrap(),
    };
    let uri = NbdUri::parse(&format!(
        "nbds://127.0.0.1:{port}/disk?tls-certificates={}",
        pki.dir.path().display()
    ))
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let st = loop {
        match NbdStorage::connect(&uri, NbdClientOptions::default()) {
            Ok(st) => break st,
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("{uri}: {e}"),
        }
    };
    round_trip_into(Arc::new(st), &file);
}

/// A server with TLS required whose send key is updated every `records` records.
fn serving_with_key_updates(pki: &Pki, records: u64) -> Serving {
    let dev = Arc::new(MemoryDevice::new(16 * MIB, 512));
    let srv = NbdServer::builder()
        .export("disk", dev)
        .tls(
            pki.server_tls(false).with_key_update_after(records),
            TlsMode::Required,
        )
        .build()
        .unwrap();
    Serving::start(srv)
}

/// Key updates (TLS 1.3 KeyUpdate) each end on its own, with GnuTLS at the other end
/// (nbdcopy as the client, nbdkit as the server) and with this crate at both: what goes
/// through comes back the same, so each side switched keys exactly where the other did.
/// (GnuTLS refuses more than 8 key updates a second, as flooding; toward it the interval
/// is a few hundred records.)
#[test]
fn key_updates_both_ways() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    // 16 MiB each way with nbdcopy: a thousand records read, a key update every 300.
    let s = serving_with_key_updates(&pki, 300);
    let data: Vec<u8> = (0..16 * MIB as usize)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    nbdcopy_round_trip(&tls_uri(&pki, &s), &data);
    s.stop();
    // This crate at both ends, the server updating every third record, the client every
    // other one.
    let s = serving_with_key_updates(&pki, 3);
    let mut uri = client_uri(&s.path, pki.dir.path());
    uri.tls.as_mut().unwrap().key_update_after = Some(2);
    let st = Arc::new(NbdStorage::connect(&uri, NbdClientOptions::default()).unwrap());
    round_trip(&st);
    drop(st);
    s.stop();
    // nbdkit (GnuTLS) as the server, receiving this client's key updates, from 4 threads
    // on 4 connections. GnuTLS takes a KeyUpdate by duplicating its read epoch: a reply
    // another of nbdkit's threads is sending at that moment gets the wrong record number
    // and fails to open here ("bad record MAC", about one run in 30). So the client sends
    // its update with no request in flight on the connection.
    let file = backing(dir.path());
    let sock = dir.path().join("k.sock");
    let _k = nbdkit_tls(&pki, &file, &sock, false);
    let mut uri = client_uri(&sock, pki.dir.path());
    uri.tls.as_mut().unwrap().key_update_after = Some(100);
    let st = NbdStorage::connect(&uri, NbdClientOptions::default()).unwrap();
    round_trip_into(Arc::new(st), &file);
}

#[test]
fn big_reads_and_writes_at_once_over_tls_do_not_deadlock() {
    // Both directions full at once: 8 threads with 1 MiB requests, half writing while the
    // others read, far more than the socket buffers hold each way. Two TLS ends that held
    // their session lock while blocked in send deadlocked here.
    let (pki, s) = serving(false);
    let st = Arc::new(
        NbdStorage::connect(
            &client_uri(&s.path, pki.dir.path()),
            NbdClientOptions::default(),
        )
        .unwrap(),
    );
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let workers: Vec<_> = (0..8u8)
        .map(|t| {
            let (st, done_tx) = (st.clone(), done_tx.clone());
            std::thread::spawn(move || {
                let off = u64::from(t) * 2 * MIB;
                let data = vec![t.wrapping_mul(37) ^ 0x5c; MIB as usize];
                let mut back = vec![0u8; MIB as usize];
                for i in 0..12 {
                    if (i + u32::from(t)) % 2 == 0 {
                        st.write_at(&data, off).unwrap();
                    } else {
                        st.read_at(&mut back, off + MIB).unwrap();
                    }
                }
                st.read_at(&mut back, off).unwrap();
                assert!(back == data, "thread {t}: read back differs");
                done_tx.send(()).unwrap();
            })
        })
        .collect();
    for _ in 0..8 {
        done_rx
            .recv_timeout(Duration::from_secs(120))
            .expect("TLS client and server deadlocked (no progress in 120 s)");
    }
    for w in workers {
        w.join().unwrap();
    }
    drop(st);
    s.stop();
}
