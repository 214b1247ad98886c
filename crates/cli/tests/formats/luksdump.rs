//! `cryptblk dump` (and `luksDump`) prints cryptsetup's `luksDump` text byte for byte:
//! LUKS1 and LUKS2, PBKDF2 and Argon2 keyslots, killed slots, priorities, labels, tokens,
//! detached headers, a header in the middle of a reencryption (reencrypt keyslot, backup
//! segments, requirements), `--dump-volume-key` and `--dump-json-metadata`. Every header is made by the real
//! cryptsetup; its own dump is the expected output.

use crate::common::*;

const KDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

struct Lab {
    dir: tempfile::TempDir,
    cs: String,
}

impl Lab {
    fn new() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), b"dump me").unwrap();
        std::fs::write(dir.path().join("pw2"), b"second").unwrap();
        Lab {
            dir,
            cs: tool("cryptsetup", "cryptsetup-bin"),
        }
    }
    fn p(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }
    fn image(&self, name: &str, mib: u64) -> String {
        let p = self.p(name);
        std::fs::File::create(&p)
            .unwrap()
            .set_len(mib << 20)
            .unwrap();
        p
    }
    fn cs(&self, args: &[&str]) -> String {
        ok(&run_in(&self.cs, args, b""))
    }
    /// cryptsetup's and cryptblk's output for the same arguments must be identical.
    fn same(&self, args: &[&str]) {
        let want = self.cs(args);
        let got = ok(&run_in(bin(), args, b""));
        assert_eq!(got, want, "cryptblk {args:?} differs from cryptsetup's");
    }
}

#[test]
fn luks1_dumps_match_cryptsetup() {
    let lab = Lab::new();
    let (pw, pw2) = (lab.p("pw"), lab.p("pw2"));
    for (name, cipher, bits) in [
        ("a.img", "aes-xts-plain64", "512"),
        ("b.img", "aes-cbc-essiv:sha256", "256"),
    ] {
        let img = lab.image(name, 8);
        let mut args = vec![
            "luksFormat",
            "-q",
            "--type",
            "luks1",
            "-c",
            cipher,
            "-s",
            bits,
        ];
        args.extend(["--pbkdf-force-iterations", "1000", "--key-file", &pw, &img]);
        lab.cs(&args);
        lab.cs(&[
            "luksAddKey",
            "-q",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            &pw,
            &img,
            &pw2,
        ]);
        lab.cs(&["luksKillSlot", "-q", &img, "0", "--key-file", &pw2]);
        lab.same(&["luksDump", &img]);
        lab.same(&[
            "luksDump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            &pw2,
            &img,
        ]);
    }
}

#[test]
fn luks2_dumps_match_cryptsetup() {
    let lab = Lab::new();
    let (pw, pw2) = (lab.p("pw"), lab.p("pw2"));
    // PBKDF2, a label and subsystem, a second keyslot (Argon2id) preferred, a token.
    let img = lab.image("c.img", 32);
    let mut args = vec![
        "luksFormat",
        "-q",
        "--type",
        "luks2",
        "--label",
        "db",
        "--subsystem",
    ];
    args.extend(["ceph", "--key-file", &pw, &img]);
    args.extend(KDF);
    lab.cs(&args);
    lab.cs(&[
        "luksAddKey",
        "-q",
        "--pbkdf",
        "argon2id",
        "--pbkdf-force-iterations",
        "4",
        "--pbkdf-memory",
        "32768",
        "--key-file",
        &pw,
        &img,
        &pw2,
    ]);
    lab.cs(&["config", &img, "--priority", "prefer", "--key-slot", "1"]);
    lab.cs(&[
        "token",
        "add",
        "--key-description",
        "cryptblk:test",
        "--key-slot",
        "1",
        &img,
    ]);
    lab.same(&["luksDump", &img]);
    lab.same(&["luksDump", "--dump-json-metadata", &img]);
    lab.same(&[
        "luksDump",
        "--dump-volume-key",
        "-q",
        "--key-file",
        &pw,
        &img,
    ]);
    // A detached header, 512-byte sectors, another cipher.
    let hdr = lab.image("d.hdr", 16);
    let data = lab.image("d.img", 8);
    let mut args = vec![
        "luksFormat",
        "-q",
        "--type",
        "luks2",
        "--header",
        &hdr,
        "-c",
    ];
    args.extend(["aes-cbc-essiv:sha256", "-s", "256", "--sector-size", "512"]);
    args.extend(KDF);
    args.extend(["--key-file", &pw, &data]);
    lab.cs(&args);
    lab.same(&["luksDump", &hdr]);
    // In the middle of a reencryption: reencrypt keyslot, backups, requirement, the new
    // key's keyslot.
    let img = lab.image("e.img", 32);
    let mut args = vec![
        "luksFormat",
        "-q",
        "--type",
        "luks2",
        "--key-file",
        &pw,
        &img,
    ];
    args.extend(KDF);
    lab.cs(&args);
    let mut args = vec![
        "reencrypt",
        "-q",
        "--init-only",
        "--force-offline-reencrypt",
    ];
    args.extend(["--key-file", &pw, &img]);
    args.extend(KDF);
    lab.cs(&args);
    lab.same(&["luksDump", &img]);
    lab.same(&["luksDump", "--dump-json-metadata", &img]);
}
