//! TPM2 tokens (issue 36) against the real tools and a software TPM: swtpm on loopback,
//! enrolled by `systemd-cryptenroll --tpm2-device=swtpm:...` (systemd's own token) and by
//! `clevis luks bind ... tpm2` (clevis's pin, through tpm2-tools), each unlocked by
//! cryptblk with `--token-only`; a PCR extended afterwards refuses both; a PIN right and
//! wrong; a TPM that cannot be reached falls back to the passphrase; and cryptblk leaves
//! no object or session behind in a TPM that has no resource manager. `cryptblk enroll`
//! writes tokens systemd takes for its own: the same policy digest systemd-cryptenroll
//! computes, validated and shown by cryptsetup's systemd-tpm2 plugin, wiped by
//! `systemd-cryptenroll --wipe-slot=tpm2`.

use super::tokens::{Server, tang_db};
use crate::common::*;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A software TPM 2.0 (swtpm) on 127.0.0.1, its state in a temporary directory.
struct Swtpm {
    state: tempfile::TempDir,
    port: u16,
    ctrl: u16,
    child: Option<Child>,
}

impl Swtpm {
    fn start() -> Swtpm {
        // The swtpm TCTI finds the control channel on the port after the TPM's.
        let port = loop {
            let p = free_port();
            if p < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
                break p;
            }
        };
        let mut t = Swtpm {
            state: tempfile::tempdir().unwrap(),
            port,
            ctrl: port + 1,
            child: None,
        };
        t.power_on();
        t
    }

    fn power_on(&mut self) {
        let swtpm = tool("swtpm", "swtpm");
        let child = Command::new(swtpm)
            .args([
                "socket",
                "--tpm2",
                "--tpmstate",
                &format!("dir={}", self.state.path().display()),
                "--server",
                &format!("type=tcp,port={},bindaddr=127.0.0.1", self.port),
                "--ctrl",
                &format!("type=tcp,port={},bindaddr=127.0.0.1", self.ctrl),
                "--flags",
                "not-need-init,startup-clear",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "swtpm did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// An orderly reboot: PCRs back to zero, and the sessions systemd-cryptenroll and
    /// tpm2-tools leave loaded (swtpm has no resource manager to flush them) gone. Shut
    /// down first: a TPM counts a power cut as a possible attack, and a few of them put it
    /// in dictionary-attack lockout.
    fn reboot(&mut self) {
        self.tools("tpm2_shutdown", &[]);
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.power_on();
    }

    fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }

    /// A tpm2-tools command against this TPM.
    fn tools(&self, name: &str, args: &[&str]) -> String {
        let t = tool(name, "tpm2-tools");
        ok(&Command::new(t)
            .args(args)
            .env("TPM2TOOLS_TCTI", self.tcti())
            .output()
            .unwrap())
    }

    fn extend_pcr7(&self) {
        self.tools(
            "tpm2_pcrextend",
            &[&format!("7:sha256={}", "01".repeat(32))],
        );
    }

    /// What is loaded in the TPM: transient objects and sessions.
    fn loaded(&self) -> String {
        let mut s = self.tools("tpm2_getcap", &["handles-transient"]);
        s += &self.tools("tpm2_getcap", &["handles-loaded-session"]);
        s
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Volume {
    dir: tempfile::TempDir,
    img: String,
    pw: String,
    data: Vec<u8>,
}

impl Volume {
    fn new() -> Volume {
        let dir = tempfile::tempdir().unwrap();
        let TokenVolume { img, pw, data } = TokenVolume::new(dir.path());
        Volume { dir, img, pw, data }
    }

    fn p(&self, n: &str) -> String {
        self.dir.path().join(n).to_str().unwrap().to_string()
    }

    /// cryptblk with `env` set (no `$PIN` unless given) and `stdin` fed.
    fn cb(&self, args: &[&str], env: &[(&str, &str)], stdin: &[u8]) -> Output {
        let mut e: Vec<(&str, Option<&str>)> = vec![("PIN", None)];
        e.extend(env.iter().map(|&(k, v)| (k, Some(v))));
        run_env(bin(), args, &e, stdin)
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn systemd_cryptenroll_tpm2_tokens_unlock_with_pcrs_and_pins() {
    let mut tpm = Swtpm::start();
    let vol = Volume::new();
    let img = vol.img.as_str();
    let enroll = tool("systemd-cryptenroll", "systemd");
    let pass = std::fs::read_to_string(&vol.pw).unwrap();
    let tpm_arg = format!("--tpm2-device={}", tpm.tcti());
    // Token 0 (keyslot 1): PCR 7. Token 1 (keyslot 2): PCR 7 and a PIN.
    for (extra, pin) in [(None, None), (Some("--tpm2-with-pin=yes"), Some("1234"))] {
        let mut c = Command::new(&enroll);
        c.args([tpm_arg.as_str(), "--tpm2-pcrs=7", img])
            .args(extra)
            .env("PASSWORD", &pass);
        if let Some(pin) = pin {
            c.env("NEWPIN", pin);
        }
        ok(&c.output().unwrap());
    }
    tpm.reboot();
    let dev = ["--tpm2-device", &tpm.tcti()].map(str::to_owned);
    let args = |more: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = more.iter().map(|s| s.to_string()).collect();
        a.extend(dev.iter().cloned());
        a.push(img.to_owned());
        a
    };
    let run = |more: &[&str], env: &[(&str, &str)], stdin: &[u8]| {
        let a = args(more);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        vol.cb(&a, env, stdin)
    };
    let out = run(
        &["test-passphrase", "--token-only", "--token-id", "0"],
        &[],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("Token 0 (systemd-tpm2) unlocked keyslot 1"));
    let exported = vol.p("out");
    let tcti = tpm.tcti();
    let out = vol.cb(
        &[
            "export",
            "--length",
            "1048576",
            "--token-only",
            "--tpm2-device",
            &tcti,
            img,
            &exported,
        ],
        &[],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    assert!(
        std::fs::read(&exported).unwrap() == vol.data,
        "data read by the TPM token"
    );
    // The PIN: on stdin, or in $PIN as systemd takes it; a wrong one is refused as a wrong
    // passphrase is (exit 2) and says so.
    let pin_token = ["test-passphrase", "--token-only", "--token-id", "1"];
    let out = run(&pin_token, &[], b"1234\n");
    assert!(out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("Token 1 (systemd-tpm2) unlocked keyslot 2"));
    let out = run(&pin_token, &[("PIN", "1234")], b"");
    assert!(out.status.success(), "{out:?}");
    let out = run(&pin_token, &[], b"4321\n");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr(&out).contains("wrong PIN"), "{out:?}");
    // Tokens on the commands that change or show the key, when asked for: add-key and
    // dump --dump-volume-key (the key it shows is the one the passphrase gives).
    let new_key = vol.p("new-key");
    std::fs::write(&new_key, b"a new passphrase").unwrap();
    let a = [
        "add-key",
        "--token-id",
        "0",
        "--tpm2-device",
        &tcti,
        img,
        &new_key,
    ];
    let out = vol.cb(&a, &[], b"");
    assert!(out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("Key slot 3 created"), "{out:?}");
    let dump = |args: &[&str], stdin: &[u8]| {
        let mut a = vec!["dump", "-q", "--dump-volume-key"];
        a.extend(args);
        a.push(img);
        let out = vol.cb(&a, &[], stdin);
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let at = text.find("MK dump:").expect("a volume key");
        text[at..].lines().take(5).collect::<Vec<_>>().join("\n")
    };
    assert_eq!(
        dump(&["--token-id", "0", "--tpm2-device", &tcti], b""),
        dump(&["--key-file", &new_key], b"")
    );
    assert_eq!(tpm.loaded(), "", "cryptblk left objects or sessions loaded");
    // PCR 7 moves: both tokens refuse before unsealing; the passphrase still opens.
    tpm.extend_pcr7();
    let out = run(
        &["test-passphrase", "--token-only", "--token-id", "0"],
        &[],
        b"",
    );
    assert!(!out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("PCRs do not hold"), "{out:?}");
    let out = run(&["test-passphrase"], &[("PIN", "1234")], pass.as_bytes());
    assert!(out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("Key slot 0 unlocked"), "{out:?}");
    // Tried by default (no token option) with no $PIN, the PIN token does not take the
    // passphrase piped in for the keyslot as its PIN: it says what it needs, and the
    // passphrase still opens the volume.
    let out = run(&["test-passphrase"], &[], pass.as_bytes());
    assert!(out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("needs its PIN: set $PIN"), "{out:?}");
    assert_eq!(tpm.loaded(), "", "cryptblk left objects or sessions loaded");
    // No TPM there: a clear error, then the passphrase.
    let gone = [
        "test-passphrase",
        "--tpm2-device",
        &format!("swtpm:host=127.0.0.1,port={}", free_port()),
        img,
    ];
    let out = vol.cb(&gone, &[("PIN", "1234")], pass.as_bytes());
    assert!(out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("no TPM reached"), "{out:?}");
}

#[test]
fn clevis_tpm2_bindings_unlock_alone_and_inside_sss() {
    let mut tpm = Swtpm::start();
    let keys = tempfile::tempdir().unwrap();
    let tang = Server::tang(&tang_db(keys.path()));
    let vol = Volume::new();
    let img = vol.img.as_str();
    let clevis = tool("clevis", "clevis clevis-tpm2");
    let pcr7 = r#"{"pcr_bank":"sha256","pcr_ids":"7"}"#;
    // Token 0: PCR 7; token 1: no PCR (the object's empty authorization); token 2: sss of
    // tang and tpm2, both needed.
    for (pin, config) in [
        ("tpm2", pcr7.to_owned()),
        ("tpm2", "{}".to_owned()),
        (
            "sss",
            format!(
                r#"{{"t":2,"pins":{{"tang":[{{"url":"{}"}}],"tpm2":{pcr7}}}}}"#,
                tang.url()
            ),
        ),
    ] {
        ok(&Command::new(&clevis)
            .args(["luks", "bind", "-y", "-d", img, "-k", &vol.pw, pin, &config])
            .env("TPM2TOOLS_TCTI", tpm.tcti())
            .stdin(Stdio::null())
            .output()
            .unwrap());
    }
    tpm.reboot();
    let dev = tpm.tcti();
    for (id, slot) in [("0", 1), ("1", 2), ("2", 3)] {
        let out = vol.cb(
            &[
                "test-passphrase",
                "--token-only",
                "--token-id",
                id,
                "--tpm2-device",
                &dev,
                img,
            ],
            &[],
            b"",
        );
        assert!(out.status.success(), "token {id}: {out:?}");
        assert!(
            stderr(&out).contains(&format!("Token {id} (clevis) unlocked keyslot {slot}")),
            "{out:?}"
        );
    }
    assert_eq!(tpm.loaded(), "", "cryptblk left objects or sessions loaded");
    // cryptblk binds with the tpm2 pin too (token 3, keyslot 4): clevis's own `luks
    // pass` (tpm2-tools) gives a passphrase cryptsetup accepts.
    let out = vol.cb(
        &[
            "enroll",
            "--clevis",
            "tpm2",
            pcr7,
            "--tpm2-device",
            &dev,
            "--key-file",
            &vol.pw,
            img,
        ],
        &[],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    let pass = Command::new(&clevis)
        .args(["luks", "pass", "-d", img, "-s", "4"])
        .env("TPM2TOOLS_TCTI", &dev)
        .output()
        .unwrap();
    assert!(pass.status.success(), "{pass:?}");
    let cs = tool("cryptsetup", "cryptsetup-bin");
    let out = run_in(
        &cs,
        &[
            "open",
            "--test-passphrase",
            "-S",
            "4",
            "--key-file",
            "-",
            img,
        ],
        &pass.stdout,
    );
    assert!(out.status.success(), "{out:?}");
    tpm.reboot();
    tpm.extend_pcr7();
    for id in ["0", "2", "3"] {
        let out = vol.cb(
            &[
                "test-passphrase",
                "--token-only",
                "--token-id",
                id,
                "--tpm2-device",
                &dev,
                img,
            ],
            &[],
            b"",
        );
        assert!(
            !out.status.success(),
            "token {id} after PCR 7 moved: {out:?}"
        );
        assert!(stderr(&out).contains("PCRs do not hold"), "{out:?}");
    }
    let out = vol.cb(
        &[
            "test-passphrase",
            "--token-only",
            "--token-id",
            "1",
            "--tpm2-device",
            &dev,
            img,
        ],
        &[],
        b"",
    );
    assert!(out.status.success(), "no PCR in its policy: {out:?}");
}

fn token_json(img: &str, id: u32) -> serde_json::Value {
    let cs = tool("cryptsetup", "cryptsetup-bin");
    let out = ok(&cryptsetup(
        &cs,
        &["token", "export", "--token-id", &id.to_string(), img],
    ));
    serde_json::from_str(&out).unwrap()
}

#[test]
fn cryptblk_enrolls_tpm2_tokens_systemd_takes_for_its_own() {
    let mut tpm = Swtpm::start();
    let vol = Volume::new();
    let img = vol.img.as_str();
    let tcti = tpm.tcti();
    let pass = std::fs::read_to_string(&vol.pw).unwrap();
    // systemd's enrollments first (tokens 0 and 1), then cryptblk's (2 and 3), alike.
    let enroll = tool("systemd-cryptenroll", "systemd");
    for pin in [None, Some("1234")] {
        let mut c = Command::new(&enroll);
        c.args([&format!("--tpm2-device={tcti}"), "--tpm2-pcrs=7", img])
            .env("PASSWORD", &pass);
        if let Some(pin) = pin {
            c.arg("--tpm2-with-pin=yes").env("NEWPIN", pin);
        }
        ok(&c.output().unwrap());
    }
    tpm.reboot();
    let out = vol.cb(
        &["enroll", "--tpm2-device", &tcti, "--key-file", &vol.pw, img],
        &[],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    assert!(
        stderr(&out).contains("New TPM2 token enrolled as key slot 3"),
        "{out:?}"
    );
    let out = vol.cb(
        &[
            "enroll",
            "--tpm2-device",
            &tcti,
            "--tpm2-with-pin",
            "--tpm2-pcrs",
            "7",
            img,
        ],
        &[("NEWPIN", "4321")],
        pass.as_bytes(),
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(tpm.loaded(), "", "cryptblk left objects or sessions loaded");
    for (systemd, ours) in [(0, 2), (1, 3)] {
        let (s, o) = (token_json(img, systemd), token_json(img, ours));
        for field in [
            "type",
            "tpm2-pcrs",
            "tpm2-pcr-bank",
            "tpm2-primary-alg",
            "tpm2-pin",
        ] {
            assert_eq!(s[field], o[field], "{field}");
        }
        // The TPM computed the same policy for both: same PCRs, values and PIN rule.
        assert_eq!(s["tpm2-policy-hash"], o["tpm2-policy-hash"]);
        assert_ne!(s["tpm2-blob"], o["tpm2-blob"]);
    }
    // cryptsetup's systemd-tpm2 plugin validates and shows cryptblk's tokens.
    let cs = tool("cryptsetup", "cryptsetup-bin");
    let dump = ok(&cryptsetup(&cs, &["luksDump", img]));
    assert_eq!(dump.matches("tpm2-policy-hash:").count(), 4, "{dump}");
    // And cryptblk's dump shows the tokens as cryptsetup (with systemd's plugin) does.
    assert_eq!(vol.cb(&["dump", img], &[], b"").stdout, dump.as_bytes());
    // cryptblk unlocks its own enrollments, the PIN one only with its PIN.
    let run = |id: &str, env: &[(&str, &str)]| {
        vol.cb(
            &[
                "test-passphrase",
                "--token-only",
                "--token-id",
                id,
                "--tpm2-device",
                &tcti,
                img,
            ],
            env,
            b"",
        )
    };
    assert!(run("2", &[]).status.success());
    assert!(run("3", &[("PIN", "4321")]).status.success());
    assert_eq!(run("3", &[("PIN", "1234")]).status.code(), Some(2));
    // systemd takes them for its own: --wipe-slot=tpm2 wipes all four, tokens and all.
    let mut c = Command::new(&enroll);
    c.args(["--wipe-slot=tpm2", img]).env("PASSWORD", &pass);
    ok(&c.output().unwrap());
    let dump = ok(&cryptsetup(&cs, &["luksDump", img]));
    assert!(!dump.contains("systemd-tpm2"), "{dump}");
    // cryptblk's own --wipe-slot: enroll, then wipe the passphrase's keyslot.
    let out = vol.cb(
        &[
            "enroll",
            "--tpm2-device",
            &tcti,
            "--wipe-slot",
            "password",
            img,
        ],
        &[],
        pass.as_bytes(),
    );
    assert!(out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("Wiped slot 0"), "{out:?}");
    let out = vol.cb(&["test-passphrase", img], &[], pass.as_bytes());
    assert!(
        !out.status.success(),
        "the passphrase's keyslot is gone: {out:?}"
    );
    let exported = vol.p("out");
    let out = vol.cb(
        &[
            "export",
            "--length",
            "1048576",
            "--tpm2-device",
            &tcti,
            img,
            &exported,
        ],
        &[],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    assert!(std::fs::read(&exported).unwrap() == vol.data);
}

/// PCR 11 as a boot of a signed kernel image leaves it (systemd-stub, then the
/// `enter-initrd` phase), extended step by step as systemd-measure computes it: the
/// section's name with its NUL, its contents, the phase word.
fn measure_boot_into_pcr11(tpm: &Swtpm, kernel: &[u8]) {
    use sha2::Digest as _;
    for step in [&b".linux\0"[..], kernel, b"enter-initrd"] {
        let h = hex::encode(sha2::Sha256::digest(step));
        tpm.tools("tpm2_pcrextend", &[&format!("11:sha256={h}")]);
    }
}

/// An RSA key pair (PEM files) made by openssl.
fn rsa_key_pair(dir: &std::path::Path, name: &str) -> (String, String) {
    let openssl = tool("openssl", "openssl");
    let private = dir.join(format!("{name}.key")).to_str().unwrap().to_owned();
    let public = dir.join(format!("{name}.pub")).to_str().unwrap().to_owned();
    ok(&Command::new(&openssl)
        .args(["genrsa", "-out", &private, "2048"])
        .output()
        .unwrap());
    ok(&Command::new(&openssl)
        .args(["rsa", "-in", &private, "-pubout", "-out", &public])
        .output()
        .unwrap());
    (private, public)
}

#[test]
fn signed_pcr_policies_unlock_where_systemd_measure_signed_the_pcrs() {
    let mut tpm = Swtpm::start();
    let vol = Volume::new();
    let img = vol.img.as_str();
    let (private, public) = rsa_key_pair(vol.dir.path(), "pcr");
    let (other_private, other_public) = rsa_key_pair(vol.dir.path(), "other");
    let kernel = vol.p("kernel");
    std::fs::write(&kernel, b"a kernel image, as far as PCR 11 is concerned").unwrap();
    // systemd-measure signs the policy of PCR 11 as that kernel's boot leaves it.
    let sign = |private: &str, public: &str, out: &str| {
        let o = Command::new(tool("systemd-measure", "systemd"))
            .args([
                "sign",
                &format!("--tpm2-device={}", tpm.tcti()),
                &format!("--linux={kernel}"),
                "--bank=sha256",
                "--phase=enter-initrd",
                &format!("--private-key={private}"),
                &format!("--public-key={public}"),
            ])
            .output()
            .unwrap();
        std::fs::write(out, ok(&o)).unwrap();
    };
    let signature = vol.p("signature.json");
    sign(&private, &public, &signature);
    // Another key's signature passed off as ours (its entry's fingerprint rewritten).
    let forged = vol.p("forged.json");
    sign(&other_private, &other_public, &forged);
    let mut f: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&forged).unwrap()).unwrap();
    let mine: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&signature).unwrap()).unwrap();
    f["sha256"][0]["pkfp"] = mine["sha256"][0]["pkfp"].clone();
    std::fs::write(&forged, f.to_string()).unwrap();
    measure_boot_into_pcr11(&tpm, std::fs::read(&kernel).unwrap().as_slice());
    // systemd-cryptenroll binds token 0 to the key (PCR 11 signed, no literal PCRs).
    let pass = std::fs::read_to_string(&vol.pw).unwrap();
    ok(&Command::new(tool("systemd-cryptenroll", "systemd"))
        .args([
            &format!("--tpm2-device={}", tpm.tcti()),
            &format!("--tpm2-public-key={public}"),
            "--tpm2-pcrs=",
            &format!("--tpm2-signature={signature}"),
            img,
        ])
        .env("PASSWORD", &pass)
        .output()
        .unwrap());
    // systemd's tools leave sessions loaded (swtpm has no resource manager): a reboot,
    // and the same boot measured again, so that what cryptblk leaves can be seen.
    tpm.reboot();
    measure_boot_into_pcr11(&tpm, std::fs::read(&kernel).unwrap().as_slice());
    let tcti = tpm.tcti();
    let unlock = |id: &str, signature: Option<&str>| {
        let mut a = vec![
            "test-passphrase",
            "--token-only",
            "--token-id",
            id,
            "--tpm2-device",
            &tcti,
        ];
        if let Some(s) = signature {
            a.extend(["--tpm2-signature", s]);
        }
        a.push(img);
        vol.cb(&a, &[], b"")
    };
    let out = unlock("0", Some(&signature));
    assert!(out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("Token 0 (systemd-tpm2) unlocked keyslot 1"));
    // cryptblk enrolls the same binding (token 1): the same policy digest, and the fields
    // systemd writes; with --tpm2-signature it is tried before it is kept.
    let enroll = |signature: &str| {
        let a = [
            "enroll",
            "--tpm2-device",
            &tcti,
            "--tpm2-public-key",
            &public,
            "--tpm2-pcrs",
            "",
            "--tpm2-signature",
            signature,
            "--key-file",
            &vol.pw,
            img,
        ];
        vol.cb(&a, &[], b"")
    };
    let out = enroll(&signature);
    assert!(out.status.success(), "{out:?}");
    let (theirs, ours) = (token_json(img, 0), token_json(img, 1));
    assert_eq!(ours["tpm2-policy-hash"], theirs["tpm2-policy-hash"]);
    assert_eq!(ours["tpm2_pubkey"], theirs["tpm2_pubkey"]);
    assert_eq!(ours["tpm2_pubkey_pcrs"], serde_json::json!([11]));
    assert_eq!(ours["tpm2-pcrs"], serde_json::json!([]));
    let out = unlock("1", Some(&signature));
    assert!(out.status.success(), "{out:?}");
    // No signature at hand: says where it looked.
    let out = unlock("0", None);
    assert!(!out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("give --tpm2-signature"), "{out:?}");
    // The forged signature: the TPM itself refuses it.
    let out = unlock("0", Some(&forged));
    assert!(!out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("Esys_VerifySignature"), "{out:?}");
    // Enrolling with a signature that does not open it is refused, and writes nothing.
    let before = std::fs::read(img).unwrap();
    let out = enroll(&forged);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        std::fs::read(img).unwrap() == before,
        "a refused enroll wrote"
    );
    assert_eq!(tpm.loaded(), "", "cryptblk left objects or sessions loaded");
    // PCR 11 moves past what was signed (another phase, another kernel): refused, saying
    // the values were not signed; after a reboot (PCR 11 zero), too.
    tpm.tools(
        "tpm2_pcrextend",
        &[&format!("11:sha256={}", "02".repeat(32))],
    );
    let out = unlock("1", Some(&signature));
    assert!(!out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("nobody signed"), "{out:?}");
    tpm.reboot();
    let out = unlock("0", Some(&signature));
    assert!(!out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("nobody signed"), "{out:?}");
    // Booted into the signed kernel again: both open.
    measure_boot_into_pcr11(&tpm, std::fs::read(&kernel).unwrap().as_slice());
    for id in ["0", "1"] {
        let out = unlock(id, Some(&signature));
        assert!(out.status.success(), "{id}: {out:?}");
    }
}
