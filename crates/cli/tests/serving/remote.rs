//! A volume whose ciphertext lives on an NBD export elsewhere (`nbd+unix://`,
//! `nbd://HOST:PORT`): qemu-nbd and nbdkit serve a plain file, cryptblk formats it, opens
//! it and serves the plaintext over its own NBD frontend; fio verifies through the whole
//! stack, and the remote file is a LUKS volume that cryptsetup and a local cryptblk open.
//! The same over TLS (`nbds://`) with another cryptblk as the remote server, checking
//! client certificates. Also the bad inputs: nothing listening, an unknown export, a
//! read-only export, the wrong CA.

use crate::common::{bin, free_port, make_pki, ok, run_in, serve_nbd_unix, tool};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

fn run(args: &[&str]) -> Output {
    run_in(bin(), args, b"")
}

/// A remote NBD server process, killed when dropped.
struct Remote {
    child: Child,
    uri: String,
}

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until the remote server accepts connections on `sock` (its file exists a moment
/// before it listens: a connection in between is refused).
fn wait_for(sock: &Path, child: &mut Child) {
    let t0 = std::time::Instant::now();
    while std::os::unix::net::UnixStream::connect(sock).is_err() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the remote server exited"
        );
        assert!(
            t0.elapsed().as_secs() < 30,
            "the remote server did not come up"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn qemu_nbd(file: &Path, sock: &Path, extra: &[&str]) -> Remote {
    let mut child = Command::new(tool("qemu-nbd", "qemu-utils"))
        .args(["--format", "raw", "--persistent", "--shared", "8"])
        .args(extra)
        .arg("--socket")
        .arg(sock)
        .arg(file)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    wait_for(sock, &mut child);
    let export = extra
        .iter()
        .position(|a| *a == "--export-name")
        .map_or("", |i| extra[i + 1]);
    Remote {
        child,
        uri: format!("nbd+unix:///{export}?socket={}", sock.display()),
    }
}

fn nbdkit(file: &Path, sock: &Path) -> Remote {
    let mut child = Command::new(tool("nbdkit", "nbdkit"))
        .args(["--foreground", "--exit-with-parent", "--unix"])
        .arg(sock)
        .arg("file")
        .arg(format!("file={}", file.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    wait_for(sock, &mut child);
    Remote {
        child,
        uri: format!("nbd+unix:///?socket={}", sock.display()),
    }
}

/// A TCP nbdkit on a free loopback port (`nbd://127.0.0.1:PORT/`).
fn nbdkit_tcp(file: &Path) -> Remote {
    for _ in 0..20 {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut child = Command::new(tool("nbdkit", "nbdkit"))
            .args([
                "--foreground",
                "--exit-with-parent",
                "-i",
                "127.0.0.1",
                "-p",
            ])
            .arg(port.to_string())
            .arg("file")
            .arg(format!("file={}", file.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        while t0.elapsed().as_secs() < 10 {
            if child.try_wait().unwrap().is_some() {
                break; // the port was taken meanwhile: another one
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Remote {
                    child,
                    uri: format!("nbd://127.0.0.1:{port}/"),
                };
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("nbdkit did not come up on any loopback port");
}

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let s = Setup {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::write(s.p("pw"), b"remote passphrase").unwrap();
        std::fs::File::create(s.p("remote.img"))
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        s
    }
    fn p(&self, f: &str) -> String {
        self.dir.path().join(f).to_str().unwrap().to_string()
    }
    fn path(&self, f: &str) -> PathBuf {
        self.dir.path().join(f)
    }
    /// `cryptblk open URI vol` with the key file and the run directory, and `args`,
    /// served on the unix socket `sock`.
    fn serve(&self, uri: &str, sock: &Path, args: &[&str]) -> Child {
        let (pw, run) = (self.p("pw"), self.p("run"));
        let mut a = vec!["open", uri, "vol", "--key-file", &pw, "--run-dir", &run];
        a.extend(args);
        serve_nbd_unix(&a, sock, b"")
    }
    fn format(&self, device: &str) {
        ok(&run(&[
            "format",
            "-q",
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            &self.p("pw"),
            device,
        ]));
    }
}

/// Writes the raw file `src` over the start of the NBD export `uri` (qemu-img convert).
fn qemu_img_write(src: &str, uri: &str) {
    ok(&run_in(
        &tool("qemu-img", "qemu-utils"),
        &["convert", "-n", "-f", "raw", "-O", "raw", src, uri],
        b"",
    ));
}

/// fio writes and verifies (crc32c) through cryptblk's NBD frontend, whose volume lives on
/// the remote export; then the remote file itself is checked: a LUKS2 volume cryptsetup
/// reads, whose plaintext (exported by a local cryptblk) is what was written through the
/// stack, and whose stored bytes are not that plaintext.
fn through_the_stack(s: &Setup, remote: Remote) {
    s.format(&remote.uri);
    let dump = ok(&crate::common::cryptsetup(
        &tool("cryptsetup", "cryptsetup-bin"),
        // A cryptblk remote holds the image's lock while it serves it; a dump needs none.
        &["luksDump", "--disable-locks", &s.p("remote.img")],
    ));
    assert!(dump.contains("Version:       \t2"), "{dump}");
    let sock = s.path("front.sock");
    let mut server = s.serve(&remote.uri, &sock, &[]);
    let front = format!("nbd+unix:///vol?socket={}", sock.display());
    crate::common::fio_verify(
        s.dir.path(),
        &front,
        &[
            ("randrw", "4k", "32"),
            ("write", "1m", "4"),
            ("randwrite", "64k", "8"),
        ],
    );
    // Known data through the stack, read back by nbdcopy.
    let data: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    std::fs::write(s.p("src.raw"), &data).unwrap();
    qemu_img_write(&s.p("src.raw"), &front);
    let _ = server.kill();
    let _ = server.wait();
    drop(remote);
    // The remote file, opened locally: the same plaintext; its bytes are ciphertext.
    ok(&run(&[
        "export",
        &s.p("remote.img"),
        &s.p("plain.out"),
        "--key-file",
        &s.p("pw"),
    ]));
    let plain = std::fs::read(s.p("plain.out")).unwrap();
    assert!(
        plain[..data.len()] == data[..],
        "the remote holds other plaintext"
    );
    let raw = std::fs::read(s.p("remote.img")).unwrap();
    assert!(
        !raw.windows(4096).step_by(4096).any(|w| data[..4096] == *w),
        "plaintext reached the remote storage"
    );
}

#[test]
fn volume_on_qemu_nbd_export() {
    let s = Setup::new();
    let remote = qemu_nbd(&s.path("remote.img"), &s.path("q.sock"), &[]);
    through_the_stack(&s, remote);
}

#[test]
fn volume_on_nbdkit_export_over_tcp() {
    let s = Setup::new();
    let remote = nbdkit_tcp(&s.path("remote.img"));
    through_the_stack(&s, remote);
}

/// Another cryptblk serving the raw file (cipher_null: the bytes as they are) over TCP with
/// TLS required and client certificates checked, as `nbds://127.0.0.1:PORT/raw`.
fn cryptblk_tls_remote(s: &Setup, pki: &Path) -> Remote {
    std::fs::write(s.p("null.key"), [0u8; 32]).unwrap();
    let port = free_port();
    let pem = |f: &str| pki.join(f).to_str().unwrap().to_string();
    let mut child = Command::new(bin())
        .args(["open", &s.p("remote.img"), "raw", "--type", "plain"])
        .args(["--cipher", "cipher_null-ecb", "--key-size", "256"])
        .args([
            "--key-file",
            &s.p("null.key"),
            "--run-dir",
            &s.p("remote-run"),
        ])
        .args([
            "--nbd",
            &format!("tcp:127.0.0.1:{port}"),
            "--tls",
            "required",
        ])
        .args([
            "--tls-cert",
            &pem("server-cert.pem"),
            "--tls-key",
            &pem("server-key.pem"),
        ])
        .args(["--tls-ca", &pem("ca-cert.pem")])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap())).is_err() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the remote cryptblk exited"
        );
        assert!(
            t0.elapsed().as_secs() < 30,
            "the remote cryptblk did not come up"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Remote {
        child,
        uri: format!(
            "nbds://127.0.0.1:{port}/raw?tls-certificates={}",
            pki.display()
        ),
    }
}

#[test]
fn volume_on_another_cryptblk_over_tls() {
    let s = Setup::new();
    let pki = s.path("pki");
    std::fs::create_dir(&pki).unwrap();
    make_pki(&pki);
    let remote = cryptblk_tls_remote(&s, &pki);
    // Bad input first: the wrong CA, no client certificate, plaintext. Exit 4, and the
    // error says what is wrong.
    let other = s.path("other-pki");
    std::fs::create_dir(&other).unwrap();
    make_pki(&other);
    let wrong_ca = s.path("wrong-ca");
    std::fs::create_dir(&wrong_ca).unwrap();
    for f in ["client-cert.pem", "client-key.pem"] {
        std::fs::copy(pki.join(f), wrong_ca.join(f)).unwrap();
    }
    std::fs::copy(other.join("ca-cert.pem"), wrong_ca.join("ca-cert.pem")).unwrap();
    let no_cert = s.path("no-cert");
    std::fs::create_dir(&no_cert).unwrap();
    std::fs::copy(pki.join("ca-cert.pem"), no_cert.join("ca-cert.pem")).unwrap();
    let port_uri = remote.uri.split('?').next().unwrap().to_string();
    for (uri, says) in [
        (
            format!("{port_uri}?tls-certificates={}", wrong_ca.display()),
            "certificate",
        ),
        (
            format!("{port_uri}?tls-certificates={}", no_cert.display()),
            "TLS",
        ),
        (port_uri.replacen("nbds://", "nbd://", 1), "requires TLS"),
    ] {
        let o = run(&["dump", &uri]);
        assert_eq!(o.status.code(), Some(4), "{uri}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{uri}: {err}");
    }
    through_the_stack(&s, remote);
}

#[test]
fn cryptsetup_volume_on_nbdkit_export_opens_and_dumps() {
    // The other way: cryptsetup formats the file, cryptblk reads it through the export.
    let s = Setup::new();
    let cs = tool("cryptsetup", "cryptsetup-bin");
    ok(&crate::common::cryptsetup(
        &cs,
        &[
            "luksFormat",
            "-q",
            "--type",
            "luks1",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            &s.p("pw"),
            &s.p("remote.img"),
        ],
    ));
    let remote = nbdkit(&s.path("remote.img"), &s.path("k.sock"));
    let ours = ok(&run(&["dump", &remote.uri]));
    let theirs = ok(&crate::common::cryptsetup(
        &cs,
        &["luksDump", &s.p("remote.img")],
    ));
    // cryptsetup names the device in its dump; everything else is the same.
    let strip = |t: &str| {
        t.lines()
            .filter(|l| !l.starts_with("LUKS header information"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip(&ours), strip(&theirs));
    ok(&run(&[
        "test-passphrase",
        &remote.uri,
        "--key-file",
        &s.p("pw"),
    ]));
    // A keyslot added through the export is one cryptsetup accepts.
    std::fs::write(s.p("pw2"), b"second passphrase").unwrap();
    ok(&run(&[
        "add-key",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        &s.p("pw"),
        &remote.uri,
        &s.p("pw2"),
    ]));
    ok(&crate::common::cryptsetup(
        &cs,
        &[
            "open",
            "--test-passphrase",
            "--key-file",
            &s.p("pw2"),
            &s.p("remote.img"),
        ],
    ));
}

#[test]
fn unreachable_or_unknown_exports_are_clear_errors() {
    let s = Setup::new();
    // Nothing listening: exit 4 (no such device), naming the URI.
    let uri = format!("nbd+unix:///?socket={}", s.p("none.sock"));
    let o = run(&["dump", &uri]);
    assert_eq!(o.status.code(), Some(4), "{o:?}");
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains(&uri), "{e}");
    // An export the server does not have: exit 4 as well.
    let remote = qemu_nbd(
        &s.path("remote.img"),
        &s.path("q.sock"),
        &["--export-name", "disk"],
    );
    let wrong = format!("nbd+unix:///other?socket={}", s.p("q.sock"));
    let o = run(&[
        "open",
        &wrong,
        "v",
        "--key-file",
        &s.p("pw"),
        "--nbd",
        &format!("unix:{}", s.p("f.sock")),
    ]);
    assert_eq!(o.status.code(), Some(4), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no such export"),
        "{o:?}"
    );
    drop(remote);
    // A read-only export refuses format, with the reason.
    let ro = qemu_nbd(&s.path("remote.img"), &s.path("r.sock"), &["--read-only"]);
    let o = run(&["format", "-q", "--key-file", &s.p("pw"), &ro.uri]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("read-only"),
        "{o:?}"
    );
    // A malformed URI is a usage error, never a file name.
    let o = run(&["dump", "nbd://"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not a usable NBD URI"),
        "{o:?}"
    );
    // Engines are for local files.
    let kit = nbdkit(&s.path("remote.img"), &s.path("k2.sock"));
    s.format(&kit.uri);
    let o = run(&[
        "open",
        &kit.uri,
        "v",
        "--key-file",
        &s.p("pw"),
        "--io-engine",
        "io_uring",
        "--nbd",
        &format!("unix:{}", s.p("g.sock")),
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("local files only"),
        "{o:?}"
    );
}

/// Sends `sig` (`STOP`, `CONT`) to `pid` with kill(1).
fn signal(pid: u32, sig: &str) {
    let o = run_in("kill", &[&format!("-{sig}"), &pid.to_string()], b"");
    ok(&o);
}

/// A remote that stops answering (SIGSTOP: its connections stay open, no reply comes)
/// must not keep the server from exiting: the last flush waits for the remote forever,
/// so after `--close-timeout` the server says why and exits with code 4, its pid file and
/// control socket gone, and `cryptblk close` (told the limit) reports that it did not
/// close cleanly. A second SIGTERM during such a close exits at once. The same server
/// with the remote answering closes cleanly.
#[test]
fn a_remote_that_stops_answering_cannot_keep_the_server_from_exiting() {
    let s = Setup::new();
    let remote = qemu_nbd(&s.path("remote.img"), &s.path("r.sock"), &[]);
    s.format(&remote.uri);
    let serve = |sock: &str, limit: &str| {
        let server = s.serve(&remote.uri, &s.path(sock), &["--close-timeout", limit]);
        // The control socket and pid file come after the NBD socket.
        let t0 = std::time::Instant::now();
        while !s.path("run").join("vol.pid").exists() {
            assert!(t0.elapsed().as_secs() < 60, "no pid file");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        server
    };
    let close = || run(&["close", "vol", "--run-dir", &s.p("run")]);
    let write_then_stop_remote = |sock: &str| {
        let front = format!("nbd+unix:///vol?socket={}", s.p(sock));
        std::fs::write(s.p("src.raw"), vec![0x5au8; 1 << 20]).unwrap();
        qemu_img_write(&s.p("src.raw"), &front);
        signal(remote.child.id(), "STOP");
    };
    let gone = || {
        for f in ["vol.pid", "vol.ctl"] {
            assert!(!s.path("run").join(f).exists(), "{f} left behind");
        }
    };

    let server = serve("a.sock", "60");
    ok(&close());
    let out = server.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    gone();

    let server = serve("b.sock", "3");
    write_then_stop_remote("b.sock");
    let t0 = std::time::Instant::now();
    let o = close();
    let took = t0.elapsed();
    signal(remote.child.id(), "CONT");
    let out = server.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("within 3s of the stop"), "{err}");
    assert_eq!(o.status.code(), Some(4), "close must say so: {o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("within 3s of the stop"),
        "{o:?}"
    );
    assert!(
        took >= std::time::Duration::from_secs(3) && took.as_secs() < 30,
        "close took {took:?}"
    );
    gone();

    // Ctrl-C twice: the second signal ends a stuck close at once.
    let server = serve("c.sock", "600");
    write_then_stop_remote("c.sock");
    let mut server = server;
    signal(server.id(), "TERM");
    let t0 = std::time::Instant::now();
    // Signals sent before the first is read merge into one: again until it exits.
    while server.try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed().as_secs() < 30,
            "a second signal did not end the close"
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
        let _ = run_in("kill", &["-TERM", &server.id().to_string()], b"");
    }
    let out = server.wait_with_output().unwrap();
    signal(remote.child.id(), "CONT");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("a second signal during the close"), "{err}");
    assert!(t0.elapsed().as_secs() < 30, "{:?}", t0.elapsed());
    gone();

    // The volume opens again on the remote, now answering, with what was written.
    ok(&run(&[
        "export",
        &remote.uri,
        &s.p("plain.out"),
        "--key-file",
        &s.p("pw"),
    ]));
    let plain = std::fs::read(s.p("plain.out")).unwrap();
    assert!(plain[..1 << 20].iter().all(|&b| b == 0x5a));
}
