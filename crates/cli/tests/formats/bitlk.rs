//! BitLocker volumes (`--type bitlk`) against cryptsetup's own test set
//! (`tests/bitlk-images.tar.xz`, fetched by scripts/fetch-cryptsetup-images.sh, with its
//! `images.conf`: passphrase, recovery password, GUIDs and the SHA-256 of each whole
//! decrypted device): AES-CBC with and without the Elephant diffuser, AES-XTS, 128 and
//! 256 bits, 512 and 4096-byte sectors, BitLocker To Go, startup keys (.BEK), a smart
//! card volume (recovery password only), a clear key and encrypt-on-write.
//!
//! Independent checks: the SHA-256 sums cryptsetup's test holds (it maps the images with
//! dm-crypt as root), cryptsetup's `bitlkDump` (text and volume key, which work without
//! root here), and dislocker 0.7 (`dislocker-file`) decrypting what cryptblk wrote.

use crate::common::*;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One section of images.conf.
struct Image {
    path: PathBuf,
    name: String,
    conf: BTreeMap<String, String>,
}

impl Image {
    fn get(&self, k: &str) -> &str {
        self.conf.get(k).map(String::as_str).unwrap_or("")
    }
    fn path(&self) -> &str {
        self.path.to_str().unwrap()
    }
    /// Secrets that open it: passphrase (when it has one) and recovery password.
    fn secrets(&self) -> Vec<String> {
        [self.get("PW"), self.get("RP")]
            .into_iter()
            .filter(|s| !s.is_empty())
            .map(|s| format!("{s}\n"))
            .collect()
    }
    fn eow(&self) -> bool {
        self.name.contains("eow") || self.name.contains("clearkey")
    }
}

fn images() -> Vec<Image> {
    let dir = cryptsetup_images("bitlk-images");
    let conf = std::fs::read_to_string(dir.join("images.conf")).unwrap();
    let mut out = Vec::new();
    for sec in conf.split('[').skip(1) {
        let (name, body) = sec.split_once(']').unwrap();
        let conf: BTreeMap<String, String> = body
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect();
        let path = dir.join(format!("{name}.img"));
        assert!(path.exists(), "{} missing", path.display());
        out.push(Image {
            path,
            name: name.to_string(),
            conf,
        });
    }
    assert_eq!(out.len(), 16, "cryptsetup 2.6's set has 16 images");
    out
}

fn cryptblk(args: &[&str], stdin: &[u8]) -> std::process::Output {
    run_in(bin(), args, stdin)
}

