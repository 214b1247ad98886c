//! `cryptblk reencrypt --encrypt --reduce-device-size`: a device full of plaintext
//! encrypted in place with its LUKS2 header at its head (cryptsetup's data move), checked
//! against the real cryptsetup: the metadata cryptblk writes is cryptsetup's, field for
//! field; either tool finishes what the other started; killed (SIGKILL) at every sync,
//! the data survives and either tool finishes; cryptsetup opens the result and an
//! independent AES-XTS with the key it dumps decrypts the data.

use crate::common::*;

const MIB: usize = 1 << 20;
const KDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
/// 25 MiB device, `--reduce-device-size 4M`: a 2 MiB header, 21 MiB of data (ten 2 MiB
/// steps and a 1 MiB remainder), a 2 MiB copy of the data's start at the end.
const DEV: usize = 25 * MIB;
const SHIFT: usize = 2 * MIB;
const DATA: usize = DEV - 2 * SHIFT;

struct Lab {
    dir: tempfile::TempDir,
    cs: String,
    /// The device's contents before: the first `DATA` bytes are what must survive.
    before: Vec<u8>,
}

impl Lab {
    fn new() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), b"move and encrypt").unwrap();
        let before = (0..DEV).map(|i| (i * 151 + i / 4093) as u8).collect();
        Lab {
            dir,
            cs: tool("cryptsetup", "cryptsetup-bin"),
            before,
        }
    }
    fn p(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }
    fn plain(&self) -> &[u8] {
        &self.before[..DATA]
    }
    /// A fresh plaintext device.
    fn device(&self) -> String {
        let img = self.p("d.img");
        std::fs::write(&img, &self.before).unwrap();
        img
    }
    fn cs(&self, args: &[&str]) -> std::process::Output {
        cryptsetup(&self.cs, args)
    }
    fn cb_args<'a>(&'a self, img: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let pw = Box::leak(self.p("pw").into_boxed_str());
        let mut a = vec!["reencrypt", "-q", img, "--key-file", pw];
        a.extend(KDF);
        a.extend(extra);
        a
    }
    fn cs_args<'a>(&'a self, img: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let mut a = self.cb_args(img, extra);
        a.push("--force-offline-reencrypt");
        a
    }
    fn json(&self, img: &str) -> serde_json::Value {
        let out = ok(&self.cs(&["luksDump", "--dump-json-metadata", img]));
        serde_json::from_str(&out).unwrap()
    }
    fn in_progress(&self, img: &str) -> bool {
        let out = self.cs(&["luksDump", "--dump-json-metadata", img]);
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("online-reencrypt")
    }
    /// cryptsetup finishes the job (a cut-off step repaired first, as offline it must be).
    /// cryptsetup 2.6 cannot finish a data move stopped after its last step and before
    /// its finishing commit (its own too: "Failed to set device segments for next
    /// reencryption hotzone"); there, and only there, cryptblk finishes it.
    fn cs_resume(&self, img: &str) {
        let pw = self.p("pw");
        ok(&self.cs(&["repair", "-q", "--key-file", &pw, img]));
        if !self.in_progress(img) {
            return;
        }
        let out = self.cs(&self.cs_args(img, &["--resume-only"]));
        if !out.status.success() {
            let segs = self.json(img)["segments"].clone();
            let regular: Vec<_> = segs
                .as_object()
                .unwrap()
                .values()
                .filter(|s| s.get("flags").is_none())
                .collect();
            assert!(
                regular.len() == 1 && regular[0]["type"] == "crypt",
                "cryptsetup could not resume: {}\n{segs}",
                String::from_utf8_lossy(&out.stderr)
            );
            ok(&run_in(bin(), &self.cb_args(img, &["--resume-only"]), b""));
        }
    }
    /// The finished volume: cryptsetup accepts the passphrase and `repair` finds nothing
    /// to change, cryptblk reads the data back, AES-XTS with the key cryptsetup dumps
    /// decrypts the raw device, and the copy of the data's start is gone.
    fn check(&self, img: &str, what: &str) {
        assert!(!self.in_progress(img), "{what}: still in progress");
        let pw = self.p("pw");
        ok(&self.cs(&["open", "--test-passphrase", "--key-file", &pw, img]));
        let meta = self.json(img);
        ok(&self.cs(&["repair", "-q", "--key-file", &pw, img]));
        assert_eq!(self.json(img), meta, "{what}: repair changed the metadata");
        assert_eq!(meta["segments"]["0"]["offset"], SHIFT.to_string(), "{what}");
        let out = self.p("out");
        let _ = std::fs::remove_file(&out);
        ok(&run_in(
            bin(),
            &["export", img, &out, "--key-file", &pw],
            b"",
        ));
        let got = std::fs::read(&out).unwrap();
        // cryptsetup hands the copy's space back: the volume ends at the device's end.
        assert_eq!(got.len(), DEV - SHIFT, "{what}: volume size");
        assert!(got[..DATA] == *self.plain(), "{what}: data");
        let dump = ok(&self.cs(&[
            "luksDump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            &pw,
            img,
        ]));
        let key = dumped_volume_key(&dump);
        let raw = std::fs::read(img).unwrap();
        assert!(
            crate::xts::xts_decrypts(&raw[SHIFT..SHIFT + DATA], &key, self.plain()),
            "{what}: independent decryption"
        );
        assert!(
            raw[DEV - SHIFT..] != self.before[..SHIFT],
            "{what}: the copy of the data's start was left on the device"
        );
    }
}

