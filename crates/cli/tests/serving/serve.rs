//! `open --nbd` end to end with the real NBD clients (fio, qemu-img, nbdinfo, nbdcopy).

use crate::common::{bin, free_port, make_pki, tool};
use std::path::Path;
use std::process::Output;

fn run(cmd: &str, args: &[&str]) -> Output {
    crate::common::run_in(cmd, args, b"")
}

fn ok(o: Output) -> String {
    crate::common::ok(&o)
}

struct Served {
    dir: tempfile::TempDir,
    name: String,
}

impl Served {
    fn p(&self, f: &str) -> String {
        self.dir.path().join(f).to_str().unwrap().to_string()
    }
    fn uri(&self) -> String {
        format!("nbd+unix:///{}?socket={}", self.name, self.p("s.sock"))
    }
    fn open(&self, extra: &[&str]) -> Output {
        let (img, pw, sock, run_dir) = (
            self.p("v.img"),
            self.p("pw"),
            format!("unix:{}", self.p("s.sock")),
            self.p("run"),
        );
        let mut args = vec![
            "open",
            img.as_str(),
            self.name.as_str(),
            "--nbd",
            &sock,
            "--daemon",
            "--run-dir",
            &run_dir,
            "--key-file",
            &pw,
        ];
        args.extend_from_slice(extra);
        run(bin(), &args)
    }
    fn close(&self) {
        ok(run(
            bin(),
            &["close", &self.name, "--run-dir", &self.p("run")],
        ));
    }
}

fn setup(kind: &str, cipher: &str, ss: &str) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let s = Served {
        dir,
        name: "vol".into(),
    };
    std::fs::write(s.p("pw"), b"served passphrase").unwrap();
    std::fs::File::create(s.p("v.img"))
        .unwrap()
        .set_len(96 << 20)
        .unwrap();
    let mut args = vec![
        "format",
        "-q",
        "--type",
        kind,
        "--cipher",
        cipher,
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
    ];
    if kind == "luks2" {
        args.extend(["--sector-size", ss]);
    }
    let (pw, img) = (s.p("pw"), s.p("v.img"));
    args.extend(["--key-file", &pw, &img]);
    ok(run(bin(), &args));
    s
}

#[test]
fn fio_verify_over_nbd_every_cipher_and_sector_size() {
    for (kind, cipher, ss) in [
        ("luks2", "aes-xts-plain64", "4096"),
        ("luks2", "aes-xts-plain64", "512"),
        ("luks2", "aes-cbc-essiv:sha256", "4096"),
        ("luks1", "aes-xts-plain", "512"),
    ] {
        let s = setup(kind, cipher, ss);
        ok(s.open(&[]));
        let info: serde_json::Value = serde_json::from_str(&ok(run(
            &tool("nbdinfo", "libnbd-bin"),
            &["--json", &s.uri()],
        )))
        .unwrap();
        let e = &info["exports"][0];
        assert_eq!(
            e["block_size_minimum"].as_u64().unwrap(),
            ss.parse::<u64>().unwrap()
        );
        let expect_size = (96u64 << 20) - if kind == "luks2" { 16 << 20 } else { 2 << 20 };
        assert_eq!(
            e["export-size"].as_u64().unwrap(),
            expect_size,
            "{kind} {cipher}"
        );
        let uri = s.uri();
        // The smallest block the volume takes (512 B or 4 KiB) at queue depth 64.
        let small = if ss == "512" { "512" } else { "4k" };
        crate::common::fio_verify(
            s.dir.path(),
            &uri,
            &[
                ("randrw", small, "64"),
                ("randrw", "4k", "32"),
                ("write", "1m", "4"),
                ("randwrite", "64k", "8"),
                ("readwrite", "16k", "1"),
            ],
        );
        s.close();
    }
}

