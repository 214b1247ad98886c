//! PKCS#11 tokens (issue 36) against SoftHSM 2 and the real tools: a SoftHSM token in a
//! temporary directory holds an RSA key and its certificate (imported with pkcs11-tool);
//! `systemd-cryptenroll --pkcs11-token-uri` enrolls, cryptblk unlocks with the PIN from
//! `$PIN` or stdin, refuses a wrong one as a wrong passphrase (exit 2), and with the
//! token gone says so and asks for the passphrase. `cryptblk enroll --pkcs11-token-uri`
//! enrolls, and cryptsetup's own systemd-pkcs11 plugin unlocks what cryptblk enrolled.

use crate::common::*;
use std::process::{Command, Output};

const MODULE: &str = "/usr/lib/softhsm/libsofthsm2.so";

/// A SoftHSM token ("test", PIN 1234) holding an RSA key and its certificate.
struct Hsm {
    dir: tempfile::TempDir,
    conf: String,
    uri: String,
}

impl Hsm {
    fn new() -> Hsm {
        Hsm::with_key(&["-newkey", "rsa:2048"])
    }

    /// A SoftHSM token whose key openssl's `req` makes with `newkey` (its arguments).
    fn with_key(newkey: &[&str]) -> Hsm {
        assert!(
            std::path::Path::new(MODULE).exists(),
            "{MODULE} not found: install the Debian package softhsm2 (scripts/setup.sh does)"
        );
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
        std::fs::create_dir(p("tokens")).unwrap();
        let conf = p("softhsm2.conf");
        std::fs::write(
            &conf,
            format!(
                "directories.tokendir = {}\nobjectstore.backend = file\n",
                p("tokens")
            ),
        )
        .unwrap();
        let run = |cmd: &str, pkg: &str, args: &[&str]| {
            ok(&Command::new(tool(cmd, pkg))
                .args(args)
                .env("SOFTHSM2_CONF", &conf)
                .output()
                .unwrap())
        };
        run(
            "softhsm2-util",
            "softhsm2",
            &[
                "--init-token",
                "--free",
                "--label",
                "test",
                "--pin",
                "1234",
                "--so-pin",
                "5678",
            ],
        );
        run(
            "openssl",
            "openssl",
            &[
                &["req", "-x509"][..],
                newkey,
                &["-nodes"],
                &[
                    "-keyout",
                    &p("key.pem"),
                    "-out",
                    &p("cert.pem"),
                    "-days",
                    "3650",
                    "-subj",
                    "/CN=cryptblk-test",
                ],
            ]
            .concat(),
        );
        run(
            "openssl",
            "openssl",
            &[
                "pkcs8",
                "-topk8",
                "-nocrypt",
                "-in",
                &p("key.pem"),
                "-outform",
                "DER",
                "-out",
                &p("key.der"),
            ],
        );
        run(
            "openssl",
            "openssl",
            &[
                "x509",
                "-in",
                &p("cert.pem"),
                "-outform",
                "DER",
                "-out",
                &p("cert.der"),
            ],
        );
        // The private key may decrypt (RSA) and derive (EC), as a card's key is made.
        for (file, kind, usage) in [
            (
                "key.der",
                "privkey",
                &["--usage-decrypt", "--usage-derive"][..],
            ),
            ("cert.der", "cert", &[][..]),
        ] {
            let path = p(file);
            let args = [
                &[
                    "--module",
                    MODULE,
                    "--login",
                    "--pin",
                    "1234",
                    "--write-object",
                    &path,
                    "--type",
                    kind,
                    "--id",
                    "01",
                    "--label",
                    "key",
                ][..],
                usage,
            ]
            .concat();
            run("pkcs11-tool", "opensc", &args);
        }
        let uri = "pkcs11:token=test".to_owned();
        Hsm { dir, conf, uri }
    }

    fn p(&self, n: &str) -> String {
        self.dir.path().join(n).to_str().unwrap().to_string()
    }

