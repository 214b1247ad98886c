//! `cryptblk reencrypt --encrypt/--decrypt --header FILE`: a device full of plaintext encrypted in
//! place under a new detached LUKS2 header, in cryptsetup's on-disk format: cryptsetup
//! opens the result and an independent AES-XTS with the key it dumps decrypts the data;
//! either tool finishes what the other started; killed (SIGKILL) at every sync, the data
//! is intact (plaintext untouched when the header never got written) and either tool
//! finishes.

use crate::common::*;

const MIB: usize = 1 << 20;
const KDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

struct Lab {
    dir: tempfile::TempDir,
    cs: String,
    plain: Vec<u8>,
}

impl Lab {
    fn new() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), b"encrypt in place").unwrap();
        let plain = (0..16 * MIB).map(|i| (i * 131 + i / 4099) as u8).collect();
        Lab {
            dir,
            cs: tool("cryptsetup", "cryptsetup-bin"),
            plain,
        }
    }
    fn p(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }
    /// A fresh plaintext device and no header file.
    fn device(&self) -> (String, String) {
        let (img, hdr) = (self.p("d.img"), self.p("d.hdr"));
        std::fs::write(&img, &self.plain).unwrap();
        let _ = std::fs::remove_file(&hdr);
        (img, hdr)
    }
    fn cs(&self, args: &[&str]) -> std::process::Output {
        cryptsetup(&self.cs, args)
    }
    fn cb_args<'a>(&'a self, img: &'a str, hdr: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let pw = Box::leak(self.p("pw").into_boxed_str());
        let mut a = vec!["reencrypt", "-q", img, "--header", hdr, "--key-file", pw];
        a.extend(KDF);
        a.extend(extra);
        a
    }
    fn in_progress(&self, hdr: &str) -> bool {
        let out = self.cs(&["luksDump", "--dump-json-metadata", hdr]);
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("online-reencrypt")
    }
    /// cryptsetup finishes the job (a cut-off step repaired first, as offline it must be).
    fn cs_resume(&self, img: &str, hdr: &str) {
        let pw = self.p("pw");
        let out = self.cs(&["repair", "-q", "--header", hdr, "--key-file", &pw, img]);
        ok(&out);
        if self.in_progress(hdr) {
            ok(&self.cs(&[
                "reencrypt",
                "-q",
                "--resume-only",
                "--force-offline-reencrypt",
                "--header",
                hdr,
                "--key-file",
                &pw,
                img,
            ]));
        }
    }
    /// The finished volume: cryptsetup accepts the passphrase, cryptblk reads the
    /// plaintext back, and AES-XTS with the key cryptsetup dumps decrypts the raw device.
    fn check(&self, img: &str, hdr: &str, what: &str) {
        assert!(!self.in_progress(hdr), "{what}: still in progress");
        let pw = self.p("pw");
        ok(&self.cs(&[
            "open",
            "--test-passphrase",
            "--header",
            hdr,
            "--key-file",
            &pw,
            img,
        ]));
        let out = self.p("out");
        let _ = std::fs::remove_file(&out);
        ok(&run_in(
            bin(),
            &["export", img, &out, "--header", hdr, "--key-file", &pw],
            b"",
        ));
        assert!(
            std::fs::read(&out).unwrap() == self.plain,
            "{what}: plaintext"
        );
        let dump = ok(&self.cs(&[
            "luksDump",
            "--dump-volume-key",
            "-q",
            "--header",
            hdr,
            "--key-file",
            &pw,
            img,
        ]));
        let key = dumped_volume_key(&dump);
        let raw = std::fs::read(img).unwrap();
        assert!(raw[..4096] != self.plain[..4096], "{what}: still plaintext");
        assert!(
            crate::xts::xts_decrypts(&raw, &key, &self.plain),
            "{what}: independent decryption"
        );
    }
}

#[test]
fn encrypts_in_place_and_cryptsetup_agrees() {
    let lab = Lab::new();
    for res in ["checksum", "journal", "none"] {
        let (img, hdr) = lab.device();
        let args = lab.cb_args(
            &img,
            &hdr,
            &["--encrypt", "--resilience", res, "--hotzone-size", "4M"],
        );
        ok(&run_in(bin(), &args, b""));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&hdr).unwrap().permissions().mode() & 0o777,
            0o600
        );
        lab.check(&img, &hdr, res);
        // The header exists now: a second --encrypt with it is refused, nothing changes.
        let before = std::fs::read(&img).unwrap();
        let out = run_in(bin(), &lab.cb_args(&img, &hdr, &["--encrypt"]), b"");
        assert!(!out.status.success());
        assert!(std::fs::read(&img).unwrap() == before);
    }
    // Without a detached header (the data would have to move): refused, nothing written.
    let (img, _) = lab.device();
    let pw = lab.p("pw");
    let out = run_in(
        bin(),
        &["reencrypt", "-q", "--encrypt", &img, "--key-file", &pw],
        b"",
    );
    assert!(!out.status.success());
    assert!(std::fs::read(&img).unwrap() == lab.plain);
}

