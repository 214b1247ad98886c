//! `cryptblk reencrypt --decrypt --header NEWFILE DEVICE` of a device that holds its own
//! LUKS2 header: the header moves to NEWFILE and the plaintext to the head of the device
//! (cryptsetup's decryption with datashift), checked against the real cryptsetup 2.6: the
//! device and metadata after `--init-only` are cryptsetup's, byte for byte and field for
//! field; either tool finishes what the other started; killed (SIGKILL) at every sync,
//! no data is lost and either tool finishes (or, killed before the metadata is written,
//! the header file opens the untouched volume).

use crate::common::*;

const MIB: usize = 1 << 20;
const KDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
/// 40 MiB device: a 16 MiB header, 24 MiB of data.
const DEV: usize = 40 * MIB;
const SHIFT: usize = 16 * MIB;
const DATA: usize = DEV - SHIFT;

struct Lab {
    dir: tempfile::TempDir,
    cs: String,
    plain: Vec<u8>,
    /// The encrypted device before any decryption.
    image: Vec<u8>,
}

impl Lab {
    fn new() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), b"take the header off").unwrap();
        let cs = tool("cryptsetup", "cryptsetup-bin");
        let img = dir.path().join("made.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(DEV as u64)
            .unwrap();
        let (img_s, pw) = (img.to_str().unwrap(), dir.path().join("pw"));
        let mut args = vec![
            "luksFormat",
            "-q",
            "--type",
            "luks2",
            "--sector-size",
            "512",
        ];
        args.extend(KDF);
        args.extend(["--key-file", pw.to_str().unwrap(), img_s]);
        ok(&cryptsetup(&cs, &args));
        let plain: Vec<u8> = (0..DATA).map(|i| (i * 97 + i / 4091) as u8).collect();
        let src = dir.path().join("plain");
        std::fs::write(&src, &plain).unwrap();
        ok(&run_in(
            bin(),
            &[
                "import",
                img_s,
                src.to_str().unwrap(),
                "--key-file",
                pw.to_str().unwrap(),
            ],
            b"",
        ));
        let image = std::fs::read(&img).unwrap();
        Lab {
            dir,
            cs,
            plain,
            image,
        }
    }
    fn p(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }
    /// A fresh copy of the encrypted device, and a header file name not yet taken.
    fn device(&self, name: &str) -> (String, String) {
        let img = self.p(&format!("{name}.img"));
        std::fs::write(&img, &self.image).unwrap();
        let hdr = self.p(&format!("{name}.hdr"));
        let _ = std::fs::remove_file(&hdr);
        (img, hdr)
    }
    fn cs(&self, args: &[&str]) -> std::process::Output {
        cryptsetup(&self.cs, args)
    }
    fn args<'a>(&'a self, img: &'a str, hdr: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let pw = Box::leak(self.p("pw").into_boxed_str());
        let mut a = vec!["reencrypt", "-q", "--header", hdr, img, "--key-file", pw];
        // The reencryption digest at the 1000-iteration floor, not 125 ms calibrated: both
        // tools verify it at every resume of the kill loops.
        a.extend(KDF);
        a.extend(extra);
        a
    }
    fn cb(&self, img: &str, hdr: &str, extra: &[&str]) -> std::process::Output {
        run_in(bin(), &self.args(img, hdr, extra), b"")
    }
    fn cs_job(&self, img: &str, hdr: &str, extra: &[&str]) -> std::process::Output {
        let mut a = self.args(img, hdr, extra);
        a.push("--force-offline-reencrypt");
        self.cs(&a)
    }
    fn json(&self, hdr: &str) -> serde_json::Value {
        let out = ok(&self.cs(&["luksDump", "--dump-json-metadata", hdr]));
        serde_json::from_str(&out).unwrap()
    }
    fn in_progress(&self, hdr: &str) -> bool {
        let out = self.cs(&["luksDump", "--dump-json-metadata", hdr]);
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("online-reencrypt")
    }
    /// The finished decryption: the plaintext at the head of the device, and a header
    /// file with one plaintext segment and no keyslot left (as cryptsetup leaves it).
    fn check(&self, img: &str, hdr: &str, what: &str) {
        assert!(!self.in_progress(hdr), "{what}: still in progress");
        let meta = self.json(hdr);
        assert_eq!(
            meta["segments"],
            serde_json::json!({"0": {"type": "linear", "offset": "0", "size": "dynamic"}}),
            "{what}"
        );
        assert_eq!(
            meta["keyslots"],
            serde_json::json!({}),
            "{what}: keyslots left"
        );
        let raw = std::fs::read(img).unwrap();
        assert!(raw[..DATA] == *self.plain, "{what}: plaintext at the head");
    }
}

