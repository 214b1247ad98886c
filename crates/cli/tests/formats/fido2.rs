//! systemd-fido2 tokens (issue 36) as far as this machine can take them without a FIDO2
//! key (the keys are tested in the VM, tests/vm/tokens.sh, over a software key on uhid):
//! `dump` prints the token as cryptsetup with systemd's plugin does, flags left out by
//! systemd 248 included; with no key plugged in, the token says so and the passphrase is
//! asked for (or `--token-only` fails); `enroll --fido2-device` with no key refuses.

use crate::common::*;
use std::process::Output;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A systemd-fido2 token as systemd-cryptenroll writes it (a credential no key here
/// holds), naming keyslot 0; `flags` false leaves the three flags out (systemd 248).
fn fido2_token(flags: bool) -> String {
    let mut t = serde_json::json!({
        "type": "systemd-fido2",
        "keyslots": ["0"],
        "fido2-credential": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0BBQkNERUZHSElKS0xNTk9QUVJTVFVWV1hZWltcXV5f",
        "fido2-salt": "sBvDgGvK1o3F2hP7tJ0xW4yQ8mN6cE5aR9uL3iS1kTA=",
    });
    if flags {
        t["fido2-rp"] = "io.systemd.cryptsetup".into();
        t["fido2-clientPin-required"] = true.into();
        t["fido2-up-required"] = true.into();
        t["fido2-uv-required"] = false.into();
    }
    t.to_string()
}

#[test]
fn a_systemd_fido2_token_dumps_as_cryptsetup_and_without_a_key_the_passphrase_is_asked() {
    let cs = tool("cryptsetup", "cryptsetup-bin");
    let plugin = format!(
        "/usr/lib/{}-linux-gnu/cryptsetup/libcryptsetup-token-systemd-fido2.so",
        std::env::consts::ARCH
    );
    assert!(
        std::path::Path::new(&plugin).exists(),
        "{plugin} not found: systemd's token plugins come with the Debian package systemd \
         (scripts/setup.sh installs it)"
    );
    let dir = tempfile::tempdir().unwrap();
    let vol = TokenVolume::new(dir.path());
    let img = vol.img.as_str();
    for (i, flags) in [true, false].into_iter().enumerate() {
        let json = dir.path().join(format!("t{i}.json"));
        std::fs::write(&json, fido2_token(flags)).unwrap();
        ok(&cryptsetup(
            &cs,
            &[
                "token",
                "import",
                "--json-file",
                json.to_str().unwrap(),
                img,
            ],
        ));
    }
    // Byte for byte what cryptsetup prints with systemd's plugin, both token forms.
    let dump = ok(&cryptsetup(&cs, &["luksDump", img]));
    assert!(dump.contains("fido2-clientPin-required:"), "{dump}");
    assert_eq!(run_in(bin(), &["dump", img], b"").stdout, dump.as_bytes());

    // No FIDO2 key on this machine: each token says why, then the passphrase.
    let o = run_in(
        bin(),
        &["test-passphrase", img],
        vol.passphrase().as_bytes(),
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("Token 0 (systemd-fido2):") && err.contains("Token 1 (systemd-fido2):"),
        "{err}"
    );
    // libfido2 is installed (scripts/setup.sh): the key is what is missing.
    assert!(err.contains("no FIDO2 security key is plugged in"), "{err}");
    let o = run_in(bin(), &["test-passphrase", "--token-only", img], b"");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("No usable token"), "{}", stderr(&o));

    // A named key that is not there: its path in the message.
    let o = run_in(
        bin(),
        &[
            "test-passphrase",
            "--token-only",
            "--fido2-device",
            "/dev/hidraw-none",
            img,
        ],
        b"",
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("/dev/hidraw-none"), "{}", stderr(&o));

    // Enrolling with no key: refused, the header untouched.
    let before = std::fs::read(img).unwrap();
    let o = run_in(
        bin(),
        &[
            "enroll",
            "--fido2-device",
            "auto",
            "--key-file",
            &vol.pw,
            img,
        ],
        b"",
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no FIDO2 security key is plugged in"),
        "{}",
        stderr(&o)
    );
    assert!(
        std::fs::read(img).unwrap() == before,
        "enroll changed the header"
    );
}