#[test]
fn either_tool_finishes_what_the_other_started() {
    let lab = Lab::new();
    // cryptblk starts (metadata only), cryptsetup finishes.
    let (img, hdr) = lab.device();
    ok(&run_in(
        bin(),
        &lab.cb_args(&img, &hdr, &["--encrypt", "--init-only"]),
        b"",
    ));
    assert!(lab.in_progress(&hdr));
    lab.cs_resume(&img, &hdr);
    lab.check(&img, &hdr, "cryptsetup finished cryptblk's job");
    // cryptsetup starts, cryptblk finishes.
    let (img, hdr) = lab.device();
    let pw = lab.p("pw");
    let mut args = vec![
        "reencrypt",
        "-q",
        "--encrypt",
        "--init-only",
        "--force-offline-reencrypt",
    ];
    args.extend(["--header", &hdr, "--key-file", &pw, &img]);
    args.extend(KDF);
    ok(&lab.cs(&args));
    ok(&run_in(
        bin(),
        &lab.cb_args(&img, &hdr, &["--resume-only"]),
        b"",
    ));
    lab.check(&img, &hdr, "cryptblk finished cryptsetup's job");
}

#[test]
fn killed_at_every_sync_the_data_survives_and_either_tool_finishes() {
    let lab = Lab::new();
    let strace = tool("strace", "strace");
    for res in ["checksum", "journal"] {
        let mut n = 1;
        loop {
            let (img, hdr) = lab.device();
            let extra = ["--encrypt", "--resilience", res, "--hotzone-size", "4M"];
            let inject = format!("inject=fdatasync,fsync:signal=SIGKILL:when={n}");
            let mut s = vec![
                "-f",
                "-o",
                "/dev/null",
                "-e",
                "trace=fdatasync,fsync",
                "-e",
                &inject,
                bin(),
            ];
            s.extend(lab.cb_args(&img, &hdr, &extra));
            if run_in(&strace, &s, b"").status.success() {
                assert!(n > 10, "{res}: the job has more than {n} syncs");
                break;
            }
            let what = format!("{res}, killed at sync {n}");
            let valid = lab.cs(&["isLuks", &hdr]).status.success();
            if !valid {
                // Killed before the header was written: the plaintext is untouched.
                assert!(
                    std::fs::read(&img).unwrap() == lab.plain,
                    "{what}: plaintext changed"
                );
            } else if n % 2 == 0 {
                lab.cs_resume(&img, &hdr);
                lab.check(&img, &hdr, &what);
            } else {
                // (Killed after the finishing commit, there is nothing left to resume.)
                if lab.in_progress(&hdr) {
                    let args = lab.cb_args(&img, &hdr, &["--resume-only"]);
                    ok(&run_in(bin(), &args, b""));
                }
                lab.check(&img, &hdr, &what);
            }
            n += 1;
        }
    }
}

impl Lab {
    /// An encrypted device (cryptblk's `--encrypt`) with its detached header.
    fn encrypted(&self) -> (String, String) {
        let (img, hdr) = self.device();
        ok(&run_in(
            bin(),
            &self.cb_args(&img, &hdr, &["--encrypt"]),
            b"",
        ));
        (img, hdr)
    }
    /// Whether a step cut off by a crash is flagged at the very start of the data.
    fn hot_at_start(&self, hdr: &str) -> bool {
        let out = ok(&self.cs(&["luksDump", "--dump-json-metadata", hdr]));
        let j: serde_json::Value = serde_json::from_str(&out).unwrap();
        j["segments"].as_object().unwrap().values().any(|s| {
            s["offset"] == "0"
                && s["flags"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|f| f == "in-reencryption"))
        })
    }
    /// A finished decryption: the device holds the plaintext again; the header says so.
    fn check_plain(&self, img: &str, hdr: &str, what: &str) {
        assert!(!self.in_progress(hdr), "{what}: still in progress");
        assert!(
            std::fs::read(img).unwrap() == self.plain,
            "{what}: not the plaintext"
        );
        let dump = ok(&self.cs(&["luksDump", hdr]));
        assert!(dump.contains("0: linear"), "{what}:\n{dump}");
    }
}

