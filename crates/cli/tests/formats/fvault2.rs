//! FileVault 2 volumes (`--type fvault2`) against cryptsetup's own test image
//! (`tests/fvault2-images.tar.xz`, fetched by scripts/fetch-cryptsetup-images.sh; its
//! passphrase, volume key and the SHA-256 of the decrypted device are in cryptsetup's
//! `tests/fvault2-compat-test`, copied below).
//!
//! Independent checks: those values (cryptsetup's test maps the image with dm-crypt as
//! root), cryptsetup's `fvault2Dump` (text and volume key, which work without root here),
//! and Python `cryptography`'s AES-XTS (OpenSSL) decrypting what cryptblk wrote over NBD.
//! libfvde's tools cannot read this image (its secondary metadata is stripped), so they
//! are no reference here.

use crate::common::*;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

// From cryptsetup 2.6's tests/fvault2-compat-test.
const PASSPHRASE: &[u8] = b"heslo123";
const VOLUME_KEY: &str = "20734d3389212774d7610c29d732880916f3be14c4b12ac7aaf07e5ccc77b319";
const DEVICE_SHA256: &str = "2c662e36c0f7e2f5583e6a939bbcbdc660805692d0fccaa45ad4052beb3b8e18";
const FAMILY_UUID: &str = "33a76caa-1481-4bc5-8d04-1ac1707c19c0";
const VOLUME_OFFSET: u64 = 67_108_864;
const VOLUME_SIZE: u64 = 167_772_160;

fn image() -> PathBuf {
    let p = cryptsetup_images("fvault2-images").join("small");
    assert!(p.is_file(), "{} missing", p.display());
    p
}

fn cryptblk(args: &[&str], stdin: &[u8]) -> std::process::Output {
    run_in(bin(), args, stdin)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn export(img: &Path, stdin: &[u8], extra: &[&str]) -> std::process::Output {
    let mut args = vec!["export", "-r", "--type", "fvault2"];
    args.extend_from_slice(extra);
    args.extend([img.to_str().unwrap(), "-"]);
    cryptblk(&args, stdin)
}

/// The whole device decrypts to the SHA-256 cryptsetup's test expects; `dump` (with and
/// without the volume key) prints what cryptsetup's fvault2Dump prints, byte for byte;
/// `test-passphrase` accepts the passphrase.
#[test]
fn decrypts_and_dumps_as_cryptsetup() {
    let img = image();
    let img_s = img.to_str().unwrap();
    let o = export(&img, PASSPHRASE, &[]);
    let data = ok_bytes(&o);
    assert_eq!(data.len() as u64, VOLUME_SIZE);
    assert_eq!(hex(&Sha256::digest(&data)), DEVICE_SHA256);

    let cs = tool("cryptsetup", "cryptsetup-bin");
    let theirs = ok(&run_in(&cs, &["fvault2Dump", img_s], b""));
    let ours = ok(&cryptblk(&["dump", "--type", "fvault2", img_s], b""));
    assert_eq!(ours, theirs);
    assert!(ours.contains(&format!("Family UUID:          \t{FAMILY_UUID}\n")));
    let args = ["fvault2Dump", "-q", "--dump-volume-key", img_s];
    let theirs = ok(&run_in(&cs, &args, PASSPHRASE));
    let ours = ok(&cryptblk(
        &[
            "dump",
            "--type",
            "fvault2",
            "--dump-volume-key",
            "-q",
            img_s,
        ],
        PASSPHRASE,
    ));
    assert_eq!(ours, theirs);
    let key = ours.split("Volume key:       \t").nth(1).unwrap();
    assert_eq!(key.split_whitespace().collect::<String>(), VOLUME_KEY);

    ok(&cryptblk(
        &["test-passphrase", "--type", "fvault2", img_s],
        PASSPHRASE,
    ));
}

fn ok_bytes(o: &std::process::Output) -> Vec<u8> {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout.clone()
}

/// `--volume-key-file` opens the volume with the key alone (as cryptsetup's open does);
/// a key file of the wrong length is refused.
#[test]
fn volume_key_file_opens_it() {
    let img = image();
    let dir = tempfile::tempdir().unwrap();
    let kf = dir.path().join("vk");
    std::fs::write(&kf, hex::decode(VOLUME_KEY).unwrap()).unwrap();
    let data = ok_bytes(&export(
        &img,
        b"",
        &["--volume-key-file", kf.to_str().unwrap()],
    ));
    assert_eq!(hex(&Sha256::digest(&data)), DEVICE_SHA256);
    std::fs::write(&kf, &hex::decode(VOLUME_KEY).unwrap()[..16]).unwrap();
    let o = export(&img, b"", &["--volume-key-file", kf.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("shorter than the requested 32 bytes"));
    assert!(o.stdout.is_empty());
}

/// Wrong passphrase: exit 2 with cryptsetup's message. Damaged metadata (volume header,
/// disk label, encrypted metadata), a device that is not FileVault 2 and a truncated
/// image: a clear error, no panic, the image unchanged.
#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let img = image();
    let o = cryptblk(
        &[
            "test-passphrase",
            "--type",
            "fvault2",
            img.to_str().unwrap(),
        ],
        b"heslo124",
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("No key available with this passphrase"));

    // Where the metadata lies: the volume header's block size and disk label block, the
    // first encrypted metadata block from the volume groups descriptor.
    let orig = std::fs::read(&img).unwrap();
    let le = |at: usize, n: usize| {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&orig[at..at + n]);
        u64::from_le_bytes(b) as usize
    };
    let bs = le(96, 4);
    let label = le(104, 8) * bs;
    let vg = label + le(label + 220, 4);
    let meta = le(vg + 32, 8) * bs;
    assert!(meta > 0 && meta < VOLUME_OFFSET as usize);
    let dir = tempfile::tempdir().unwrap();
    for (what, at, why) in [
        ("magic", 88, "not a FileVault 2"),
        ("volume header", 176, "volume header: checksum"),
        ("disk label", label + 100, "disk label: checksum"),
        (
            "encrypted metadata",
            meta + 4000,
            "metadata block: checksum",
        ),
    ] {
        let p = dir.path().join("damaged.img");
        let mut d = orig[..VOLUME_OFFSET as usize + 4096].to_vec();
        d[at] ^= 0x5a;
        std::fs::write(&p, &d).unwrap();
        let o = cryptblk(
            &["export", "--type", "fvault2", p.to_str().unwrap(), "-"],
            PASSPHRASE,
        );
        assert_eq!(o.status.code(), Some(1), "{what}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(why), "{what}: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert!(std::fs::read(&p).unwrap() == d, "{what}: the image changed");
    }
    let p = dir.path().join("truncated.img");
    std::fs::write(&p, &orig[..meta + 100]).unwrap();
    let o = cryptblk(&["dump", "--type", "fvault2", p.to_str().unwrap()], b"");
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("truncated"));
    // The metadata intact but the logical volume cut short: refused at open.
    std::fs::write(&p, &orig[..VOLUME_OFFSET as usize + 4096]).unwrap();
    let o = cryptblk(
        &["export", "--type", "fvault2", p.to_str().unwrap(), "-"],
        PASSPHRASE,
    );
    assert!(!o.status.success());
    assert!(o.stdout.is_empty());
}