#[test]
fn encrypts_with_the_header_on_the_device_as_cryptsetup_does() {
    let lab = Lab::new();
    // The metadata after --init-only: cryptsetup's, field for field.
    let img = lab.device();
    ok(&run_in(
        bin(),
        &lab.cb_args(
            &img,
            &["--encrypt", "--reduce-device-size", "4M", "--init-only"],
        ),
        b"",
    ));
    let mine = crate::metadata_shape(lab.json(&img));
    let raw = std::fs::read(&img).unwrap();
    assert!(
        raw[DEV - SHIFT..] == lab.before[..SHIFT],
        "the data's start was not copied"
    );
    assert!(
        raw[SHIFT..DEV - SHIFT] == lab.before[SHIFT..DEV - SHIFT],
        "data moved too early"
    );
    let theirs_img = lab.p("cs.img");
    std::fs::write(&theirs_img, &lab.before).unwrap();
    ok(&lab.cs(&lab.cs_args(
        &theirs_img,
        &["--encrypt", "--reduce-device-size", "4M", "--init-only"],
    )));
    assert_eq!(
        mine,
        crate::metadata_shape(lab.json(&theirs_img)),
        "metadata differs from cryptsetup's"
    );
    // The whole job, then a second --encrypt on the encrypted device: refused, unchanged.
    let img = lab.device();
    ok(&run_in(
        bin(),
        &lab.cb_args(&img, &["--encrypt", "--reduce-device-size", "4M"]),
        b"",
    ));
    lab.check(&img, "cryptblk");
    let done = std::fs::read(&img).unwrap();
    let out = run_in(
        bin(),
        &lab.cb_args(&img, &["--encrypt", "--reduce-device-size", "4M"]),
        b"",
    );
    assert!(!out.status.success());
    assert!(
        std::fs::read(&img).unwrap() == done,
        "a refused --encrypt changed the device"
    );
}

#[test]
fn either_tool_finishes_a_data_move_encryption_the_other_started() {
    let lab = Lab::new();
    let img = lab.device();
    let init = ["--encrypt", "--reduce-device-size", "4M", "--init-only"];
    ok(&run_in(bin(), &lab.cb_args(&img, &init), b""));
    assert!(lab.in_progress(&img));
    lab.cs_resume(&img);
    lab.check(&img, "cryptsetup finished cryptblk's job");
    let img = lab.device();
    ok(&lab.cs(&lab.cs_args(&img, &init)));
    ok(&run_in(bin(), &lab.cb_args(&img, &["--resume-only"]), b""));
    lab.check(&img, "cryptblk finished cryptsetup's job");
}

#[test]
fn a_data_move_encryption_killed_at_every_sync_is_finished_by_either_tool() {
    let lab = Lab::new();
    let strace = tool("strace", "strace");
    let mut n = 1;
    loop {
        let img = lab.device();
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
        s.extend(lab.cb_args(&img, &["--encrypt", "--reduce-device-size", "4M"]));
        if run_in(&strace, &s, b"").status.success() {
            assert!(n > 10, "the job has more than {n} syncs");
            break;
        }
        let what = format!("killed at sync {n}");
        if !lab.cs(&["isLuks", &img]).status.success() {
            // Killed before a header copy was complete: the data in place is untouched
            // and its start is in place or in the copy at the end.
            let raw = std::fs::read(&img).unwrap();
            assert!(
                raw[SHIFT..DATA] == lab.before[SHIFT..DATA],
                "{what}: data changed"
            );
            assert!(
                raw[..SHIFT] == lab.before[..SHIFT] || raw[DEV - SHIFT..] == lab.before[..SHIFT],
                "{what}: the data's start is lost"
            );
        } else if n % 2 == 0 {
            lab.cs_resume(&img);
            lab.check(&img, &what);
        } else {
            if lab.in_progress(&img) {
                ok(&run_in(bin(), &lab.cb_args(&img, &["--resume-only"]), b""));
            }
            lab.check(&img, &what);
        }
        n += 1;
    }
}

#[test]
fn a_data_move_that_does_not_fit_or_is_misused_is_refused_and_changes_nothing() {
    let lab = Lab::new();
    let pw = lab.p("pw");
    let small = lab.p("small.img");
    let refused = |img: &str, args: &[&str], why: &str| {
        let before = std::fs::read(img).unwrap();
        let out = run_in(bin(), args, b"");
        assert!(!out.status.success(), "{why}: accepted");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            std::fs::read(img).unwrap() == before,
            "{why}: the device changed"
        );
        err
    };
    // 5 MiB cannot hold a 2 MiB header, a 2 MiB copy and a step's worth of data.
    std::fs::write(&small, &lab.before[..5 * MIB]).unwrap();
    let args = lab.cb_args(&small, &["--encrypt", "--reduce-device-size", "4M"]);
    let err = refused(&small, &args, "too small");
    assert!(err.contains("not enough space"), "{err}");
    let img = lab.device();
    for (extra, why) in [
        (vec!["--reduce-device-size", "4M"], "without --encrypt"),
        (
            vec!["--encrypt"],
            "without --header or --reduce-device-size",
        ),
        (
            vec!["--encrypt", "--reduce-device-size", "4097K"],
            "half not whole 4 KiB blocks",
        ),
        (
            vec!["--encrypt", "--reduce-device-size", "2G"],
            "over 1 GiB",
        ),
        (
            vec!["--encrypt", "--reduce-device-size", "4M", "--header", &pw],
            "with --header",
        ),
    ] {
        refused(&img, &lab.cb_args(&img, &extra), why);
    }
}
