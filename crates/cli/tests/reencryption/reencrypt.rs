//! `cryptblk reencrypt` against the real cryptsetup 2.6, both ways: what one tool starts
//! the other resumes; a process killed (SIGKILL) at every durability point of a job (each
//! fdatasync, via `strace --inject`) leaves a volume that both tools open with the data
//! intact and either finishes; the result is checked against an independent decryption
//! with the new volume key as cryptsetup dumps it.

use crate::common::*;

const MIB: usize = 1 << 20;
const KDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

struct Lab {
    dir: tempfile::TempDir,
    cs: String,
}

impl Lab {
    fn new() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), b"rotate the key").unwrap();
        Lab {
            dir,
            cs: tool("cryptsetup", "cryptsetup-bin"),
        }
    }
    fn p(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }
    fn cs(&self, args: &[&str]) -> std::process::Output {
        cryptsetup(&self.cs, args)
    }
    fn cb(&self, args: &[&str]) -> std::process::Output {
        run_in(bin(), args, b"")
    }
    /// A 48 MiB LUKS2 image (32 MiB of data, `sector`-byte sectors) full of random
    /// plaintext; returns the path and the plaintext.
    fn volume(&self, name: &str, sector: &str) -> (String, Vec<u8>) {
        let img = self.p(name);
        std::fs::File::create(&img)
            .unwrap()
            .set_len(48 * MIB as u64)
            .unwrap();
        let pw = self.p("pw");
        let mut args = vec![
            "luksFormat",
            "-q",
            "--type",
            "luks2",
            "--sector-size",
            sector,
        ];
        args.extend(KDF);
        args.extend(["--key-file", &pw, &img]);
        ok(&self.cs(&args));
        let plain: Vec<u8> = (0..32 * MIB).map(|i| (i * 31 + i / 4093) as u8).collect();
        let src = self.p("plain");
        std::fs::write(&src, &plain).unwrap();
        ok(&self.cb(&["import", &img, &src, "--key-file", &pw]));
        (img, plain)
    }
    fn read(&self, img: &str) -> Vec<u8> {
        let out = self.p("out");
        let _ = std::fs::remove_file(&out);
        ok(&self.cb(&["export", img, &out, "--key-file", &self.p("pw")]));
        std::fs::read(out).unwrap()
    }
    /// cryptblk reencrypt with `args`, killed at its `nth` fdatasync if `kill`.
    fn cb_reencrypt(&self, img: &str, args: &[&str], kill: Option<u32>) -> bool {
        let pw = self.p("pw");
        let mut a: Vec<&str> = vec!["reencrypt", "-q", img, "--key-file", &pw];
        a.extend(KDF);
        a.extend(args);
        match kill {
            None => self.cb(&a).status.success(),
            Some(n) => killed_at("fdatasync", n, bin(), &a),
        }
    }
    /// cryptsetup finishes the job; offline, a cut-off step needs its `repair` first.
    fn cs_resume(&self, img: &str) {
        if self.hot(img) {
            ok(&self.cs(&["repair", "-q", "--key-file", &self.p("pw"), img]));
            if !self.in_reencryption(img) {
                return; // that was the last step
            }
        }
        ok(&self.cs(&[
            "reencrypt",
            "-q",
            "--force-offline-reencrypt",
            "--resume-only",
            "--key-file",
            &self.p("pw"),
            img,
        ]));
    }
    fn json(&self, img: &str) -> serde_json::Value {
        serde_json::from_str(&ok(&self.cs(&["luksDump", "--dump-json-metadata", img]))).unwrap()
    }
    /// Whether a step was cut off: a segment flagged `in-reencryption`.
    fn hot(&self, img: &str) -> bool {
        self.json(img)["segments"]
            .as_object()
            .unwrap()
            .values()
            .any(|s| {
                s["flags"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|f| f == "in-reencryption"))
            })
    }
    fn in_reencryption(&self, img: &str) -> bool {
        self.json(img)["config"]["requirements"]["mandatory"]
            .as_array()
            .is_some_and(|m| m.iter().any(|r| r == "online-reencrypt-v2"))
    }
    /// The volume key as cryptsetup dumps it.
    fn volume_key(&self, img: &str) -> Vec<u8> {
        let out = ok(&self.cs(&[
            "luksDump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            &self.p("pw"),
            img,
        ]));
        dumped_volume_key(&out)
    }
}