fn sha256_hex(b: &[u8]) -> String {
    hex(&Sha256::digest(b))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The whole decrypted device, through `export`.
fn export(img: &str, secret: &[u8], extra: &[&str]) -> Vec<u8> {
    let mut args = vec!["export", "-r", "--type", "bitlk"];
    args.extend_from_slice(extra);
    args.extend([img, "-"]);
    let o = cryptblk(&args, secret);
    assert!(
        o.status.success(),
        "export {img}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

/// Every image cryptsetup's test maps opens with its passphrase and with its recovery
/// password, and the whole device reads back with the SHA-256 cryptsetup's test expects.
#[test]
fn every_image_decrypts_to_the_expected_device() {
    let mut checked = 0;
    for im in images().iter().filter(|i| !i.get("SHA256SUM").is_empty()) {
        for s in im.secrets() {
            let data = export(im.path(), s.as_bytes(), &[]);
            assert_eq!(
                sha256_hex(&data),
                im.get("SHA256SUM"),
                "{} with {}",
                im.name,
                s.trim()
            );
            checked += 1;
        }
    }
    // 13 images with a checksum, the smart-card and startup-key ones by recovery only.
    assert_eq!(checked, 25);
}

/// `dump --type bitlk` prints what cryptsetup's bitlkDump prints, byte for byte; the
/// volume key from every protector equals cryptsetup's `--dump-volume-key`.
#[test]
fn dump_and_volume_key_match_cryptsetup() {
    let cs = tool("cryptsetup", "cryptsetup-bin");
    for im in images() {
        let theirs = std::process::Command::new(&cs)
            .args(["bitlkDump", im.path()])
            .env("TZ", "UTC")
            .output()
            .unwrap();
        let ours = ok(&cryptblk(&["dump", "--type", "bitlk", im.path()], b""));
        assert_eq!(ours, ok(&theirs), "{}", im.name);
        let s = &im.secrets()[0];
        let theirs = run_in(
            &cs,
            &["bitlkDump", "-q", "--dump-volume-key", im.path()],
            s.as_bytes(),
        );
        let want = dumped_volume_key(&ok(&theirs));
        for s in im.secrets() {
            let ours = ok(&cryptblk(
                &[
                    "dump",
                    "--type",
                    "bitlk",
                    "--dump-volume-key",
                    "-q",
                    im.path(),
                ],
                s.as_bytes(),
            ));
            assert_eq!(dumped_volume_key(&ours), want, "{} {}", im.name, s.trim());
        }
        assert!(!want.is_empty());
    }
}

/// Startup keys: each .BEK file opens its volume (same device as the recovery password);
/// the other volume's .BEK file is refused.
#[test]
fn startup_key_files_open_their_volume() {
    let all = images();
    let sk: Vec<&Image> = all
        .iter()
        .filter(|i| !i.get("SK_VMK_GUID").is_empty())
        .collect();
    assert_eq!(sk.len(), 2);
    let bek = |im: &Image| {
        im.path
            .with_file_name(format!("{}.BEK", im.get("SK_VMK_GUID").to_uppercase()))
    };
    for (i, im) in sk.iter().enumerate() {
        let own = bek(im);
        let data = export(im.path(), b"", &["--key-file", own.to_str().unwrap()]);
        assert_eq!(sha256_hex(&data), im.get("SHA256SUM"), "{}", im.name);
        let other = bek(sk[1 - i]);
        let o = cryptblk(
            &[
                "test-passphrase",
                "--type",
                "bitlk",
                "--key-file",
                other.to_str().unwrap(),
                im.path(),
            ],
            b"",
        );
        assert_eq!(
            o.status.code(),
            Some(2),
            "{}: another volume's BEK",
            im.name
        );
    }
}

/// A volume with a clear key (BitLocker protection suspended) unlocks without a secret,
/// to the volume key its passphrase gives. That one is also encrypt-on-write, which
/// cryptsetup refuses to map and so does cryptblk, saying why.
#[test]
fn clear_key_and_encrypt_on_write() {
    let all = images();
    let ck = all.iter().find(|i| i.name.contains("clearkey")).unwrap();
    let by_clear = ok(&cryptblk(
        &[
            "dump",
            "--type",
            "bitlk",
            "--dump-volume-key",
            "-q",
            ck.path(),
        ],
        b"",
    ));
    let by_pw = ok(&cryptblk(
        &[
            "dump",
            "--type",
            "bitlk",
            "--dump-volume-key",
            "-q",
            "--key-file",
            "-",
            ck.path(),
        ],
        b"anaconda",
    ));
    assert_eq!(dumped_volume_key(&by_clear), dumped_volume_key(&by_pw));
    for im in all.iter().filter(|i| i.eow()) {
        let o = cryptblk(
            &["export", "-r", "--type", "bitlk", im.path(), "-"],
            b"anaconda\n",
        );
        assert_eq!(o.status.code(), Some(1), "{}", im.name);
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("encrypt-on-write"),
            "{}: {}",
            im.name,
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(o.stdout.is_empty());
    }
}

/// Wrong passphrase, a passphrase for a smart-card volume, a damaged and a truncated
/// header: exit codes as cryptsetup's, a clear message, nothing written.
#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let all = images();
    let xts = all.iter().find(|i| i.name == "bitlk-aes-xts-128").unwrap();
    for (img, secret) in [
        (xts, "wrong passphrase\n"),
        (
            xts,
            "111111-111111-111111-111111-111111-111111-111111-111111\n",
        ),
        (
            all.iter().find(|i| i.name.contains("smart-card")).unwrap(),
            "anaconda\n",
        ),
    ] {
        let o = cryptblk(
            &["test-passphrase", "--type", "bitlk", img.path()],
            secret.as_bytes(),
        );
        assert_eq!(o.status.code(), Some(2), "{}", img.name);
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("No key available with this passphrase"),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let orig = std::fs::read(xts.path()).unwrap();
    let dump = ok(&cryptblk(&["dump", "--type", "bitlk", xts.path()], b""));
    let meta: u64 = dump
        .lines()
        .find(|l| l.contains("Offset:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    // Damage: the FVE signature, the first wrapped key's bytes, the entry list's sizes.
    // Each says what it is: damage the reader can see is "corrupt metadata"; damaged
    // wrapped keys only show as keys that do not unwrap.
    for (what, at, len, says) in [
        ("signature", meta, 8, "BITLK: corrupt metadata"),
        ("metadata sizes", meta + 64, 16, "BITLK: corrupt metadata"),
        ("entries", meta + 112, 512, ""),
        ("boot sector", 3, 8, "not a valid BITLK device"),
    ] {
        let p = dir.path().join("damaged.img");
        let mut d = orig.clone();
        for b in &mut d[at as usize..(at + len) as usize] {
            *b ^= 0x5a;
        }
        std::fs::write(&p, &d).unwrap();
        let o = cryptblk(
            &["export", "--type", "bitlk", p.to_str().unwrap(), "-"],
            b"anaconda\n",
        );
        assert!(!o.status.success(), "{what}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("BITLK") || err.contains("No key available"),
            "{what}: {err}"
        );
        assert!(err.contains(says), "{what}: {err} (wanted {says})");
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert!(std::fs::read(&p).unwrap() == d, "{what}: the image changed");
    }
    let p = dir.path().join("truncated.img");
    std::fs::write(&p, &orig[..(meta + 100) as usize]).unwrap();
    let o = cryptblk(&["dump", "--type", "bitlk", p.to_str().unwrap()], b"");
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("truncated"));
}

/// Writes through cryptblk (over NBD for two images, `import` for the other two) land
/// where BitLocker keeps them: dislocker decrypts the image
/// to what cryptblk reads, the metadata areas (mapped as zeros) are untouched on disk,
/// and the boot sector written at offset 0 is stored at the volume header's place.
#[test]
fn writes_read_back_through_dislocker() {
    let dislocker = tool("dislocker-file", "dislocker");
    let all = images();
    for (n, name) in [
        "bitlk-aes-xts-128",
        "bitlk-aes-cbc-elephant-128",
        "bitlk-aes-cbc-256",
        "bitlk-aes-xts-128-4k",
    ]
    .into_iter()
    .enumerate()
    {
        let im = all.iter().find(|i| i.name == name).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("v.img");
        std::fs::copy(&im.path, &img).unwrap();
        let img_s = img.to_str().unwrap();
        let before = std::fs::read(&img).unwrap();
        // 48 MiB of pattern from offset 0: crosses the relocated header, the first
        // metadata area and the volume header area.
        let pattern: Vec<u8> = (0..48u32 << 20)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let src = dir.path().join("pattern");
        std::fs::write(&src, &pattern).unwrap();
        if n % 2 == 0 {
            // Through the NBD server (`open --nbd`, nbdcopy writing).
            let sock = dir.path().join("s.sock");
            let run = dir.path().join("run");
            let run_s = run.to_str().unwrap();
            let mut server = serve_nbd_unix(
                &["open", "--type", "bitlk", img_s, "bl", "--run-dir", run_s],
                &sock,
                b"anaconda\n",
            );
            let uri = format!("nbd+unix:///bl?socket={}", sock.display());
            ok(&run_in(
                &tool("nbdcopy", "libnbd-bin"),
                &[src.to_str().unwrap(), &uri],
                b"",
            ));
            ok(&cryptblk(&["close", "bl", "--run-dir", run_s], b""));
            assert!(server.wait().unwrap().success(), "{name}: server exit");
        } else {
            ok(&cryptblk(
                &[
                    "import",
                    "-q",
                    "--type",
                    "bitlk",
                    img_s,
                    src.to_str().unwrap(),
                ],
                b"anaconda\n",
            ));
        }
        let ours = export(img_s, b"anaconda\n", &[]);
        let dump = ok(&cryptblk(&["dump", "--type", "bitlk", img_s], b""));
        let zeros: Vec<(usize, usize)> = dump
            .split("Offset: \t")
            .skip(1)
            .zip(dump.split("Size:   \t").skip(1))
            .map(|(o, s)| {
                let n = |t: &str| {
                    t.split_whitespace()
                        .next()
                        .unwrap()
                        .parse::<usize>()
                        .unwrap()
                };
                (n(o), n(s))
            })
            .collect();
        assert_eq!(zeros.len(), 4);
        let after = std::fs::read(&img).unwrap();
        for &(o, l) in &zeros {
            if o < pattern.len() {
                assert!(
                    ours[o..o + l].iter().all(|&b| b == 0),
                    "{name}: area at {o} reads zeros"
                );
            }
            if o != zeros[3].0 {
                assert_eq!(
                    after[o..o + l],
                    before[o..o + l],
                    "{name}: metadata at {o} untouched"
                );
            }
        }
        for (i, (&a, &b)) in ours.iter().zip(&pattern).enumerate() {
            if !zeros.iter().any(|&(zo, zl)| i >= zo && i < zo + zl) && a != b {
                panic!("{name}: byte {i} reads {a:#x}, wrote {b:#x}");
            }
        }
        let out = dir.path().join("dislocker.img");
        let o = run_in(
            &dislocker,
            &["-V", img_s, "-uanaconda", "--", out.to_str().unwrap()],
            b"",
        );
        ok(&o);
        let theirs = std::fs::read(&out).unwrap();
        assert_eq!(theirs.len(), ours.len(), "{name}");
        let first_diff = theirs.iter().zip(&ours).position(|(a, b)| a != b);
        assert_eq!(
            first_diff, None,
            "{name}: dislocker reads the image differently"
        );
    }
}

/// A recovery password in a key file, with its newline, as cryptsetup takes it.
#[test]
fn recovery_password_from_a_key_file() {
    let all = images();
    let im = all
        .iter()
        .find(|i| i.name == "bitlk-togo-aes-xts-128")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kf = dir.path().join("rp");
    std::fs::write(&kf, format!("{}\n", im.get("RP"))).unwrap();
    ok(&cryptblk(
        &[
            "test-passphrase",
            "--type",
            "bitlk",
            "--key-file",
            kf.to_str().unwrap(),
            im.path(),
        ],
        b"",
    ));
}

/// `--volume-key-file`: the FVEK alone (as `dump --dump-volume-key` shows it) opens the
/// volume to the same device, as cryptsetup's open does; a key of the wrong size is refused.
#[test]
fn volume_key_file_opens_it() {
    let all = images();
    let dir = tempfile::tempdir().unwrap();
    for name in ["bitlk-aes-xts-256", "bitlk-aes-cbc-elephant-128"] {
        let im = all.iter().find(|i| i.name == name).unwrap();
        let dump = ok(&cryptblk(
            &[
                "dump",
                "--type",
                "bitlk",
                "--dump-volume-key",
                "-q",
                im.path(),
            ],
            im.secrets()[0].as_bytes(),
        ));
        let kf = dir.path().join(name);
        std::fs::write(&kf, dumped_volume_key(&dump)).unwrap();
        let data = export(im.path(), b"", &["--volume-key-file", kf.to_str().unwrap()]);
        assert_eq!(sha256_hex(&data), im.get("SHA256SUM"), "{name}");
        let short = dir.path().join("short");
        std::fs::write(&short, &dumped_volume_key(&dump)[..8]).unwrap();
        let o = cryptblk(
            &[
                "export",
                "-r",
                "--type",
                "bitlk",
                "--volume-key-file",
                short.to_str().unwrap(),
                im.path(),
                "-",
            ],
            b"",
        );
        assert!(!o.status.success() && o.stdout.is_empty(), "{name}");
    }
}