#[test]
fn decrypts_in_place_and_either_tool_finishes_what_the_other_started() {
    let lab = Lab::new();
    let pw = lab.p("pw");
    for res in ["checksum", "journal"] {
        let (img, hdr) = lab.encrypted();
        let extra = ["--decrypt", "--resilience", res, "--hotzone-size", "4M"];
        ok(&run_in(bin(), &lab.cb_args(&img, &hdr, &extra), b""));
        lab.check_plain(&img, &hdr, res);
    }
    // cryptblk starts, cryptsetup finishes.
    let (img, hdr) = lab.encrypted();
    let args = lab.cb_args(&img, &hdr, &["--decrypt", "--init-only"]);
    ok(&run_in(bin(), &args, b""));
    assert!(lab.in_progress(&hdr));
    lab.cs_resume(&img, &hdr);
    lab.check_plain(&img, &hdr, "cryptsetup finished cryptblk's decryption");
    // cryptsetup starts (backward, as it decrypts), cryptblk finishes.
    let (img, hdr) = lab.encrypted();
    let mut args = vec![
        "reencrypt",
        "-q",
        "--decrypt",
        "--init-only",
        "--force-offline-reencrypt",
    ];
    args.extend(["--header", &hdr, "--key-file", &pw, &img]);
    ok(&lab.cs(&args));
    ok(&run_in(
        bin(),
        &lab.cb_args(&img, &hdr, &["--resume-only"]),
        b"",
    ));
    lab.check_plain(&img, &hdr, "cryptblk finished cryptsetup's decryption");
    // An attached header: refused (the plaintext would end up behind it).
    let img2 = lab.p("att.img");
    std::fs::File::create(&img2)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let mut args = vec![
        "luksFormat",
        "-q",
        "--type",
        "luks2",
        "--key-file",
        &pw,
        &img2,
    ];
    args.extend(KDF);
    ok(&lab.cs(&args));
    let out = run_in(
        bin(),
        &["reencrypt", "-q", "--decrypt", &img2, "--key-file", &pw],
        b"",
    );
    assert!(!out.status.success());
    assert!(!lab.in_progress(&img2));
}

#[test]
fn a_decryption_killed_at_every_sync_is_finished_by_either_tool() {
    let lab = Lab::new();
    let strace = tool("strace", "strace");
    let (img0, hdr0) = lab.encrypted();
    let (img, hdr) = (lab.p("k.img"), lab.p("k.hdr"));
    let mut n = 1;
    loop {
        std::fs::copy(&img0, &img).unwrap();
        std::fs::copy(&hdr0, &hdr).unwrap();
        let extra = ["--decrypt", "--hotzone-size", "4M"];
        let inject = format!("inject=fdatasync,fsync:signal=SIGKILL:when={n}");
        let mut s = vec![
            "-f",
            "-o",
            "/dev/null",
            "-e",
            "trace=fdatasync,fsync",
            "-e",
            &inject,
            bin(),
        ];
        s.extend(lab.cb_args(&img, &hdr, &extra));
        if run_in(&strace, &s, b"").status.success() {
            assert!(n > 8, "the job has more than {n} syncs");
            break;
        }
        let what = format!("decryption killed at sync {n}");
        if lab.in_progress(&hdr) {
            if n % 2 == 0 {
                // cryptsetup 2.6.1's offline `repair` does not recover the last step of a
                // backward decryption (the zone at offset 0): run on a state cryptsetup
                // itself left there, it leaves that zone encrypted. cryptblk's read-write
                // open recovers it; then cryptsetup finishes.
                // (Recovering the last step finishes the job: the open that recovered it
                // then says the volume is plaintext now, which is no failure here.)
                if lab.hot_at_start(&hdr) {
                    let pw = lab.p("pw");
                    let args = [
                        "import",
                        &img,
                        "/dev/null",
                        "--header",
                        &hdr,
                        "--key-file",
                        &pw,
                    ];
                    let _ = run_in(bin(), &args, b"");
                    assert!(!lab.hot_at_start(&hdr), "{what}: not recovered");
                }
                if lab.in_progress(&hdr) {
                    lab.cs_resume(&img, &hdr);
                }
            } else {
                let args = lab.cb_args(&img, &hdr, &["--resume-only"]);
                ok(&run_in(bin(), &args, b""));
            }
        }
        lab.check_plain(&img, &hdr, &what);
        n += 1;
    }
}