/// Runs `program args` under strace, which sends it SIGKILL as it enters its `n`th
/// `call` (a system call); returns whether it exited successfully (it made fewer).
fn killed_at(call: &str, n: u32, program: &str, args: &[&str]) -> bool {
    let trace = format!("trace={call}");
    let inject = format!("inject={call}:signal=SIGKILL:when={n}");
    let mut s = vec![
        "-f",
        "-o",
        "/dev/null",
        "-e",
        &trace,
        "-e",
        &inject,
        program,
    ];
    s.extend(args);
    run_in(&tool("strace", "strace"), &s, b"").status.success()
}

/// Decrypts sectors of a finished image's data area with `key` (AES-256-XTS, plain64 IVs
/// counting 512-byte units as dm-crypt does) by a textbook XTS over RustCrypto's AES block
/// cipher, independently of cryptblk's sector cipher and volume code.
fn decrypt_independently(img: &str, key: &[u8], sector: usize, data: &[u8]) -> bool {
    use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
    let k1 = aes::Aes256::new_from_slice(&key[..32]).unwrap();
    let k2 = aes::Aes256::new_from_slice(&key[32..]).unwrap();
    let raw = std::fs::read(img).unwrap();
    let ct = &raw[16 * MIB..16 * MIB + data.len()];
    let sectors = data.len() / sector;
    for s in [0, 1, sectors / 2, sectors - 1] {
        let mut t = [0u8; 16];
        t[..8].copy_from_slice(&((s * sector / 512) as u64).to_le_bytes());
        let mut tb = aes::Block::from(t);
        k2.encrypt_block(&mut tb);
        let mut t: [u8; 16] = tb.into();
        let mut buf = ct[s * sector..(s + 1) * sector].to_vec();
        for c in buf.chunks_mut(16) {
            let mut b = [0u8; 16];
            for i in 0..16 {
                b[i] = c[i] ^ t[i];
            }
            let mut bb = aes::Block::from(b);
            k1.decrypt_block(&mut bb);
            let b: [u8; 16] = bb.into();
            for i in 0..16 {
                c[i] = b[i] ^ t[i];
            }
            let carry = t[15] >> 7;
            for i in (1..16).rev() {
                t[i] = (t[i] << 1) | (t[i - 1] >> 7);
            }
            t[0] = (t[0] << 1) ^ (carry * 0x87);
        }
        if buf != data[s * sector..(s + 1) * sector] {
            return false;
        }
    }
    true
}

#[test]
fn reencrypts_and_cryptsetup_agrees() {
    let lab = Lab::new();
    for (sector, res) in [("4096", "checksum"), ("512", "journal"), ("4096", "none")] {
        let (img, plain) = lab.volume("a.img", sector);
        let before = lab.volume_key(&img);
        assert!(lab.cb_reencrypt(&img, &["--resilience", res, "--hotzone-size", "8M"], None));
        assert!(!lab.in_reencryption(&img));
        let after = lab.volume_key(&img);
        assert_ne!(before, after, "{res}: a new volume key");
        assert!(lab.read(&img) == plain, "{res}: cryptblk reads it back");
        ok(&lab.cs(&[
            "open",
            "--test-passphrase",
            "--key-file",
            &lab.p("pw"),
            &img,
        ]));
        let j = lab.json(&img);
        assert_eq!(
            j["keyslots"].as_object().unwrap().len(),
            1,
            "{res}: old keyslot gone: {j}"
        );
        assert!(
            decrypt_independently(&img, &after, sector.parse().unwrap(), &plain),
            "{res}: OpenSSL with the new key decrypts the data"
        );
        assert!(
            ok(&lab.cs(&["repair", "-q", "--key-file", &lab.p("pw"), &img])).is_empty()
                || !lab.in_reencryption(&img)
        );
    }
}