impl Lab {
    /// Whether cryptsetup 2.6 can resume the job from where it stands. It cannot, on its
    /// own jobs either: when every regular segment is plaintext and the job is not
    /// finished (it runs the moved segment's step again over plaintext, decrypting the
    /// device's first bytes a second time), nor when the moved segment's step comes first
    /// and that segment is shorter than the shift (it sizes the step by the shift and
    /// fails, "Failed to write reencryption resilience metadata"). There, cryptblk
    /// finishes.
    fn cryptsetup_resumes(&self, hdr: &str, moved_is_shift: bool) -> bool {
        let segs = self.json(hdr)["segments"].clone();
        let regular: Vec<&serde_json::Value> = segs
            .as_object()
            .unwrap()
            .values()
            .filter(|s| s.get("flags").is_none())
            .collect();
        let offset =
            |s: &serde_json::Value| s["offset"].as_str().unwrap().parse::<usize>().unwrap();
        if regular
            .iter()
            .any(|s| s["type"] == "crypt" && offset(s) >= SHIFT)
        {
            return true;
        }
        moved_is_shift && regular.iter().any(|s| s["type"] == "crypt")
    }
}

#[test]
fn decrypts_with_the_header_moved_to_a_file_as_cryptsetup_does() {
    let lab = Lab::new();
    for extra in [&[][..], &["--hotzone-size", "4M"][..]] {
        let (img, hdr) = lab.device("mine");
        let mut init = extra.to_vec();
        init.extend(["--decrypt", "--init-only"]);
        ok(&lab.cb(&img, &hdr, &init));
        let (theirs, theirs_hdr) = lab.device("theirs");
        ok(&lab.cs_job(&theirs, &theirs_hdr, &init));
        assert_eq!(
            crate::metadata_shape(lab.json(&hdr)),
            crate::metadata_shape(lab.json(&theirs_hdr)),
            "{extra:?}: metadata differs from cryptsetup's"
        );
        assert!(
            std::fs::read(&img).unwrap() == std::fs::read(&theirs).unwrap(),
            "{extra:?}: the device differs from cryptsetup's after the init"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&hdr).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "header file mode");
        ok(&lab.cb(&img, &hdr, &["--resume-only"]));
        lab.check(&img, &hdr, "cryptblk");
    }
    // The whole job in one command.
    let (img, hdr) = lab.device("whole");
    ok(&lab.cb(&img, &hdr, &["--decrypt"]));
    lab.check(&img, &hdr, "one command");
}

#[test]
fn either_tool_finishes_a_decryption_the_other_started() {
    let lab = Lab::new();
    let init = ["--decrypt", "--init-only", "--hotzone-size", "4M"];
    let (img, hdr) = lab.device("a");
    ok(&lab.cb(&img, &hdr, &init));
    ok(&lab.cs_job(&img, &hdr, &["--resume-only"]));
    lab.check(&img, &hdr, "cryptsetup finished cryptblk's job");
    let (img, hdr) = lab.device("b");
    ok(&lab.cs_job(&img, &hdr, &init));
    ok(&lab.cb(&img, &hdr, &["--resume-only"]));
    lab.check(&img, &hdr, "cryptblk finished cryptsetup's job");
}