#[test]
fn qemu_img_and_nbdcopy_round_trip_and_data_survives_reopen() {
    let s = setup("luks2", "aes-xts-plain64", "4096");
    let src = s.p("src.raw");
    let data: Vec<u8> = (0..24u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    ok(s.open(&[]));
    ok(run(
        &tool("qemu-img", "qemu-utils"),
        &["convert", "-n", "-f", "raw", "-O", "raw", &src, &s.uri()],
    ));
    let out = s.p("out.raw");
    ok(run(&tool("nbdcopy", "libnbd-bin"), &[&s.uri(), &out]));
    assert!(std::fs::read(&out).unwrap()[..data.len()] == data[..]);
    // Status shows the traffic.
    let st = ok(run(bin(), &["status", "vol", "--run-dir", &s.p("run")]));
    assert!(
        st.contains("LUKS2") && st.contains("aes-xts-plain64") && st.contains("nbd unix:"),
        "{st}"
    );
    // A second opener of the same image is refused: it is locked.
    let second = run(
        bin(),
        &[
            "open",
            &s.p("v.img"),
            "other",
            "--nbd",
            &format!("unix:{}", s.p("t.sock")),
            "--run-dir",
            &s.p("run"),
            "--key-file",
            &s.p("pw"),
        ],
    );
    assert_eq!(
        second.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    s.close();
    assert!(
        !Path::new(&s.p("s.sock")).exists(),
        "close removes the socket"
    );
    // Closed and reopened through another path: the bytes are on disk, encrypted.
    let back = s.p("back.raw");
    ok(run(
        bin(),
        &[
            "export",
            "--key-file",
            &s.p("pw"),
            "--length",
            &data.len().to_string(),
            &s.p("v.img"),
            &back,
        ],
    ));
    assert!(std::fs::read(&back).unwrap() == data);
    ok(s.open(&["--readonly"]));
    let cmp = run(
        &tool("qemu-img", "qemu-utils"),
        &["convert", "-n", "-f", "raw", "-O", "raw", &src, &s.uri()],
    );
    assert!(
        !cmp.status.success(),
        "writes to a read-only export must fail"
    );
    s.close();
}

#[test]
fn wrong_passphrase_and_sigterm() {
    let s = setup("luks2", "aes-xts-plain64", "4096");
    std::fs::write(s.p("bad"), b"not it").unwrap();
    let o = run(
        bin(),
        &[
            "open",
            &s.p("v.img"),
            "vol",
            "--nbd",
            &format!("unix:{}", s.p("s.sock")),
            "--daemon",
            "--run-dir",
            &s.p("run"),
            "--key-file",
            &s.p("bad"),
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("No key available"));
    ok(s.open(&[]));
    let pid: i32 = std::fs::read_to_string(s.p("run/vol.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    ok(run("/bin/kill", &["-TERM", &pid.to_string()]));
    for _ in 0..500 {
        if !Path::new(&s.p("run/vol.pid")).exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        !Path::new(&s.p("run/vol.pid")).exists(),
        "SIGTERM closes the volume cleanly"
    );
    let st = run(bin(), &["status", "vol", "--run-dir", &s.p("run")]);
    assert_eq!(st.status.code(), Some(4));
}

#[test]
fn memory_backend_serves() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("m.sock");
    let run_dir = dir.path().join("run");
    ok(run(
        bin(),
        &[
            "open",
            "mem:64M",
            "m",
            "--nbd",
            &format!("unix:{}", sock.display()),
            "--daemon",
            "--run-dir",
            run_dir.to_str().unwrap(),
        ],
    ));
    let info = ok(run(
        &tool("nbdinfo", "libnbd-bin"),
        &[
            "--size",
            &format!("nbd+unix:///m?socket={}", sock.display()),
        ],
    ));
    assert_eq!(info.trim(), (64u64 << 20).to_string());
    ok(run(
        bin(),
        &["close", "m", "--run-dir", run_dir.to_str().unwrap()],
    ));
}

#[test]
fn open_over_tls_on_any_address_and_plaintext_only_on_loopback() {
    let nbdinfo = tool("nbdinfo", "libnbd-bin");
    let s = setup("luks2", "aes-xts-plain64", "4096");
    let pki = s.dir.path().join("pki");
    std::fs::create_dir(&pki).unwrap();
    make_pki(&pki);
    let pem = |f: &str| pki.join(f).to_str().unwrap().to_string();
    let port = free_port();
    let any = format!("tcp:0.0.0.0:{port}");
    let (img, pw, run_dir) = (s.p("v.img"), s.p("pw"), s.p("run"));
    let open = |extra: &[&str]| {
        let mut a = vec![
            "open",
            &img,
            "vol",
            "--nbd",
            &any,
            "--daemon",
            "--run-dir",
            &run_dir,
            "--key-file",
            &pw,
        ];
        a.extend_from_slice(extra);
        run(bin(), &a)
    };
    // Plaintext on every address: refused, saying how to do it right.
    let o = open(&[]);
    assert!(!o.status.success(), "plaintext NBD served on 0.0.0.0");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("non-loopback") && err.contains("--tls"),
        "{err}"
    );
    // TLS asked for without a certificate: a clear error.
    let o = open(&["--tls", "required"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--tls-cert"));
    let (cert, key, ca) = (
        pem("server-cert.pem"),
        pem("server-key.pem"),
        pem("ca-cert.pem"),
    );
    // TLS that identifies no client: refused on every address (anyone who can connect
    // would read the volume), unless asked for explicitly.
    let o = open(&["--tls-cert", &cert, "--tls-key", &key]);
    assert!(
        !o.status.success(),
        "TLS without client certificates on 0.0.0.0"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--tls-ca") && err.contains("--tls-no-client-auth"),
        "{err}"
    );
    // A directory with the CA only: a TLS client holding no certificate of its own.
    let anon = s.dir.path().join("anon");
    std::fs::create_dir(&anon).unwrap();
    std::fs::copy(pki.join("ca-cert.pem"), anon.join("ca-cert.pem")).unwrap();
    let anon_uri = format!(
        "nbds://127.0.0.1:{port}/vol?tls-certificates={}",
        anon.display()
    );
    let o = open(&[
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-no-client-auth",
    ]);
    ok(o.clone());
    let warned = std::fs::read_to_string(s.dir.path().join("run/vol.log")).unwrap_or_default()
        + &String::from_utf8_lossy(&o.stderr);
    assert!(warned.contains("without client certificates"), "{warned}");
    let size = ok(run(&nbdinfo, &["--size", &anon_uri]));
    assert_eq!(size.trim(), (80u64 << 20).to_string());
    s.close();
    // TLS required, clients checked against the CA: one without a certificate is refused.
    ok(open(&[
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-ca",
        &ca,
    ]));
    let o = run(&nbdinfo, &["--size", &anon_uri]);
    assert!(
        !o.status.success(),
        "a TLS client without a certificate was served with --tls-ca"
    );
    let tls_uri = format!(
        "nbds://127.0.0.1:{port}/vol?tls-certificates={}",
        pki.display()
    );
    let size = ok(run(&nbdinfo, &["--size", &tls_uri]));
    assert_eq!(size.trim(), (80u64 << 20).to_string());
    let o = run(
        &nbdinfo,
        &["--size", &format!("nbd://127.0.0.1:{port}/vol")],
    );
    assert!(
        !o.status.success(),
        "a plaintext client was served with TLS required"
    );
    s.close();
    // Plaintext on every address only when asked for explicitly.
    ok(open(&["--insecure-listen"]));
    let size = ok(run(
        &nbdinfo,
        &["--size", &format!("nbd://127.0.0.1:{port}/vol")],
    ));
    assert_eq!(size.trim(), (80u64 << 20).to_string());
    s.close();
}

/// Two `open`s of the same name at once (two images, two sockets, one run directory):
/// one serves, the other is refused as busy before its frontend starts, so it serves
/// nothing, not even for a moment, and leaves no socket behind.
#[test]
fn two_opens_racing_for_one_name_leave_one_server_and_no_stray_socket() {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    std::fs::write(p("pw"), b"race").unwrap();
    for img in ["a.img", "b.img"] {
        std::fs::File::create(p(img))
            .unwrap()
            .set_len(20 << 20)
            .unwrap();
        ok(run(
            bin(),
            &[
                "format",
                "-q",
                "--type",
                "luks2",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--key-file",
                &p("pw"),
                &p(img),
            ],
        ));
    }
    let run_dir = p("run");
    for round in 0..6 {
        let servers: Vec<_> = ["a", "b"]
            .iter()
            .map(|w| {
                let (img, sock) = (
                    p(&format!("{w}.img")),
                    format!("unix:{}", p(&format!("{w}.sock"))),
                );
                Command::new(bin())
                    .args(["open", &img, "vol", "--nbd", &sock, "--run-dir", &run_dir])
                    .args(["--key-file", &p("pw")])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        // Whoever lost exits on its own; the winner serves until closed.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut servers: Vec<_> = servers.into_iter().zip(["a", "b"]).collect();
        let (loser, who) = loop {
            if let Some(i) = servers
                .iter_mut()
                .position(|(c, _)| c.try_wait().unwrap().is_some())
            {
                break servers.remove(i);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: both still running"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        let out = loser.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(5), "round {round}: {who}: {err}");
        assert!(err.contains("already open"), "round {round}: {err}");
        assert!(
            !Path::new(&p(&format!("{who}.sock"))).exists(),
            "round {round}: the refused open left its socket"
        );
        let (winner, won) = servers.pop().unwrap();
        assert!(winner_serves(&p(&format!("{won}.sock"))), "round {round}");
        // Its NBD socket listens a moment before its control socket is announced: `close`
        // may find nothing to close until then.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let out = run(bin(), &["close", "vol", "--run-dir", &run_dir]);
            if out.status.success() {
                break;
            }
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("is not active")
                    && std::time::Instant::now() < deadline,
                "round {round}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = winner.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let _ = std::fs::remove_file(p(&format!("{won}.sock")));
    }
}

/// Whether an NBD server answers on `sock` (within 10 s).
fn winner_serves(sock: &str) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if std::os::unix::net::UnixStream::connect(sock).is_ok() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}