#[test]
fn cipher_and_sector_size_change_and_cryptsetup_resumes_what_we_start() {
    let lab = Lab::new();
    let (img, plain) = lab.volume("b.img", "512");
    let args = [
        "--init-only",
        "--key-size",
        "256",
        "--sector-size",
        "4096",
        "--hotzone-size",
        "8M",
    ];
    assert!(lab.cb_reencrypt(&img, &args, None));
    assert!(lab.in_reencryption(&img));
    assert!(lab.read(&img) == plain, "readable right after init");
    lab.cs_resume(&img);
    assert!(!lab.in_reencryption(&img));
    let j = lab.json(&img);
    assert_eq!(j["segments"]["0"]["sector_size"], 4096, "{j}");
    assert_eq!(lab.volume_key(&img).len(), 32);
    assert!(lab.read(&img) == plain);
}

#[test]
fn we_resume_what_cryptsetup_starts_and_refuse_a_second_start() {
    let lab = Lab::new();
    let (img, plain) = lab.volume("c.img", "4096");
    let pw = lab.p("pw");
    let mut args = vec![
        "reencrypt",
        "-q",
        "--force-offline-reencrypt",
        "--init-only",
        "--key-file",
        &pw,
    ];
    args.extend(KDF);
    args.push(&img);
    ok(&lab.cs(&args));
    let o = lab.cb(&["reencrypt", "-q", &img, "--key-file", &pw, "--init-only"]);
    assert!(!o.status.success(), "a second start is refused");
    assert!(lab.in_reencryption(&img));
    assert!(lab.cb_reencrypt(&img, &["--resume-only", "--hotzone-size", "8M"], None));
    assert!(!lab.in_reencryption(&img));
    assert!(lab.read(&img) == plain);
    let wrong = lab.p("wrong");
    std::fs::write(&wrong, b"nope").unwrap();
    let o = lab.cb(&["reencrypt", "-q", &img, "--key-file", &wrong]);
    assert!(!o.status.success(), "wrong passphrase");
    assert!(!lab.in_reencryption(&img), "nothing started");
    let o = lab.cb(&["reencrypt", "-q", &img, "--key-file", &pw, "--resume-only"]);
    assert!(!o.status.success(), "nothing to resume");
}

/// Kills cryptblk at each fdatasync of a whole job (init and four steps); after each kill
/// the data reads back through cryptblk (which recovers an interrupted step) and the
/// other tool finishes the job, alternating which tool finishes.
#[test]
fn killed_at_every_sync_either_tool_finishes() {
    let lab = Lab::new();
    let (img0, plain) = lab.volume("k0.img", "4096");
    for res in ["checksum", "journal"] {
        let mut n = 1;
        loop {
            let img = lab.p("k.img");
            std::fs::copy(&img0, &img).unwrap();
            let args = ["--resilience", res, "--hotzone-size", "8M"];
            if lab.cb_reencrypt(&img, &args, Some(n)) {
                assert!(n > 10, "{res}: the job has more than {n} syncs");
                break;
            }
            let pw = lab.p("pw");
            match n % 3 {
                // cryptsetup recovers and finishes.
                0 => {
                    if lab.in_reencryption(&img) {
                        lab.cs_resume(&img);
                    }
                }
                // cryptblk's read-write open recovers the step; cryptsetup finishes.
                1 => {
                    ok(&lab.cb(&["import", &img, "/dev/null", "--key-file", &pw]));
                    assert!(
                        lab.read(&img) == plain,
                        "{res}, killed at sync {n}: recovered"
                    );
                    if lab.in_reencryption(&img) {
                        lab.cs_resume(&img);
                    }
                }
                // cryptblk resumes.
                _ => {
                    if lab.in_reencryption(&img) {
                        assert!(
                            lab.cb_reencrypt(&img, &["--resume-only"], None),
                            "{res} {n}"
                        );
                    }
                }
            }
            assert!(!lab.in_reencryption(&img), "{res}, killed at sync {n}");
            assert!(
                lab.read(&img) == plain,
                "{res}, killed at sync {n}: finished intact"
            );
            n += 1;
        }
    }
}

