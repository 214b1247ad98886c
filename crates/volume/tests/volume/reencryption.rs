//! LUKS2 volumes in the middle of a reencryption made by the real cryptsetup 2.6
//! (`reencrypt --force-offline-reencrypt`, userspace, no device-mapper): stopped between
//! steps (SIGINT) they open and read back the plaintext with each stretch under its own key;
//! cut off inside a step (SIGKILL, hot zone flagged `in-reencryption`) a read-write open
//! recovers the step from the resilience data (checksum, journal, data shift) as cryptsetup
//! does, and cryptsetup then resumes and finishes; forged reencryption metadata is refused.
//!
//! cryptsetup is interrupted at an exact point with `strace --inject` (a signal when it
//! enters its Nth `fdatasync`, the one after a step's data write). These tests need
//! cryptsetup and strace; a missing binary fails them instead of skipping.

use crate::common::*;
use cryptblk_device::BlockDevice;
use cryptblk_format::luks2::Luks2Error;
use cryptblk_volume::{Error, OpenOptions, Volume, open_luks};
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;
const PASS: &[u8] = b"reencrypt me";
const KDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

struct Lab {
    dir: tempfile::TempDir,
    key: PathBuf,
}

impl Lab {
    fn new() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let key = key_file(dir.path(), "pass", PASS);
        Lab { dir, key }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn key(&self) -> &str {
        self.key.to_str().unwrap()
    }

    /// A LUKS2 volume of `size` bytes (16 MiB header) holding random plaintext, written
    /// through cryptblk; returns the image and the plaintext.
    fn volume(&self, name: &str, size: u64, sector: u32) -> (PathBuf, Vec<u8>) {
        let img = image(self.dir.path(), name, size);
        let mut args = vec!["luksFormat", "-q", "--type", "luks2", "--sector-size"];
        let ss = sector.to_string();
        args.push(&ss);
        args.extend(KDF);
        args.extend(["--key-file", self.key(), img.to_str().unwrap()]);
        cryptsetup(&args);
        let vol = open(&img, None, false).unwrap();
        let plain = pattern(vol.size() as usize, 7);
        vol.write_at(&plain, 0, false).unwrap();
        vol.flush().unwrap();
        (img, plain)
    }

