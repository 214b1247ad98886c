//! LUKS2 tokens that unlock without a typed passphrase (issue 36), against the real tools:
//! a volume bound by `clevis luks bind` to a tang server (Debian's tangd behind socat)
//! passes `test-passphrase`, `open --test-passphrase` and `export` with no passphrase, and
//! with `--token-only`; a server that is down, or one that never answers, costs at most
//! `--token-timeout` and the passphrase is asked for after it; a token whose JWE was
//! tampered with unlocks nothing; an sss binding over three tang servers unlocks with any
//! two.

use crate::common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TANGD: &str = "/usr/libexec/tangd";
const KEYGEN: &str = "/usr/libexec/tangd-keygen";

/// A tang server on 127.0.0.1: tangd (run once per connection) behind socat.
pub(crate) struct Server {
    child: Child,
    port: u16,
}

impl Server {
    /// Serves `exec` (a command line socat runs per connection) on a free port.
    fn start(exec: &str) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Server::start_on(port, exec)
    }
    fn start_on(port: u16, exec: &str) -> Server {
        let socat = tool("socat", "socat");
        let child = Command::new(socat)
            .args([
                &format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork"),
                &format!("EXEC:{exec}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "socat did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { child, port }
    }
    pub(crate) fn tang(db: &Path) -> Server {
        assert!(
            Path::new(TANGD).exists() && Path::new(KEYGEN).exists(),
            "{TANGD} not found: install the Debian package tang (scripts/setup.sh does)"
        );
        Server::start(&format!("{TANGD} {}", db.display()))
    }
    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Lab {
    dir: tempfile::TempDir,
    cs: String,
    img: String,
    pw: String,
    data: Vec<u8>,
}

impl Lab {
    /// A LUKS2 volume with a passphrase in keyslot 0 and 1 MiB of data, bound by clevis to
    /// the tang server at `url` (its keyslot 1).
    fn bound(url: &str) -> Lab {
        Lab::bound_with("tang", &format!(r#"{{"url":"{url}"}}"#))
    }

    /// As `bound`, by `clevis luks bind` with any pin and its configuration.
    fn bound_with(pin: &str, config: &str) -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let cs = tool("cryptsetup", "cryptsetup-bin");
        let clevis = tool("clevis", "clevis clevis-luks");
        let TokenVolume { img, pw, data } = TokenVolume::new(dir.path());
        ok(&run_in(
            &clevis,
            &["luks", "bind", "-y", "-d", &img, "-k", &pw, pin, config],
            b"",
        ));
        Lab {
            dir,
            cs,
            img,
            pw,
            data,
        }
    }
    fn p(&self, n: &str) -> String {
        self.dir.path().join(n).to_str().unwrap().to_string()
    }
    /// cryptblk with nothing on stdin (no passphrase to fall back to).
    fn cb(&self, args: &[&str]) -> std::process::Output {
        run_in(bin(), args, b"")
    }
}

pub(crate) fn tang_db(dir: &Path) -> std::path::PathBuf {
    let db = dir.join("db");
    std::fs::create_dir(&db).unwrap();
    ok(&run_in(KEYGEN, &[db.to_str().unwrap()], b""));
    db
}

#[test]
fn a_clevis_tang_binding_unlocks_without_a_passphrase() {
    let keys = tempfile::tempdir().unwrap();
    let server = Server::tang(&tang_db(keys.path()));
    let lab = Lab::bound(&server.url());
    let img = lab.img.as_str();
    for args in [
        vec!["test-passphrase", img],
        vec!["test-passphrase", "--token-only", img],
        vec!["test-passphrase", "--token-type", "clevis", img],
        vec!["test-passphrase", "--token-id", "0", "--token-only", img],
        vec!["open", "--test-passphrase", img],
    ] {
        let out = lab.cb(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("Token 0 (clevis) unlocked keyslot 1"),
            "{args:?}: {err}"
        );
    }
    let out = lab.p("out");
    ok(&lab.cb(&["export", "--length", "1048576", img, &out]));
    assert!(
        std::fs::read(&out).unwrap() == lab.data,
        "data read by token"
    );
    // Served over NBD, unlocked by the token: `status` says which one.
    let (sock, run_dir) = (lab.dir.path().join("s.sock"), lab.p("run"));
    let mut server = serve_nbd_unix(&["open", img, "tv", "--run-dir", &run_dir], &sock, b"");
    let status = ok(&run_in(
        bin(),
        &["status", "tv", "--run-dir", &run_dir],
        b"",
    ));
    assert!(
        status.contains("unlocked by: token 0 (clevis), keyslot 1"),
        "{status}"
    );
    ok(&run_in(bin(), &["close", "tv", "--run-dir", &run_dir], b""));
    assert!(server.wait().unwrap().success());
    // A token that cannot unlock here (a FIDO2 key, none plugged in) says why, and the
    // passphrase is asked for.
    let fido = lab.p("fido.json");
    std::fs::write(
        &fido,
        r#"{"type":"systemd-fido2","keyslots":["0"],"fido2-credential":"AA==","fido2-salt":"AA==","fido2-rp":"io.systemd.cryptsetup"}"#,
    )
    .unwrap();
    ok(&cryptsetup(
        &lab.cs,
        &[
            "token",
            "import",
            "--token-id",
            "5",
            "--json-file",
            &fido,
            img,
        ],
    ));
    let pass = std::fs::read(&lab.pw).unwrap();
    let out = run_in(bin(), &["test-passphrase", "--token-id", "5", img], &pass);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "Token 5 (systemd-fido2): systemd-fido2 token: no FIDO2 security key is plugged in"
        ),
        "{err}"
    );
    // No such token: with --token-only nothing else is tried.
    let refused = lab.cb(&["test-passphrase", "--token-id", "7", "--token-only", img]);
    assert!(!refused.status.success(), "{refused:?}");
    // A key file means no token is tried.
    let by_file = lab.cb(&["test-passphrase", "--key-file", &lab.pw, img]);
    assert!(by_file.status.success());
    assert!(!String::from_utf8_lossy(&by_file.stderr).contains("Token"));
}

#[test]
fn a_tang_server_down_or_silent_costs_at_most_the_timeout_then_the_passphrase_is_asked() {
    let keys = tempfile::tempdir().unwrap();
    let server = Server::tang(&tang_db(keys.path()));
    let lab = Lab::bound(&server.url());
    let port = server.port;
    drop(server);
    let img = lab.img.as_str();
    let pass = std::fs::read(&lab.pw).unwrap();
    // Down: refused at once; the passphrase on stdin opens keyslot 0.
    let out = run_in(bin(), &["test-passphrase", img], &pass);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Token 0 (clevis)") && err.contains("Key slot 0 unlocked"),
        "{err}"
    );
    assert!(
        !lab.cb(&["test-passphrase", "--token-only", img])
            .status
            .success()
    );
    // Silent (accepts, never answers): --token-timeout bounds the wait.
    let _silent = Server::start_on(port, "sleep 30");
    let start = Instant::now();
    let out = run_in(
        bin(),
        &["test-passphrase", "--token-timeout", "1", img],
        &pass,
    );
    let took = start.elapsed();
    assert!(out.status.success(), "{out:?}");
    assert!(
        took < Duration::from_secs(5),
        "waited {took:?} for a silent server"
    );
}

/// `clevis luks bind sss` over three tang servers, two needed: any two up unlock (one
/// down costs nothing: the shares are fetched at once); with two down the token fails
/// within the timeout and the passphrase opens the volume.
#[test]
fn an_sss_binding_unlocks_with_a_threshold_of_tang_servers() {
    let keys: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut servers: Vec<Option<Server>> = keys
        .iter()
        .map(|k| Some(Server::tang(&tang_db(k.path()))))
        .collect();
    let urls: Vec<String> = servers
        .iter()
        .map(|s| format!(r#"{{"url":"{}"}}"#, s.as_ref().unwrap().url()))
        .collect();
    let lab = Lab::bound_with(
        "sss",
        &format!(r#"{{"t":2,"pins":{{"tang":[{}]}}}}"#, urls.join(",")),
    );
    let img = lab.img.as_str();
    let unlocked = |out: &std::process::Output| {
        out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("Token 0 (clevis) unlocked keyslot 1")
    };
    let out = lab.cb(&["test-passphrase", "--token-only", img]);
    assert!(unlocked(&out), "all three up: {out:?}");
    // clevis itself agrees on the binding (its own unlock path).
    let clevis = tool("clevis", "clevis clevis-luks");
    ok(&run_in(
        &clevis,
        &["luks", "pass", "-d", img, "-s", "1"],
        b"",
    ));
    servers[1] = None;
    let out = lab.cb(&["test-passphrase", "--token-only", img]);
    assert!(unlocked(&out), "two of three up: {out:?}");
    let data = lab.p("out");
    ok(&lab.cb(&["export", "--length", "1048576", img, &data]));
    assert!(
        std::fs::read(&data).unwrap() == lab.data,
        "data read by sss"
    );
    servers[0] = None;
    let start = Instant::now();
    let pass = std::fs::read(&lab.pw).unwrap();
    let out = run_in(
        bin(),
        &["test-passphrase", "--token-timeout", "2", img],
        &pass,
    );
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("1 of the 2 sss shares") && err.contains("Key slot 0 unlocked"),
        "{err}"
    );
    assert!(
        !lab.cb(&["test-passphrase", "--token-only", img])
            .status
            .success()
    );
}

#[test]
fn a_tampered_clevis_token_unlocks_nothing() {
    let keys = tempfile::tempdir().unwrap();
    let server = Server::tang(&tang_db(keys.path()));
    let lab = Lab::bound(&server.url());
    let img = lab.img.as_str();
    let exported = ok(&cryptsetup(
        &lab.cs,
        &["token", "export", "--token-id", "0", img],
    ));
    let mut token: serde_json::Value = serde_json::from_str(&exported).unwrap();
    // One bit of the ciphertext flipped (its first base64url character changed).
    let ct = token["jwe"]["ciphertext"].as_str().unwrap().to_string();
    let flipped = if ct.starts_with('A') { "B" } else { "A" };
    token["jwe"]["ciphertext"] = serde_json::json!(format!("{flipped}{}", &ct[1..]));
    let file = lab.p("token.json");
    std::fs::write(&file, token.to_string()).unwrap();
    ok(&cryptsetup(
        &lab.cs,
        &[
            "token",
            "import",
            "--token-id",
            "0",
            "--token-replace",
            "--json-file",
            &file,
            img,
        ],
    ));
    let out = lab.cb(&["test-passphrase", "--token-only", img]);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not decrypt"), "{err}");
}

/// `cryptblk enroll --clevis` binds as `clevis luks bind` does: clevis's own `luks pass`
/// gives a passphrase cryptsetup accepts for the new keyslot. A tang server's keys are
/// trusted with -q, or by the thumbprint of a signing key ("thp"), which the refusal
/// without a terminal names; a wrong thumbprint is refused.
#[test]
fn cryptblk_binds_as_clevis_does() {
    let keys: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let servers: Vec<Server> = keys
        .iter()
        .map(|k| Server::tang(&tang_db(k.path())))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let vol = TokenVolume::new(dir.path());
    let img = vol.img.as_str();
    let clevis = tool("clevis", "clevis clevis-luks");
    let cs = tool("cryptsetup", "cryptsetup-bin");
    // clevis's passphrase for `slot` opens that keyslot in cryptsetup.
    let clevis_opens = |slot: &str| {
        let pass = run_in(&clevis, &["luks", "pass", "-d", img, "-s", slot], b"");
        assert!(
            pass.status.success(),
            "clevis luks pass -s {slot}: {pass:?}"
        );
        let out = run_in(
            &cs,
            &[
                "open",
                "--test-passphrase",
                "-S",
                slot,
                "--key-file",
                "-",
                img,
            ],
            &pass.stdout,
        );
        assert!(out.status.success(), "keyslot {slot}: {out:?}");
    };
    let tang = format!(r#"{{"url":"{}"}}"#, servers[0].url());
    let enroll = |extra: &[&str], pin: &str, config: &str| {
        let mut a = extra.to_vec();
        a.extend([
            "enroll",
            "--clevis",
            pin,
            config,
            "--key-file",
            &vol.pw,
            img,
        ]);
        run_in(bin(), &a, b"")
    };
    // No terminal, no -q, no thp: refused, naming the thumbprints to trust.
    let refused = enroll(&[], "tang", &tang);
    assert!(!refused.status.success(), "{refused:?}");
    let err = String::from_utf8_lossy(&refused.stderr).into_owned();
    let thp = err
        .split("(one of ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|r| r.split(',').next())
        .unwrap_or_else(|| panic!("no thumbprint named: {err}"))
        .trim()
        .to_owned();
    let out = enroll(&["-q"], "tang", &tang);
    assert!(out.status.success(), "{out:?}");
    clevis_opens("1");
    let pinned = format!(r#"{{"url":"{}","thp":"{thp}"}}"#, servers[0].url());
    let out = enroll(&[], "tang", &pinned);
    assert!(out.status.success(), "{out:?}");
    clevis_opens("2");
    let wrong = format!(r#"{{"url":"{}","thp":"{}"}}"#, servers[1].url(), thp);
    let out = enroll(&[], "tang", &wrong);
    assert!(
        !out.status.success(),
        "another server's thumbprint: {out:?}"
    );
    let sss = format!(
        r#"{{"t":2,"pins":{{"tang":[{{"url":"{}"}},{{"url":"{}"}}]}}}}"#,
        servers[0].url(),
        servers[1].url()
    );
    let out = enroll(&["-q"], "sss", &sss);
    assert!(out.status.success(), "{out:?}");
    clevis_opens("3");
    // And cryptblk opens what it bound, each token in turn.
    for id in ["0", "1", "2"] {
        let out = run_in(
            bin(),
            &["test-passphrase", "--token-only", "--token-id", id, img],
            b"",
        );
        assert!(out.status.success(), "token {id}: {out:?}");
    }
}

/// Tokens on the other commands and device kinds: `reencrypt --token-only -S 1` takes
/// the passphrase of the keyslot it keeps from the token (the token follows the new
/// keyslot, so it still unlocks after), and a volume reached as `nbd+unix://` (nbdkit serving the image) opens by its
/// token as a local one does.
#[test]
fn tokens_reencrypt_and_unlock_remote_devices() {
    let keys = tempfile::tempdir().unwrap();
    let server = Server::tang(&tang_db(keys.path()));
    let lab = Lab::bound(&server.url());
    let img = lab.img.as_str();
    let out = lab.cb(&[
        "reencrypt",
        "--token-only",
        "--key-slot",
        "1",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        img,
    ]);
    assert!(out.status.success(), "{out:?}");
    let dump = ok(&cryptsetup(&lab.cs, &["luksDump", img]));
    assert!(!dump.contains("reencrypt"), "finished: {dump}");
    let out = lab.cb(&["test-passphrase", "--token-only", img]);
    assert!(
        out.status.success(),
        "the token follows the new keyslot: {out:?}"
    );
    let back = lab.p("back");
    ok(&lab.cb(&["export", "--length", "1048576", img, &back]));
    assert!(
        std::fs::read(&back).unwrap() == lab.data,
        "data after reencryption"
    );
    // The same volume over NBD.
    let sock = lab.dir.path().join("nbd.sock");
    let mut nbdkit = Command::new(tool("nbdkit", "nbdkit"))
        .args(["--foreground", "--exit-with-parent", "--unix"])
        .arg(&sock)
        .args(["file", &format!("file={img}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "nbdkit did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let out = lab.cb(&["test-passphrase", "--token-only", &uri]);
    assert!(out.status.success(), "{out:?}");
    let remote_back = lab.p("remote-back");
    ok(&lab.cb(&["export", "--length", "1048576", &uri, &remote_back]));
    assert!(std::fs::read(&remote_back).unwrap() == lab.data);
    let _ = nbdkit.kill();
    let _ = nbdkit.wait();
}