/// Kills cryptsetup at each of its syncs (fdatasync after a step's data, fsync after each
/// header copy: inside steps, between a step and its commit, between the last step's
/// commit and the finishing ones) and lets cryptblk finish: the data must come out intact,
/// and a job whose data is all done must be finished, never run again.
#[test]
fn cryptsetup_killed_at_every_sync_we_finish() {
    let lab = Lab::new();
    let (img0, plain) = lab.volume("s0.img", "4096");
    let pw = lab.p("pw");
    for call in ["fdatasync", "fsync"] {
        let mut n = 1;
        loop {
            let img = lab.p("s.img");
            std::fs::copy(&img0, &img).unwrap();
            let mut args = vec![
                "reencrypt",
                "-q",
                "--force-offline-reencrypt",
                "--hotzone-size",
                "8M",
                "--key-file",
                &pw,
            ];
            args.extend(KDF);
            args.push(&img);
            if killed_at(call, n, &lab.cs, &args) {
                assert!(n > 3, "cryptsetup has more than {n} {call} calls");
                break;
            }
            if lab.in_reencryption(&img) {
                assert!(
                    lab.cb_reencrypt(&img, &["--resume-only"], None),
                    "{call} {n}"
                );
            }
            assert!(!lab.in_reencryption(&img));
            assert!(lab.read(&img) == plain, "cryptsetup killed at {call} {n}");
            n += 1;
        }
    }
}