    /// `cryptsetup reencrypt` with `args`, killed by `signal` when it enters its `nth`
    /// fdatasync (None: runs to the end). Returns whether it exited successfully.
    fn reencrypt(&self, args: &[&str], stop: Option<(&str, u32)>) -> bool {
        let mut cmd = match stop {
            Some((sig, nth)) => {
                let mut c = Command::new("strace");
                c.args(["-f", "-o", "/dev/null", "-e", "trace=fdatasync", "-e"])
                    .arg(format!("inject=fdatasync:signal={sig}:when={nth}"))
                    .arg(cryptsetup_path());
                c
            }
            None => Command::new(cryptsetup_path()),
        };
        cmd.args(["reencrypt", "-q", "--force-offline-reencrypt", "--key-file"])
            .arg(&self.key)
            .args(KDF)
            .args(args)
            .env("LC_ALL", "C");
        let out = cmd.output().expect("cannot run strace/cryptsetup");
        if stop.is_none() {
            assert!(
                out.status.success(),
                "cryptsetup reencrypt {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        out.status.success()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    let mut x = 0x9e37_79b9_u32 ^ seed as u32;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn open(img: &Path, header: Option<&Path>, read_only: bool) -> cryptblk_volume::Result<Volume> {
    let opts = OpenOptions {
        header: header.map(Path::to_path_buf),
        read_only,
        ..OpenOptions::default()
    };
    // A sibling test spawning cryptsetup at this instant holds a copy of every descriptor of
    // this process, our locked one included, until its exec closes them: a brief Busy from
    // that window is retried; a lock held for real (a live cryptsetup) stays Busy and fails.
    for _ in 0..40 {
        match open_luks(img, &opts, PASS) {
            Err(Error::Busy(_)) => std::thread::sleep(std::time::Duration::from_millis(50)),
            other => return other,
        }
    }
    open_luks(img, &opts, PASS)
}

fn read_all(img: &Path, header: Option<&Path>, read_only: bool) -> Vec<u8> {
    let vol = open(img, header, read_only).unwrap();
    let mut buf = vec![0u8; vol.size() as usize];
    vol.read_at(&mut buf, 0).unwrap();
    buf
}

/// The JSON metadata as cryptsetup reads it.
fn json(hdr: &Path) -> serde_json::Value {
    let out = cryptsetup(&["luksDump", "--dump-json-metadata", hdr.to_str().unwrap()]);
    serde_json::from_str(&out).unwrap()
}

fn in_reencryption(hdr: &Path) -> bool {
    json(hdr)["config"]["requirements"]["mandatory"]
        .as_array()
        .is_some_and(|m| {
            m.iter()
                .any(|r| r == "online-reencrypt-v2" || r == "online-reencrypt-v3")
        })
}

fn hot_segment(hdr: &Path) -> bool {
    let j = json(hdr);
    j["segments"].as_object().unwrap().values().any(|s| {
        s["flags"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == "in-reencryption"))
    })
}

fn regular_segments(hdr: &Path) -> usize {
    let j = json(hdr);
    j["segments"]
        .as_object()
        .unwrap()
        .values()
        .filter(|s| {
            !s["flags"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f.as_str().unwrap().starts_with("backup-")))
        })
        .count()
}

fn test_passphrase(lab: &Lab, img: &Path, header: Option<&Path>) {
    let mut args = vec!["open", "--test-passphrase", "--key-file", lab.key()];
    if let Some(h) = header {
        args.extend(["--header", h.to_str().unwrap()]);
    }
    args.push(img.to_str().unwrap());
    cryptsetup(&args);
}

/// A step cut off: a read-only open recovers it first, as cryptsetup's activation does
/// (the device opened read-write for that moment); then the data reads back, the state is
/// one cryptsetup accepts, and cryptsetup resumes it to the end.
fn crash_recover_resume(
    lab: &Lab,
    img: &Path,
    header: Option<&Path>,
    plain: &[u8],
    resume: &[&str],
) {
    let hdr = header.unwrap_or(img);
    assert!(hot_segment(hdr), "the kill must land inside a step");
    let got = read_all(img, header, true);
    assert!(got[..plain.len()] == *plain, "plaintext after recovery");
    assert!(!hot_segment(hdr), "recovery clears the hot zone");
    test_passphrase(lab, img, header);
    lab.reencrypt(resume, None);
    assert!(
        !in_reencryption(hdr),
        "cryptsetup finished the reencryption"
    );
    assert!(read_all(img, header, true)[..plain.len()] == *plain);
}

#[test]
fn reencrypt_stopped_between_steps_reads_and_resumes() {
    let lab = Lab::new();
    let (img, plain) = lab.volume("a.img", 48 * MIB, 4096);
    let i = img.to_str().unwrap();
    lab.reencrypt(&["--init-only", "--hotzone-size", "8M", i], None);
    assert!(in_reencryption(&img));
    assert_eq!(open(&img, None, true).unwrap().segment_spans().len(), 1);
    assert!(read_all(&img, None, true) == plain, "after --init-only");
    // SIGINT: cryptsetup stops cleanly after the step it is in.
    lab.reencrypt(
        &["--resume-only", "--hotzone-size", "8M", i],
        Some(("SIGINT", 2)),
    );
    assert!(in_reencryption(&img) && !hot_segment(&img));
    let vol = open(&img, None, false).unwrap();
    assert_eq!(vol.segment_spans().len(), 2, "new key, then old key");
    assert_eq!(vol.segment_spans()[0].1, 16 * MIB);
    let mut got = vec![0u8; plain.len()];
    vol.read_at(&mut got, 0).unwrap();
    assert!(got == plain, "half reencrypted");
    // Writes across the boundary go to each key's side.
    let patch = pattern(2 * MIB as usize, 9);
    vol.write_at(&patch, 15 * MIB, false).unwrap();
    vol.flush().unwrap();
    drop(vol);
    let mut plain = plain;
    plain[15 * MIB as usize..17 * MIB as usize].copy_from_slice(&patch);
    assert!(read_all(&img, None, true) == plain);
    // Metadata changes wait for the end, as in cryptsetup.
    let mut args = vec!["luksAddKey"];
    args.extend(KDF);
    args.extend(["--key-file", lab.key(), i, lab.key()]);
    assert!(!try_cryptsetup(&args).status.success());
    lab.reencrypt(&["--resume-only", i], None);
    assert!(!in_reencryption(&img));
    assert!(
        read_all(&img, None, true) == plain,
        "finished by cryptsetup"
    );
}

#[test]
fn checksum_step_cut_off_is_recovered() {
    let lab = Lab::new();
    let (img, plain) = lab.volume("c.img", 48 * MIB, 4096);
    let i = img.to_str().unwrap();
    let args = ["--resilience", "checksum", "--hotzone-size", "8M", i];
    lab.reencrypt(&[&["--init-only"], &args[..]].concat(), None);
    lab.reencrypt(
        &[&["--resume-only"], &args[..]].concat(),
        Some(("SIGKILL", 2)),
    );
    crash_recover_resume(&lab, &img, None, &plain, &["--resume-only", i]);
}

#[test]
fn journal_step_cut_off_is_recovered_with_512_byte_sectors() {
    let lab = Lab::new();
    let (img, plain) = lab.volume("j.img", 48 * MIB, 512);
    let i = img.to_str().unwrap();
    let args = ["--resilience", "journal", "--hotzone-size", "4M", i];
    lab.reencrypt(&[&["--init-only"], &args[..]].concat(), None);
    lab.reencrypt(
        &[&["--resume-only"], &args[..]].concat(),
        Some(("SIGKILL", 3)),
    );
    crash_recover_resume(&lab, &img, None, &plain, &["--resume-only", i]);
}

#[test]
fn data_shift_step_cut_off_is_recovered() {
    // --reduce-device-size: the data moves 8 MiB up, last block first (backward).
    let lab = Lab::new();
    let (img, plain) = lab.volume("s.img", 48 * MIB, 4096);
    let i = img.to_str().unwrap();
    let keep = &plain[..(plain.len() - 8 * MIB as usize)];
    lab.reencrypt(&["--reduce-device-size", "8M", i], Some(("SIGKILL", 2)));
    crash_recover_resume(&lab, &img, None, keep, &["--resume-only", i]);
    assert_eq!(open(&img, None, true).unwrap().size(), keep.len() as u64);
}

#[test]
fn last_step_cut_off_is_recovered_and_finished() {
    let lab = Lab::new();
    let (img, plain) = lab.volume("f.img", 32 * MIB, 4096);
    let i = img.to_str().unwrap();
    // 16 MiB of data in two steps: the kill lands in the second, the last.
    let args = ["--resilience", "checksum", "--hotzone-size", "8M", i];
    lab.reencrypt(&[&["--init-only"], &args[..]].concat(), None);
    lab.reencrypt(
        &[&["--resume-only"], &args[..]].concat(),
        Some(("SIGKILL", 2)),
    );
    assert!(hot_segment(&img));
    assert!(read_all(&img, None, false) == plain);
    let j = json(&img);
    assert!(!in_reencryption(&img), "finished: {j}");
    assert_eq!(regular_segments(&img), 1);
    assert_eq!(
        j["keyslots"].as_object().unwrap().len(),
        1,
        "old keyslot and reencrypt keyslot gone: {j}"
    );
    assert_eq!(j["digests"].as_object().unwrap().len(), 1);
    test_passphrase(&lab, &img, None);
    assert!(read_all(&img, None, true) == plain);
}

#[test]
fn encryption_in_place_with_detached_header_cut_off_is_recovered() {
    let lab = Lab::new();
    let data = lab.path("plain.img");
    let plain = pattern(32 * MIB as usize, 3);
    std::fs::write(&data, &plain).unwrap();
    let hdr = lab.path("hdr.img");
    let (d, h) = (data.to_str().unwrap(), hdr.to_str().unwrap());
    let args = [
        "--encrypt",
        "--type",
        "luks2",
        "--header",
        h,
        "--hotzone-size",
        "8M",
        d,
    ];
    lab.reencrypt(&args, Some(("SIGKILL", 2)));
    let resume = ["--resume-only", "--header", h, d];
    crash_recover_resume(&lab, &data, Some(&hdr), &plain, &resume);
}

#[test]
fn decryption_with_detached_header_cut_off_is_recovered() {
    let lab = Lab::new();
    let data = image(lab.dir.path(), "data.img", 32 * MIB);
    let hdr = image(lab.dir.path(), "hdr.img", 16 * MIB);
    let (d, h) = (data.to_str().unwrap(), hdr.to_str().unwrap());
    let mut args = vec!["luksFormat", "-q", "--type", "luks2", "--header", h];
    args.extend(KDF);
    args.extend(["--key-file", lab.key(), d]);
    cryptsetup(&args);
    let vol = open(&data, Some(&hdr), false).unwrap();
    let plain = pattern(vol.size() as usize, 5);
    vol.write_at(&plain, 0, false).unwrap();
    drop(vol);
    lab.reencrypt(
        &["--decrypt", "--header", h, "--hotzone-size", "8M", d],
        Some(("SIGKILL", 2)),
    );
    assert!(hot_segment(&hdr));
    assert!(read_all(&data, Some(&hdr), false) == plain);
    lab.reencrypt(&["--decrypt", "--resume-only", "--header", h, d], None);
    assert!(std::fs::read(&data).unwrap() == plain, "decrypted in place");
}

#[test]
fn encryption_moving_the_first_segment_cut_off_is_recovered() {
    // --reduce-device-size without --header: the first 16 MiB move to the end of the
    // device to make room for the header, the rest is encrypted in place, backward.
    let lab = Lab::new();
    let data = lab.path("m.img");
    let plain = pattern(32 * MIB as usize, 11);
    let mut file = plain.clone();
    file.resize(64 * MIB as usize, 0);
    std::fs::write(&data, &file).unwrap();
    let d = data.to_str().unwrap();
    let args = [
        "--encrypt",
        "--type",
        "luks2",
        "--reduce-device-size",
        "32M",
        d,
    ];
    // Two steps: [16M, 32M) in place, then the moved [0, 16M); killed in the first.
    lab.reencrypt(&args, Some(("SIGKILL", 1)));
    crash_recover_resume(&lab, &data, None, &plain, &["--resume-only", d]);
}

/// Rewrites the JSON of both header copies (same length) and their checksums.
fn forge(img: &Path, from: &str, to: &str) {
    use cryptblk_crypto::HashAlg;
    assert_eq!(from.len(), to.len());
    let mut raw = std::fs::read(img).unwrap();
    let hdr_size = u64::from_be_bytes(raw[8..16].try_into().unwrap()) as usize;
    for copy in [0, hdr_size] {
        let area = &mut raw[copy..copy + hdr_size];
        let text = String::from_utf8_lossy(&area[4096..]).into_owned();
        let at = text.find(from).expect("text to forge") + 4096;
        area[at..at + from.len()].copy_from_slice(to.as_bytes());
        area[448..448 + 64].fill(0);
        let sum = HashAlg::Sha256.digest(area);
        area[448..448 + 32].copy_from_slice(&sum);
    }
    std::fs::write(img, raw).unwrap();
}

#[test]
fn forged_reencryption_metadata_is_refused() {
    let lab = Lab::new();
    let (img, _) = lab.volume("x.img", 48 * MIB, 4096);
    let i = img.to_str().unwrap();
    lab.reencrypt(&["--init-only", "--resilience", "checksum", i], None);
    // The backup-final segment's IV offset is covered by the verification digest.
    let j = json(&img).to_string();
    assert!(j.contains(r#""iv_tweak":"0""#));
    let final_iv = r#""iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096,"flags":["backup-final"]"#;
    let forged = r#""iv_tweak":"8","encryption":"aes-xts-plain64","sector_size":4096,"flags":["backup-final"]"#;
    forge(&img, final_iv, forged);
    let err = open(&img, None, true).map(|_| ()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Format(cryptblk_format::Error::Luks2(
                Luks2Error::ReencryptionDigest(_)
            ))
        ),
        "{err}"
    );
    // cryptsetup agrees.
    let out = try_cryptsetup(&["open", "--test-passphrase", "--key-file", lab.key(), i]);
    assert!(!out.status.success());
}

#[test]
fn decryption_exporting_the_header_cut_off_is_recovered_in_both_steps() {
    // `--decrypt --header NEW`: the header goes to a file, the data moves down over it
    // (online-reencrypt-v3, datashift-checksum): one step shifts [16M, 32M), the last
    // decrypts the moved first stretch in place under checksums.
    for nth in [1, 2] {
        let lab = Lab::new();
        let (img, plain) = lab.volume("v3.img", 48 * MIB, 4096);
        let hdr = lab.path("exported.hdr");
        let (i, h) = (img.to_str().unwrap(), hdr.to_str().unwrap());
        lab.reencrypt(&["--decrypt", "--header", h, i], Some(("SIGKILL", nth)));
        assert!(hot_segment(&hdr), "step {nth}");
        assert!(json(&hdr)["config"]["requirements"]["mandatory"][0] == "online-reencrypt-v3");
        if nth == 1 {
            let got = read_all(&img, Some(&hdr), false);
            assert!(got == plain, "plaintext after recovery");
            lab.reencrypt(&["--decrypt", "--resume-only", "--header", h, i], None);
        } else {
            // The last step's recovery finishes the decryption: nothing is left to unlock.
            match open(&img, Some(&hdr), false) {
                Err(Error::Format(cryptblk_format::Error::Luks2(Luks2Error::PlainData(0)))) => {}
                other => panic!("opening a finished decryption: {:?}", other.map(|_| ())),
            }
            assert!(
                !in_reencryption(&hdr),
                "the last step's recovery finishes it"
            );
            assert_eq!(regular_segments(&hdr), 1);
        }
        let raw = std::fs::read(&img).unwrap();
        assert!(
            raw[..plain.len()] == plain,
            "step {nth}: decrypted in place"
        );
    }
}

#[test]
fn encryption_moving_the_first_segment_cut_off_in_its_last_step_leaves_no_plaintext() {
    let lab = Lab::new();
    let data = lab.path("m.img");
    let plain = pattern(32 * MIB as usize, 13);
    let mut file = plain.clone();
    file.resize(64 * MIB as usize, 0);
    std::fs::write(&data, &file).unwrap();
    let d = data.to_str().unwrap();
    let args = [
        "--encrypt",
        "--type",
        "luks2",
        "--reduce-device-size",
        "32M",
        d,
    ];
    // The second data sync is the last step's: the moved first 16 MiB into place.
    lab.reencrypt(&args, Some(("SIGKILL", 2)));
    assert!(hot_segment(&data));
    let raw = std::fs::read(&data).unwrap();
    let moved = &raw[48 * MIB as usize..64 * MIB as usize];
    assert!(
        moved == &plain[..16 * MIB as usize],
        "the moved copy is plaintext"
    );
    // Recovery finishes the job: the data reads back, and the moved plaintext is gone.
    assert!(read_all(&data, None, false)[..plain.len()] == plain[..]);
    assert!(!in_reencryption(&data));
    let raw = std::fs::read(&data).unwrap();
    let moved = &raw[48 * MIB as usize..64 * MIB as usize];
    let left = moved
        .chunks(4096)
        .zip(plain.chunks(4096))
        .filter(|(a, b)| a == b)
        .count();
    assert_eq!(left, 0, "blocks of the moved plaintext left on the device");
    test_passphrase(&lab, &data, None);
}