#[test]
fn a_decryption_killed_at_every_sync_loses_nothing() {
    let lab = Lab::new();
    let strace = tool("strace", "strace");
    let pw = lab.p("pw");
    // Default: the moved segment is the shift (16 MiB), one 8 MiB step before it; with
    // --hotzone-size 4M: a 4 MiB moved segment, a 16 MiB and a 4 MiB step before it.
    for (extra, moved_is_shift) in [(&[][..], true), (&["--hotzone-size", "4M"][..], false)] {
        let mut n = 1;
        loop {
            let (img, hdr) = lab.device("k");
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
            let mut job = vec!["--decrypt"];
            job.extend(extra);
            s.extend(lab.args(&img, &hdr, &job));
            if run_in(&strace, &s, b"").status.success() {
                assert!(n > 8, "the job has more than {n} syncs");
                break;
            }
            let what = format!("{extra:?}: killed at sync {n}");
            let exists = std::path::Path::new(&hdr).exists();
            let finished = exists
                && lab.cs(&["isLuks", &hdr]).status.success()
                && lab.json(&hdr)["segments"]["0"]["type"] == "linear"
                && !lab.in_progress(&hdr);
            let started = exists && lab.in_progress(&hdr);
            if finished {
                // Killed in the finishing commit, after its first header copy.
            } else if !started {
                // Killed before the metadata: the device's header is still there, or the file
                // is a whole copy of it and the data at its old place is untouched.
                if lab.cs(&["isLuks", &img]).status.success() {
                    let _ = std::fs::remove_file(&hdr);
                } else {
                    let raw = std::fs::read(&img).unwrap();
                    assert!(raw[SHIFT..] == lab.image[SHIFT..], "{what}: data changed");
                    ok(&lab.cs(&[
                        "open",
                        "--test-passphrase",
                        "--header",
                        &hdr,
                        "--key-file",
                        &pw,
                        &img,
                    ]));
                    // The way back: the header restored from the file, the job run again.
                    ok(&run_in(
                        bin(),
                        &["header-restore", "-q", "--header-backup-file", &hdr, &img],
                        b"",
                    ));
                    std::fs::remove_file(&hdr).unwrap();
                }
                ok(&lab.cb(&img, &hdr, &["--decrypt"]));
            } else if n % 2 == 0 {
                ok(&lab.cs(&["repair", "-q", "--key-file", &pw, "--header", &hdr, &img]));
                if lab.in_progress(&hdr) {
                    if lab.cryptsetup_resumes(&hdr, moved_is_shift) {
                        ok(&lab.cs_job(&img, &hdr, &["--resume-only"]));
                    } else {
                        ok(&lab.cb(&img, &hdr, &["--resume-only"]));
                    }
                }
            } else {
                ok(&lab.cb(&img, &hdr, &["--resume-only"]));
            }
            lab.check(&img, &hdr, &what);
            n += 1;
        }
    }
}

#[test]
fn a_decryption_that_cannot_move_the_header_is_refused_and_changes_nothing() {
    let lab = Lab::new();
    let (img, hdr) = lab.device("r");
    for (extra, why) in [
        (
            vec!["--decrypt", "--hotzone-size", "32M"],
            "moved segment over the shift",
        ),
        (vec!["--resume-only"], "nothing to resume"),
    ] {
        let out = lab.cb(&img, &hdr, &extra);
        assert!(!out.status.success(), "{why}: accepted");
        assert!(
            std::fs::read(&img).unwrap() == lab.image,
            "{why}: device changed"
        );
        assert!(
            !std::path::Path::new(&hdr).exists(),
            "{why}: header file left"
        );
    }
    // A wrong passphrase: refused before anything is written.
    std::fs::write(lab.p("wrong"), b"not it").unwrap();
    let wrong = lab.p("wrong");
    let out = run_in(
        bin(),
        &[
            "reencrypt",
            "-q",
            "--decrypt",
            "--header",
            &hdr,
            &img,
            "--key-file",
            &wrong,
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(std::fs::read(&img).unwrap() == lab.image, "device changed");
    assert!(!std::path::Path::new(&hdr).exists(), "header file left");
}