#[test]
fn other_keyslots_need_naming_and_tokens_follow_the_new_key() {
    let lab = Lab::new();
    let (img, plain) = lab.volume("t.img", "4096");
    let pw = lab.p("pw");
    let pw2 = lab.p("pw2");
    std::fs::write(&pw2, b"second passphrase").unwrap();
    let mut add = vec!["luksAddKey", "-q"];
    add.extend(KDF);
    add.extend(["--key-file", &pw, &img, &pw2]);
    ok(&lab.cs(&add));
    let token = lab.p("token.json");
    std::fs::write(&token, br#"{"type":"cryptblk-test","keyslots":["0"]}"#).unwrap();
    ok(&lab.cs(&["token", "import", "--json-file", &token, &img]));
    // Two keyslots and none named: refused, nothing changed.
    assert!(!lab.cb_reencrypt(&img, &[], None));
    assert!(!lab.in_reencryption(&img));
    assert!(lab.cb_reencrypt(&img, &["--key-slot", "0", "--hotzone-size", "8M"], None));
    assert!(!lab.in_reencryption(&img));
    assert!(lab.read(&img) == plain);
    let j = lab.json(&img);
    let slots: Vec<&String> = j["keyslots"].as_object().unwrap().keys().collect();
    assert_eq!(
        slots.len(),
        1,
        "only the named passphrase's new keyslot: {j}"
    );
    assert_eq!(
        j["tokens"]["0"]["keyslots"],
        serde_json::json!([slots[0]]),
        "{j}"
    );
    let o = lab.cs(&["open", "--test-passphrase", "--key-file", &pw2, &img]);
    assert!(
        !o.status.success(),
        "the other passphrase is gone with the old key"
    );
}

#[test]
fn erase_works_in_the_middle_of_a_reencryption() {
    let lab = Lab::new();
    let (img, _) = lab.volume("x.img", "4096");
    assert!(lab.cb_reencrypt(&img, &["--init-only"], None));
    ok(&lab.cb(&["erase", "-q", &img]));
    let o = lab.cs(&[
        "open",
        "--test-passphrase",
        "--key-file",
        &lab.p("pw"),
        &img,
    ]);
    assert!(!o.status.success());
    let o = lab.cb(&["test-passphrase", &img, "--key-file", &lab.p("pw")]);
    assert!(!o.status.success());
}

/// `reencrypt --reduce-device-size 8M` (cryptsetup's backward data shift: the data moves
/// 8 MiB up under the new key, the volume 8 MiB smaller): the metadata cryptblk starts is
/// cryptsetup's, field for field; either tool finishes the other's job; killed at every
/// sync, either tool finishes with the data intact; cryptsetup decrypts the result.
#[test]
fn a_key_change_with_a_data_shift_matches_cryptsetup_and_survives_kills() {
    let lab = Lab::new();
    let (img0, plain) = lab.volume("s0.img", "4096");
    // The volume after the job: 8 MiB less data.
    let kept = &plain[..24 * MIB];
    let shape = |mut j: serde_json::Value| {
        for k in j["keyslots"].as_object_mut().unwrap().values_mut() {
            k.as_object_mut().unwrap().remove("kdf");
        }
        for d in j["digests"].as_object_mut().unwrap().values_mut() {
            for f in ["salt", "digest", "iterations"] {
                d.as_object_mut().unwrap().remove(f);
            }
        }
        j
    };
    let pw = lab.p("pw");
    let init = ["--reduce-device-size", "8M", "--init-only"];
    let (mine, theirs) = (lab.p("m.img"), lab.p("t.img"));
    std::fs::copy(&img0, &mine).unwrap();
    std::fs::copy(&img0, &theirs).unwrap();
    assert!(lab.cb_reencrypt(&mine, &init, None));
    let mut a = vec![
        "reencrypt",
        "-q",
        "--force-offline-reencrypt",
        "--key-file",
        &pw,
    ];
    a.extend(KDF);
    a.extend(init);
    a.push(&theirs);
    ok(&lab.cs(&a));
    assert_eq!(
        shape(lab.json(&mine)),
        shape(lab.json(&theirs)),
        "metadata differs"
    );
    // Each finishes the other's.
    lab.cs_resume(&mine);
    assert!(lab.cb_reencrypt(&theirs, &["--resume-only"], None));
    for img in [&mine, &theirs] {
        assert!(!lab.in_reencryption(img));
        assert_eq!(
            lab.json(img)["segments"]["0"]["offset"],
            (24 * MIB).to_string()
        );
        let back = lab.read(img);
        assert_eq!(back.len(), 24 * MIB, "the volume is 8 MiB smaller");
        assert!(back == kept, "data after the shift");
        let key = lab.volume_key(img);
        let raw = std::fs::read(img).unwrap();
        let tail = lab.p("tail.img");
        std::fs::write(&tail, &raw[8 * MIB..]).unwrap();
        assert!(
            decrypt_independently(&tail, &key, 4096, kept),
            "independent decryption"
        );
    }
    // Killed at every sync: either tool finishes.
    let mut n = 1;
    loop {
        let img = lab.p("k.img");
        std::fs::copy(&img0, &img).unwrap();
        if lab.cb_reencrypt(&img, &["--reduce-device-size", "8M"], Some(n)) {
            assert!(n > 5, "the job has more than {n} syncs");
            break;
        }
        if lab.in_reencryption(&img) {
            if n % 2 == 0 {
                // cryptsetup 2.6.1's repair rewrites the last step of a backward data shift
                // (the zone at the data's start) wrongly, its own jobs' too (checked by
                // killing cryptsetup there): there cryptblk's recovery runs first.
                let j = lab.json(&img);
                let segs = j["segments"].as_object().unwrap();
                let start = segs
                    .values()
                    .find(|s| s["flags"][0] == "backup-final")
                    .unwrap()["offset"]
                    .clone();
                if segs
                    .values()
                    .any(|s| s["flags"][0] == "in-reencryption" && s["offset"] == start)
                {
                    ok(&lab.cb(&["import", &img, "/dev/null", "--key-file", &pw]));
                }
                if lab.in_reencryption(&img) {
                    lab.cs_resume(&img);
                }
            } else {
                assert!(
                    lab.cb_reencrypt(&img, &["--resume-only"], None),
                    "killed at {n}"
                );
            }
        }
        let back = lab.read(&img);
        assert!(back[..24 * MIB] == *kept, "killed at sync {n}: data");
        n += 1;
    }
    // Not enough space: nothing changes.
    let img = lab.p("full.img");
    std::fs::copy(&img0, &img).unwrap();
    let before = std::fs::read(&img).unwrap();
    assert!(!lab.cb_reencrypt(&img, &["--reduce-device-size", "32M"], None));
    assert!(
        std::fs::read(&img).unwrap() == before,
        "a refused shift changed the image"
    );
}

/// Images whose reencryption step was cut off (cryptsetup killed at each fdatasync of a
/// journal-protected job: the ones that left a segment `in-reencryption`).
fn interrupted_steps(lab: &Lab, img0: &str) -> Vec<String> {
    let pw = lab.p("pw");
    let mut found = Vec::new();
    for n in 1..40 {
        let img = lab.p(&format!("cut{n}.img"));
        std::fs::copy(img0, &img).unwrap();
        let mut args = vec![
            "reencrypt",
            "-q",
            "--force-offline-reencrypt",
            "--resilience",
            "journal",
            "--hotzone-size",
            "8M",
            "--key-file",
            &pw,
        ];
        args.extend(KDF);
        args.push(&img);
        if killed_at("fdatasync", n, &lab.cs, &args) {
            break;
        }
        if lab.hot(&img) {
            found.push(img);
        } else {
            std::fs::remove_file(&img).unwrap();
        }
    }
    found
}

/// A reencryption step cut off (cryptsetup killed mid-step): every command that reads or
/// writes the data recovers the step first, as `cryptsetup open` does (export opens
/// read-only, import read-write), `dump --dump-volume-key` answers as cryptsetup's, and
/// `cryptblk repair` does what `cryptsetup repair` does: the same recovered bytes, no step
/// left flagged, the data intact.
#[test]
fn an_interrupted_step_is_recovered_by_every_command_that_needs_the_data() {
    let lab = Lab::new();
    let (img0, plain) = lab.volume("s0.img", "4096");
    let pw = lab.p("pw");
    let cuts = interrupted_steps(&lab, &img0);
    assert!(
        cuts.len() >= 2,
        "only {} kills left a step cut off",
        cuts.len()
    );
    for cut in &cuts {
        let copy = |name: &str| {
            let p = lab.p(name);
            std::fs::copy(cut, &p).unwrap();
            p
        };
        // export (read-only use of the data).
        let img = copy("e.img");
        assert!(lab.read(&img) == plain, "{cut}: export");
        assert!(!lab.hot(&img), "{cut}: export left the step cut off");
        // import (read-write).
        let img = copy("i.img");
        let other: Vec<u8> = plain.iter().map(|b| b ^ 0x5a).collect();
        std::fs::write(lab.p("other"), &other).unwrap();
        ok(&lab.cb(&["import", &img, &lab.p("other"), "--key-file", &pw]));
        assert!(lab.read(&img) == other, "{cut}: import");
        // dump --dump-volume-key needs no data: it answers as cryptsetup does, byte for
        // byte, and (as cryptsetup) leaves the step to the next command that does.
        let img = copy("d.img");
        let ours = ok(&lab.cb(&["dump", "-q", "--dump-volume-key", "--key-file", &pw, &img]));
        let theirs = ok(&lab.cs(&[
            "luksDump",
            "-q",
            "--dump-volume-key",
            "--key-file",
            &pw,
            &img,
        ]));
        assert_eq!(ours, theirs, "{cut}: dump --dump-volume-key");
        // repair, against cryptsetup's on the same image.
        let (ours, theirs) = (copy("r1.img"), copy("r2.img"));
        ok(&lab.cb(&["repair", "-q", "--key-file", &pw, &ours]));
        ok(&lab.cs(&["repair", "-q", "--key-file", &pw, &theirs]));
        assert!(!lab.hot(&ours), "{cut}: repair left the step cut off");
        let (a, b) = (
            std::fs::read(&ours).unwrap(),
            std::fs::read(&theirs).unwrap(),
        );
        // The same data area; the metadata may differ in its seqid and binary-header
        // salts and checksums only.
        assert!(
            a[16 * MIB..] == b[16 * MIB..],
            "{cut}: repair's data differs from cryptsetup's"
        );
        assert_eq!(
            lab.json(&ours)["segments"],
            lab.json(&theirs)["segments"],
            "{cut}"
        );
        assert!(lab.read(&ours) == plain, "{cut}: after repair");
        // And the job still finishes.
        assert!(lab.cb_reencrypt(&ours, &["--resume-only"], None) || !lab.in_reencryption(&ours));
        assert!(lab.read(&ours) == plain, "{cut}: after the job");
    }
}

/// The new key's keyslot is encrypted as the keyslot the passphrase opened (cryptsetup's
/// rule, whatever the data cipher), and as `--keyslot-cipher` says when it is given
/// (cryptsetup 2.6 accepts and ignores it); cryptsetup opens the result either way.
#[test]
fn the_new_keyslot_is_encrypted_as_the_old_one_or_as_keyslot_cipher_says() {
    let lab = Lab::new();
    let pw = lab.p("pw");
    let area = |img: &str| -> Vec<(String, u64)> {
        let out = ok(&lab.cs(&["luksDump", "--dump-json-metadata", img]));
        let j: serde_json::Value = serde_json::from_str(&out).unwrap();
        j["keyslots"]
            .as_object()
            .unwrap()
            .values()
            .filter(|k| k["type"] == "luks2")
            .map(|k| {
                (
                    k["area"]["encryption"].as_str().unwrap().to_string(),
                    k["area"]["key_size"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let fresh = |name: &str| {
        let img = lab.p(name);
        std::fs::File::create(&img)
            .unwrap()
            .set_len(24 * MIB as u64)
            .unwrap();
        let mut a = vec!["luksFormat", "-q", "--type", "luks2"];
        a.extend(KDF);
        a.extend([
            "--keyslot-cipher",
            "aes-cbc-essiv:sha256",
            "--keyslot-key-size",
            "256",
            "--key-file",
            &pw,
            &img,
        ]);
        ok(&lab.cs(&a));
        img
    };
    let mut job = vec![
        "reencrypt",
        "-q",
        "--init-only",
        "--key-size",
        "256",
        "--key-file",
        &pw,
    ];
    job.extend(KDF);
    let (mine, theirs) = (fresh("mine.img"), fresh("theirs.img"));
    let mut a = job.clone();
    a.push(&mine);
    ok(&lab.cb(&a));
    let mut a = job.clone();
    a.extend([theirs.as_str(), "--force-offline-reencrypt"]);
    ok(&lab.cs(&a));
    assert_eq!(area(&mine), area(&theirs));
    assert_eq!(
        area(&mine),
        vec![("aes-cbc-essiv:sha256".to_string(), 32); 2]
    );
    // --keyslot-cipher given: the new keyslot takes it; the job finished, cryptsetup opens.
    let img = lab.p("ks.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(24 * MIB as u64)
        .unwrap();
    let mut a = vec!["luksFormat", "-q", "--type", "luks2"];
    a.extend(KDF);
    a.extend(["--key-file", &pw, &img]);
    ok(&lab.cs(&a));
    let mut a = vec![
        "reencrypt",
        "-q",
        "--keyslot-cipher",
        "aes-cbc-essiv:sha256",
        "--keyslot-key-size",
        "256",
        "--key-file",
        &pw,
    ];
    a.extend(KDF);
    a.push(&img);
    ok(&lab.cb(&a));
    assert_eq!(area(&img), vec![("aes-cbc-essiv:sha256".to_string(), 32)]);
    ok(&lab.cs(&["open", "--test-passphrase", "--key-file", &pw, &img]));
}