/// Writes over NBD land where FileVault 2 keeps them: served with `open --type fvault2
/// --nbd`, 8 MiB written at the start of the volume read back over NBD; an
/// independent AES-XTS (Python cryptography) decrypts the image file to what was written,
/// and nothing outside the logical volume changed.
#[test]
fn writes_over_nbd_decrypt_independently() {
    let nbdcopy = tool("nbdcopy", "libnbd-bin");
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("fv.img");
    ok(&run_in(
        "cp",
        &[
            "--sparse=always",
            image().to_str().unwrap(),
            img.to_str().unwrap(),
        ],
        b"",
    ));
    let before = std::fs::read(&img).unwrap();
    let sock = tmp.path().join("s.sock");
    let run_dir = tmp.path().join("run");
    let run_s = run_dir.to_str().unwrap();
    let child = serve_nbd_unix(
        &[
            "open",
            "--type",
            "fvault2",
            img.to_str().unwrap(),
            "fv",
            "--run-dir",
            run_s,
        ],
        &sock,
        PASSPHRASE,
    );
    let status = ok(&run_in(bin(), &["status", "fv", "--run-dir", run_s], b""));
    assert!(
        status.contains("FVAULT2") && status.contains(FAMILY_UUID),
        "{status}"
    );
    let uri = format!("nbd+unix:///fv?socket={}", sock.display());
    const LEN: u64 = 8 << 20;
    let pattern: Vec<u8> = (0..LEN as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let src = tmp.path().join("pattern");
    std::fs::write(&src, &pattern).unwrap();
    ok(&run_in(&nbdcopy, &[src.to_str().unwrap(), &uri], b""));
    let back = tmp.path().join("back");
    ok(&run_in(&nbdcopy, &[&uri, back.to_str().unwrap()], b""));
    let back = std::fs::read(&back).unwrap();
    assert_eq!(back.len() as u64, VOLUME_SIZE);
    assert!(back[..LEN as usize] == pattern[..], "read back over NBD");
    ok(&run_in(bin(), &["close", "fv", "--run-dir", run_s], b""));
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let after = std::fs::read(&img).unwrap();
    let (lo, hi) = (
        VOLUME_OFFSET as usize,
        (VOLUME_OFFSET + VOLUME_SIZE) as usize,
    );
    assert!(
        after[..lo] == before[..lo],
        "metadata before the volume changed"
    );
    assert!(after[hi..] == before[hi..], "data after the volume changed");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/xts-decrypt.py");
    let o = run_in(
        "python3",
        &[
            script.to_str().unwrap(),
            VOLUME_KEY,
            img.to_str().unwrap(),
            &VOLUME_OFFSET.to_string(),
            "0",
            &(LEN + 1024 * 1024).to_string(),
        ],
        b"",
    );
    let theirs = ok_bytes(&o);
    assert!(
        theirs[..LEN as usize] == pattern[..],
        "Python's AES-XTS reads what was written"
    );
    // Beyond the write, both still read the original volume.
    let orig = ok_bytes(&export(&image(), PASSPHRASE, &[]));
    assert!(theirs[LEN as usize..] == orig[LEN as usize..LEN as usize + (1 << 20)]);
}