    /// `cmd` with this SoftHSM as the system's (through p11-kit), no `$PIN` unless `env`
    /// sets it, `stdin` fed.
    fn run(&self, cmd: &str, args: &[&str], env: &[(&str, &str)], stdin: &[u8]) -> Output {
        let mut e: Vec<(&str, Option<&str>)> =
            vec![("SOFTHSM2_CONF", Some(&self.conf)), ("PIN", None)];
        e.extend(env.iter().map(|&(k, v)| (k, Some(v))));
        run_env(cmd, args, &e, stdin)
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn systemd_pkcs11_tokens_unlock_both_ways_with_softhsm() {
    let hsm = Hsm::new();
    let TokenVolume { img, pw, data } = TokenVolume::new(hsm.dir.path());
    let img = img.as_str();
    let pass = std::fs::read_to_string(&pw).unwrap();
    // systemd enrolls (token 0, keyslot 1); cryptblk unlocks with the PIN from $PIN or
    // from stdin, and reads the data.
    let enroll = tool("systemd-cryptenroll", "systemd");
    let out = hsm.run(
        &enroll,
        &[&format!("--pkcs11-token-uri={}", hsm.uri), img],
        &[("PIN", "1234"), ("PASSWORD", &pass)],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    let cb = |args: &[&str], env: &[(&str, &str)], stdin: &[u8]| hsm.run(bin(), args, env, stdin);
    let out = cb(
        &["test-passphrase", "--token-only", img],
        &[("PIN", "1234")],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    assert!(
        stderr(&out).contains("Token 0 (systemd-pkcs11) unlocked keyslot 1"),
        "{out:?}"
    );
    let exported = hsm.p("out");
    // Tried by default (no token option), the PIN comes from $PIN: a line of stdin would
    // be the passphrase's.
    let out = cb(
        &["export", "--length", "1048576", img, &exported],
        &[("PIN", "1234")],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    assert!(
        std::fs::read(&exported).unwrap() == data,
        "data read by the PKCS#11 token"
    );
    let out = cb(
        &["test-passphrase", "--token-only", img],
        &[("PIN", "0000")],
        b"",
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr(&out).contains("wrong PIN"), "{out:?}");
    // cryptblk enrolls (token 1, keyslot 2): cryptsetup's own systemd-pkcs11 plugin
    // unlocks it, the PIN on stdin.
    let out = cb(
        &[
            "enroll",
            "--pkcs11-token-uri",
            &hsm.uri,
            "--key-file",
            &pw,
            img,
        ],
        &[("PIN", "1234")],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    assert!(
        stderr(&out).contains("New PKCS#11 token enrolled as key slot 2"),
        "{out:?}"
    );
    let cs = tool("cryptsetup", "cryptsetup-bin");
    let out = hsm.run(
        &cs,
        &[
            "open",
            "--test-passphrase",
            "--token-only",
            "--token-id",
            "1",
            "-v",
            img,
        ],
        &[],
        b"1234\n",
    );
    assert!(
        out.status.success(),
        "cryptsetup's plugin on cryptblk's enrollment: {out:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Key slot 2 unlocked"),
        "{out:?}"
    );
    let out = cb(
        &["test-passphrase", "--token-only", "--token-id", "1", img],
        &[("PIN", "1234")],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    // cryptblk's dump shows both tokens as cryptsetup (with systemd's plugin) does.
    let dump = ok(&cryptsetup(&cs, &["luksDump", img]));
    assert!(dump.contains("pkcs11-uri: pkcs11:token=test"), "{dump}");
    assert_eq!(cb(&["dump", img], &[], b"").stdout, dump.as_bytes());
    // The token gone (another SoftHSM store, empty): said so, then the passphrase.
    let empty = hsm.p("empty.conf");
    std::fs::create_dir(hsm.p("none")).unwrap();
    std::fs::write(
        &empty,
        format!("directories.tokendir = {}\n", hsm.p("none")),
    )
    .unwrap();
    let out = cb(
        &["test-passphrase", img],
        &[("SOFTHSM2_CONF", &empty), ("PIN", "1234")],
        pass.as_bytes(),
    );
    assert!(out.status.success(), "{out:?}");
    assert!(
        stderr(&out).contains("no PKCS#11 token present matches"),
        "{out:?}"
    );
    assert!(stderr(&out).contains("Key slot 0 unlocked"), "{out:?}");
}

/// An EC key on the token (systemd 255+'s tokens; Debian 12's systemd 252 enrolls RSA
/// only): cryptblk enrolls and unlocks through the token's ECDH; and, independently, the
/// secret openssl derives from the token's private key (the test made it) and the stored
/// ephemeral point is, in base64, the new keyslot's passphrase for cryptsetup itself.
#[test]
fn an_ec_key_enrolls_and_unlocks_by_ecdh_as_systemd_255_does() {
    let hsm = Hsm::with_key(&["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]);
    let TokenVolume { img, pw, .. } = TokenVolume::new(hsm.dir.path());
    let img = img.as_str();
    let cb = |args: &[&str], env: &[(&str, &str)], stdin: &[u8]| hsm.run(bin(), args, env, stdin);
    let out = cb(
        &[
            "enroll",
            "--pkcs11-token-uri",
            &hsm.uri,
            "--key-file",
            &pw,
            img,
        ],
        &[("PIN", "1234")],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("enrolled as key slot 1"), "{out:?}");
    let out = cb(
        &["test-passphrase", "--token-only", "--token-id", "0", img],
        &[("PIN", "1234")],
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    assert!(
        stderr(&out).contains("Token 0 (systemd-pkcs11) unlocked keyslot 1"),
        "{out:?}"
    );
    let out = cb(
        &["test-passphrase", "--token-only", img],
        &[("PIN", "0000")],
        b"",
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // The format, checked without cryptblk: the stored point is an uncompressed P-256
    // point; ECDH of it with the token's private key, in base64, opens keyslot 1.
    use base64::Engine as _;
    let token: serde_json::Value = serde_json::from_str(&ok(&cb(
        &["token", "export", "--token-id", "0", img],
        &[],
        b"",
    )))
    .unwrap();
    let point = base64::engine::general_purpose::STANDARD
        .decode(token["pkcs11-key"].as_str().unwrap())
        .unwrap();
    assert_eq!(
        (point.len(), point[0]),
        (65, 4),
        "uncompressed SEC1 P-256 point"
    );
    let mut spki = hex::decode("3059301306072a8648ce3d020106082a8648ce3d030107034200").unwrap();
    spki.extend_from_slice(&point);
    std::fs::write(hsm.p("eph.der"), &spki).unwrap();
    let derive = run_in(
        &tool("openssl", "openssl"),
        &[
            "pkeyutl",
            "-derive",
            "-inkey",
            &hsm.p("key.pem"),
            "-peerkey",
            &hsm.p("eph.der"),
            "-peerform",
            "DER",
            "-out",
            &hsm.p("shared"),
        ],
        b"",
    );
    assert!(derive.status.success(), "{derive:?}");
    let shared = std::fs::read(hsm.p("shared")).unwrap();
    assert_eq!(shared.len(), 32);
    std::fs::write(
        hsm.p("pass"),
        base64::engine::general_purpose::STANDARD.encode(&shared),
    )
    .unwrap();
    let cs = tool("cryptsetup", "cryptsetup-bin");
    ok(&cryptsetup(
        &cs,
        &[
            "open",
            "--test-passphrase",
            "--key-slot",
            "1",
            "--key-file",
            &hsm.p("pass"),
            img,
        ],
    ));
}
