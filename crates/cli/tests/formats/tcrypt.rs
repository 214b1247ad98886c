//! TrueCrypt and VeraCrypt volumes (`--type tcrypt`) against cryptsetup's own test set
//! (`tests/tcrypt-images.tar.xz`, fetched by scripts/fetch-cryptsetup-images.sh): every
//! image cryptsetup's tcrypt-compat-test opens - TrueCrypt 1-7 (CBC, LRW, XTS, cascades),
//! VeraCrypt (SHA-256/512, Whirlpool, RIPEMD-160, Streebog, and from cryptsetup 2.7's set
//! VeraCrypt 1.26's BLAKE2s-256; Camellia, Kuznyechik), PIM,
//! keyfiles, 72-character passphrases, hidden and system volumes - opens here and holds
//! the filesystem its test expects (blkid UUID DEAD-BABE, hidden CAFE-BABE). cryptsetup
//! itself cannot open any of them on this host (no AF_ALG); the kernel's dm-crypt reads
//! them in the VM suite (tests/vm/dmcrypt-interop.sh), with data cryptblk wrote.

use crate::common::*;
use std::path::{Path, PathBuf};

const PASSWORD: &[u8] = b"aaaaaaaaaaaa\n";
const PASSWORD_HIDDEN: &[u8] = b"bbbbbbbbbbbb\n";
const PASSWORD_72: &[u8] =
    b"aaaaaaaaaaaabbbbbbbbbbbbccccccccccccddddddddddddeeeeeeeeeeeeffffffffffff\n";

struct Image {
    path: PathBuf,
    name: String,
}

impl Image {
    /// cryptsetup's test takes `-h` and `-c` from the name: `tc_5-sha512-xts-aes...`.
    fn hash(&self) -> &str {
        self.name.split('-').nth(1).unwrap()
    }
    fn cipher(&self) -> &str {
        self.name.split('-').nth(3).unwrap()
    }
    fn args<'a>(&'a self, verb: &'a str) -> Vec<&'a str> {
        let mut a = vec![
            verb,
            "--type",
            "tcrypt",
            "-h",
            self.hash(),
            "-c",
            self.cipher(),
        ];
        if self.name.starts_with("vcpim") {
            a.extend(["--veracrypt-pim", "1234"]);
        }
        if self.name.starts_with("sys_") {
            a.push("--tcrypt-system");
        }
        if self.name.ends_with("-hidden") {
            a.push("--tcrypt-hidden");
        }
        if self.name.starts_with("tck") || self.name.starts_with("vck") {
            a.extend(["-d", "keyfile1", "-d", "keyfile2"]);
        }
        a
    }
    fn password(&self) -> &'static [u8] {
        if self.name.ends_with("-hidden") {
            PASSWORD_HIDDEN
        } else if self.name.starts_with("vck_1_nopw") {
            b"\n"
        } else if self.name.starts_with("vck_1_pw72") {
            PASSWORD_72
        } else {
            PASSWORD
        }
    }
    /// TrueCrypt's CBC cascades and little-endian Blowfish (cryptsetup's `-tcrypt`
    /// modes): headers open, data is refused (nor does cryptsetup map them; the images
    /// keep no data to check against).
    fn legacy_cascade(&self) -> bool {
        let mut parts = self.name.trim_end_matches("-hidden").split('-').skip(2);
        parts.next() == Some("cbc") && (parts.clone().count() > 1 || self.name.contains("blowfish"))
    }
}

fn images(dir: &Path) -> Vec<Image> {
    let mut v: Vec<Image> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_string();
            let ok = ["tc_", "vc_", "tck_", "vck_", "vcpim_", "sys_tc_", "sys_vc_"]
                .iter()
                .any(|pre| name.starts_with(pre));
            ok.then_some(Image { path: p, name })
        })
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

fn run_at_dir(dir: &Path, args: &[&str], stdin: &[u8]) -> std::process::Output {
    run_at(Some(dir), bin(), args, stdin)
}

#[test]
fn cryptsetups_tcrypt_test_set_opens_with_the_expected_filesystems() {
    let src = cryptsetup_images("tcrypt-images");
    let blkid = tool("blkid", "util-linux");
    let tmp = tempfile::tempdir().unwrap();
    let all = images(&src);
    assert!(
        all.len() >= 60,
        "cryptsetup's TCRYPT set: {} images",
        all.len()
    );
    // VeraCrypt 1.26's BLAKE2s-256 PRF: cryptsetup 2.7's images (fetched with 2.6.1's).
    let blake2s = all.iter().filter(|i| i.hash() == "blake2s").count();
    assert!(
        blake2s >= 4,
        "{blake2s} BLAKE2s images: run scripts/fetch-cryptsetup-images.sh (it fetches cryptsetup 2.7's TCRYPT images too)"
    );
    let (mut opened, mut refused) = (0, 0);
    for img in &all {
        let out_file = tmp.path().join("plain");
        let out_s = out_file.to_str().unwrap().to_string();
        let mut args = img.args("export");
        let p = img.path.to_str().unwrap();
        args.extend([p, &out_s]);
        let out = run_at_dir(&src, &args, img.password());
        if img.legacy_cascade() {
            // The header opens; mapping the data is refused with a clear message.
            assert_eq!(out.status.code(), Some(1), "{}: {out:?}", img.name);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("legacy mode"), "{}: {err}", img.name);
            let mut t = img.args("test-passphrase");
            t.push(p);
            let ok = run_at_dir(&src, &t, img.password());
            assert!(ok.status.success(), "{}: header: {ok:?}", img.name);
            refused += 1;
            continue;
        }
        assert!(out.status.success(), "{}: {out:?}", img.name);
        let uuid = ok(&run_in(
            &blkid,
            &["-p", "-o", "value", "-s", "UUID", &out_s],
            b"",
        ));
        let want = if img.name.ends_with("-hidden") {
            "CAFE-BABE"
        } else {
            "DEAD-BABE"
        };
        assert_eq!(uuid.trim(), want, "{}: filesystem inside", img.name);
        std::fs::remove_file(&out_file).unwrap();
        opened += 1;
    }
    eprintln!(
        "tcrypt images: {opened} opened with their filesystem, {refused} legacy cascades refused"
    );
    assert!(
        opened >= 60 && refused <= 10,
        "{opened} opened, {refused} refused"
    );
}

/// tcryptDump as cryptsetup prints it; the same image's key through `--dump-volume-key`
/// decrypts the data as plain mode with the chain's spec would (independent path).
#[test]
fn dump_and_volume_key() {
    let src = cryptsetup_images("tcrypt-images");
    let img = src.join("vc_1-sha512-xts-aes");
    let p = img.to_str().unwrap();
    let d = ok(&run_in(
        bin(),
        &["dump", "--type", "tcrypt", "-h", "sha512", p],
        PASSWORD,
    ));
    for want in [
        "VERACRYPT header information for",
        "Version:       \t5",
        "Sector size:\t512",
        "MK offset:\t131072",
        "PBKDF2 hash:\tsha512",
        "Cipher chain:\taes",
        "Cipher mode:\txts-plain64",
        "MK bits:       \t512",
    ] {
        assert!(d.contains(want), "missing {want:?} in:\n{d}");
    }
    let d = ok(&run_in(
        bin(),
        &[
            "dump",
            "-q",
            "--type",
            "tcrypt",
            "--dump-volume-key",
            "-h",
            "sha512",
            p,
        ],
        PASSWORD,
    ));
    assert!(d.contains("Payload offset:\t256"), "{d}");
    let hex: String = d
        .split("MK dump:")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(hex.len(), 128, "{d}");
    // Plain mode with that key, offset and IV offset reads the same filesystem.
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("vk");
    std::fs::write(&key, hex::decode(&hex).unwrap()).unwrap();
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    ok(&run_in(
        bin(),
        &[
            "export",
            "--type",
            "tcrypt",
            "-h",
            "sha512",
            p,
            a.to_str().unwrap(),
        ],
        PASSWORD,
    ));
    let len = std::fs::metadata(&a).unwrap().len().to_string();
    ok(&run_in(
        bin(),
        &[
            "export",
            "--type",
            "plain",
            "--cipher",
            "aes-xts-plain64",
            "--key-size",
            "512",
            "--key-file",
            key.to_str().unwrap(),
            "--offset",
            "256",
            "--skip",
            "256",
            "--length",
            &len,
            p,
            b.to_str().unwrap(),
        ],
        b"",
    ));
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());
}

/// Wrong passphrase, wrong PIM, TrueCrypt-only search of a VeraCrypt volume, a damaged
/// or truncated header: a clear error and the exit code cryptsetup uses, nothing written.
#[test]
fn bad_input_is_refused_and_nothing_is_written() {
    let src = cryptsetup_images("tcrypt-images");
    let tmp = tempfile::tempdir().unwrap();
    let copy = |name: &str| {
        let dst = tmp.path().join(name);
        std::fs::copy(src.join(name), &dst).unwrap();
        dst.to_str().unwrap().to_string()
    };
    let vc = copy("vc_1-sha512-xts-aes");
    let before = std::fs::read(&vc).unwrap();
    let test = |extra: &[&str], dev: &str, pw: &[u8]| {
        let mut a = vec!["test-passphrase", "--type", "tcrypt", "-h", "sha512"];
        a.extend(extra);
        a.push(dev);
        run_in(bin(), &a, pw)
    };
    let out = test(&[], &vc, b"wrong\n");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("No device header detected"));
    let pim = copy("vcpim_1-sha256-xts-aes");
    let out = run_in(
        bin(),
        &[
            "test-passphrase",
            "--type",
            "tcrypt",
            "-h",
            "sha256",
            "--veracrypt-pim",
            "1233",
            &pim,
        ],
        PASSWORD,
    );
    assert_eq!(out.status.code(), Some(2), "wrong PIM: {out:?}");
    let out = test(&["--disable-veracrypt"], &vc, PASSWORD);
    assert_eq!(out.status.code(), Some(2), "TrueCrypt-only search: {out:?}");
    // A flipped byte in the encrypted part, in the block at 192 of the decrypted header:
    // the magic still matches, the keys' CRC does not (damage, not a wrong passphrase).
    let mut bytes = before.clone();
    bytes[64 + 200] ^= 0x40;
    let damaged = tmp.path().join("damaged");
    std::fs::write(&damaged, &bytes).unwrap();
    let out = test(&[], damaged.to_str().unwrap(), PASSWORD);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("TCRYPT: corrupt metadata: keys CRC32 mismatch"),
        "{err}"
    );
    let short = tmp.path().join("short");
    std::fs::write(&short, &before[..300]).unwrap();
    let out = test(&[], short.to_str().unwrap(), PASSWORD);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("truncated"),
        "{out:?}"
    );
    let out = test(&["--tcrypt-hidden", "--tcrypt-system"], &vc, PASSWORD);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(std::fs::read(&vc).unwrap(), before, "nothing written");
}

/// Read-write as cryptsetup maps them: data imported into VeraCrypt, TrueCrypt LRW and CBC
/// and hidden volumes reads back, the headers stay byte for byte, no plaintext on disk.
#[test]
fn writes_read_back_and_leave_headers_alone() {
    let src = cryptsetup_images("tcrypt-images");
    let tmp = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 37 % 253) as u8).collect();
    let dfile = tmp.path().join("data");
    std::fs::write(&dfile, &data).unwrap();
    for (name, extra, pw) in [
        (
            "vc_1-sha512-xts-aes-twofish-serpent",
            vec!["-h", "sha512"],
            PASSWORD,
        ),
        (
            "tc_2-ripemd160-lrw-serpent",
            vec!["-h", "ripemd160"],
            PASSWORD,
        ),
        ("tc_1-sha1-cbc-cast5", vec!["-h", "sha1"], PASSWORD),
        (
            "tc_5-sha512-xts-aes-hidden",
            vec!["-h", "sha512", "--tcrypt-hidden"],
            PASSWORD_HIDDEN,
        ),
    ] {
        let img = tmp.path().join(name);
        std::fs::copy(src.join(name), &img).unwrap();
        let before = std::fs::read(&img).unwrap();
        let p = img.to_str().unwrap();
        let mut a = vec!["import", "--type", "tcrypt"];
        a.extend(&extra);
        a.extend([p, dfile.to_str().unwrap(), "--at", "2048"]);
        ok(&run_in(bin(), &a, pw));
        let after = std::fs::read(&img).unwrap();
        assert_eq!(after[..512], before[..512], "{name}: header unchanged");
        assert_ne!(after, before, "{name}: data written");
        assert!(
            !after.windows(64).any(|w| w == &data[..64]),
            "{name}: plaintext on disk"
        );
        let back = tmp.path().join("back");
        let mut a = vec!["export", "--type", "tcrypt"];
        a.extend(&extra);
        a.extend([p, back.to_str().unwrap()]);
        ok(&run_in(bin(), &a, pw));
        let back = std::fs::read(&back).unwrap();
        assert!(back[2048..2048 + 4096] == data[..], "{name}: read back");
    }
}

/// A VeraCrypt volume served over NBD (`open --type tcrypt --nbd`), the passphrase on
/// stdin: nbdcopy reads the whole device and it holds the filesystem, `status` names the format and the cascade (cryptsetup's name for VeraCrypt's
/// "AES(Twofish(Serpent))": serpent-twofish-aes).
#[test]
fn served_over_nbd() {
    let src = cryptsetup_images("tcrypt-images");
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("vc.img");
    std::fs::copy(src.join("vc_1-sha512-xts-aes-twofish-serpent"), &img).unwrap();
    let sock = tmp.path().join("s.sock");
    let run_dir = tmp.path().join("run");
    let (img_s, run_s) = (img.to_str().unwrap(), run_dir.to_str().unwrap());
    let mut child = serve_nbd_unix(
        &[
            "open",
            "--type",
            "tcrypt",
            "-h",
            "sha512",
            img_s,
            "vc",
            "--run-dir",
            run_s,
        ],
        &sock,
        PASSWORD,
    );
    let uri = format!("nbd+unix:///vc?socket={}", sock.display());
    let status = ok(&run_in(bin(), &["status", "vc", "--run-dir", run_s], b""));
    assert!(
        status.contains("VERACRYPT") && status.contains("serpent-twofish-aes-xts-plain64"),
        "{status}"
    );
    let copy = tmp.path().join("copy");
    ok(&run_in(
        &tool("nbdcopy", "libnbd-bin"),
        &[&uri, copy.to_str().unwrap()],
        b"",
    ));
    let uuid = ok(&run_in(
        &tool("blkid", "util-linux"),
        &["-p", "-o", "value", "-s", "UUID", copy.to_str().unwrap()],
        b"",
    ));
    assert_eq!(uuid.trim(), "DEAD-BABE");
    ok(&run_in(bin(), &["close", "vc", "--run-dir", run_s], b""));
    assert!(child.wait().unwrap().success());
}

/// `tcplay -i`'s field (`Cipher:`, `PBKDF2 PRF:`...) in its info text.
fn tcplay_field<'a>(info: &'a str, name: &str) -> &'a str {
    info.lines()
        .find_map(|l| l.strip_prefix(name))
        .unwrap_or_else(|| panic!("no {name} in tcplay's info:\n{info}"))
        .trim()
}

/// Volumes made by an independent tool, Debian's tcplay 1.1 (TrueCrypt's format): every
/// PBKDF2 PRF it offers, single ciphers and cascades, an outer volume with a hidden one.
/// cryptblk finds each header (the hidden one with `--tcrypt-hidden`), reports what
/// `tcplay --info` reports (chain, PRF, key bits, data offset and size), and what it
/// writes reads back with both headers left as they were. tcplay needs a block device
/// (a loop device: root) and a terminal (tests/tools/tcplay-create.py gives it one).
#[test]
fn tcplay_made_volumes() {
    if !is_root() || !Path::new("/dev/loop-control").exists() {
        eprintln!(
            "NOT RUN: tcplay writes only to block devices: loop devices need root (CI runs the tests as root)"
        );
        return;
    }
    tool("tcplay", "tcplay");
    let driver = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tools/tcplay-create.py");
    // (PRF, chain, hidden PRF and chain)
    let cases = [
        ("SHA512", "AES-256-XTS", None),
        ("RIPEMD160", "SERPENT-256-XTS", None),
        ("whirlpool", "TWOFISH-256-XTS,AES-256-XTS", None),
        (
            "RIPEMD160",
            "SERPENT-256-XTS,TWOFISH-256-XTS,AES-256-XTS",
            Some(("whirlpool", "AES-256-XTS,SERPENT-256-XTS")),
        ),
    ];
    for (prf, chain, hidden) in cases {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("tc.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        let img_s = img.to_str().unwrap();
        let loopdev = ok(&run_in("losetup", &["-f", "--show", img_s], b""))
            .trim()
            .to_string();
        let mut args = vec!["-c", "-d", &loopdev, "-a", prf, "-b", chain];
        if let Some((hprf, hchain)) = hidden {
            args.extend(["-g", "-x", hprf, "-y", hchain]);
        }
        let mut full = vec![driver, "outer-pass", "hidden-pass", "4M", "--"];
        full.extend(&args);
        let made = run_in("python3", &full, b"");
        let info = run_in(
            "python3",
            &[driver, "outer-pass", "", "0", "--", "-i", "-d", &loopdev],
            b"",
        );
        let outer_info = String::from_utf8_lossy(&info.stdout).replace('\r', "");
        ok(&run_in("losetup", &["-d", &loopdev], b""));
        assert!(
            made.status.success(),
            "tcplay {args:?}: {}",
            String::from_utf8_lossy(&made.stdout)
        );
        assert!(info.status.success(), "tcplay -i: {outer_info}");

        let check = |pass: &str, extra: &[&str], prf: &str, chain: &str, info: Option<&str>| {
            let mut a = vec!["dump", "--type", "tcrypt"];
            a.extend(extra);
            a.push(img_s);
            let dump = ok(&run_in(bin(), &a, format!("{pass}\n").as_bytes()));
            let field = |n: &str| {
                dump.lines()
                    .find_map(|l| l.strip_prefix(n))
                    .unwrap()
                    .trim()
                    .to_string()
            };
            let want_chain = chain
                .replace("-256-XTS", "")
                .replace(',', "-")
                .to_lowercase();
            assert_eq!(field("Cipher chain:"), want_chain, "{chain}");
            assert_eq!(field("PBKDF2 hash:"), prf.to_lowercase(), "{prf}");
            if let Some(info) = info {
                assert_eq!(tcplay_field(info, "Cipher:"), chain);
                assert_eq!(
                    tcplay_field(info, "Key Length:"),
                    format!("{} bits", field("MK bits:"))
                );
                let off: u64 = tcplay_field(info, "Block offset:")
                    .trim_end_matches(" sectors")
                    .parse()
                    .unwrap();
                assert_eq!(field("MK offset:"), (off * 512).to_string());
            }
        };
        check("outer-pass", &[], prf, chain, Some(&outer_info));
        if let Some((hprf, hchain)) = hidden {
            check("hidden-pass", &["--tcrypt-hidden"], hprf, hchain, None);
        }

        // Writes read back; the headers (first and last 128 KiB) are untouched.
        let before = std::fs::read(&img).unwrap();
        let pattern: Vec<u8> = (0..1u32 << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        let src = dir.path().join("pattern");
        std::fs::write(&src, &pattern).unwrap();
        ok(&run_in(
            bin(),
            &[
                "import",
                "-q",
                "--type",
                "tcrypt",
                img_s,
                src.to_str().unwrap(),
            ],
            b"outer-pass\n",
        ));
        let back = ok_bytes(&run_in(
            bin(),
            &["export", "-r", "--type", "tcrypt", img_s, "-"],
            b"outer-pass\n",
        ));
        assert_eq!(&back[..pattern.len()], &pattern[..], "{chain}");
        let after = std::fs::read(&img).unwrap();
        assert_eq!(after[..131072], before[..131072], "{chain}: header");
        let n = after.len();
        assert_eq!(
            after[n - 131072..],
            before[n - 131072..],
            "{chain}: backup header"
        );
        assert_ne!(after, before);
    }
}

fn ok_bytes(o: &std::process::Output) -> Vec<u8> {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o.stdout.clone()
}

/// VeraCrypt 1.26.29's Argon2id headers, on volumes made independently of cryptblk
/// (`tests/tools/veracrypt-argon2-create.py`: Python cryptography's Argon2id and AES-XTS,
/// VeraCrypt's layout and PIM rules): found by the full KDF search (tried last, as
/// VeraCrypt does) and by `-h argon2id`; a PIM, the backup header, a wrong passphrase or
/// PIM; data read back as written, and cryptblk's writes decrypted by Python; refused
/// for system volumes (VeraCrypt has no Argon2id before boot).
#[test]
fn veracrypt_argon2id_volumes() {
    let tmp = tempfile::tempdir().unwrap();
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/veracrypt-argon2-create.py");
    let make = |name: &str, pim: &str| {
        let img = tmp.path().join(name);
        let plain = tmp.path().join(format!("{name}.plain"));
        ok(&run_in(
            "python3",
            &[
                script.to_str().unwrap(),
                img.to_str().unwrap(),
                "argon pass",
                pim,
                "4194304",
                plain.to_str().unwrap(),
            ],
            b"",
        ));
        (img, std::fs::read(plain).unwrap())
    };
    let cb = |args: &[&str], img: &Path, stdin: &[u8]| {
        let mut a = args.to_vec();
        a.push(img.to_str().unwrap());
        run_in(bin(), &a, stdin)
    };

    // VeraCrypt's default costs (PIM 12: 416 MiB, 6 passes), no -h: the whole search.
    let (img, plain) = make("default.img", "0");
    let dump = ok(&cb(&["dump", "--type", "tcrypt"], &img, b"argon pass\n"));
    assert!(
        dump.contains("Argon2id:\ttime 6, memory 425984 KiB, 1 lane")
            && dump.contains("Cipher chain:\taes\n"),
        "{dump}"
    );
    let mut args = vec!["export", "-r", "--type", "tcrypt", "-h", "argon2id"];
    args.extend([img.to_str().unwrap(), "-"]);
    let data = ok_bytes(&run_in(bin(), &args, b"argon pass\n"));
    assert!(data == plain, "the data reads back as written");
    let o = cb(
        &["test-passphrase", "--type", "tcrypt", "-h", "argon2id"],
        &img,
        b"argon pas\n",
    );
    assert_eq!(o.status.code(), Some(2), "a wrong passphrase");

    // PIM 3 (128 MiB, 3 passes): needs the PIM; the backup header opens too.
    let (img, plain) = make("pim.img", "3");
    let pim = ["--veracrypt-pim", "3", "-h", "argon2id"];
    let o = cb(
        &["test-passphrase", "--type", "tcrypt", "-h", "argon2id"],
        &img,
        b"argon pass\n",
    );
    assert_eq!(o.status.code(), Some(2), "without its PIM");
    for extra in [&[][..], &["--tcrypt-backup"][..]] {
        let mut a = vec!["dump", "--type", "tcrypt"];
        a.extend(pim);
        a.extend(extra);
        let d = ok(&cb(&a, &img, b"argon pass\n"));
        assert!(
            d.contains("Argon2id:\ttime 3, memory 131072 KiB"),
            "{extra:?}: {d}"
        );
    }
    // cryptblk writes; Python's AES-XTS reads the image with the volume key.
    let pattern: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(7919) >> 3) as u8)
        .collect();
    let src = tmp.path().join("pattern");
    std::fs::write(&src, &pattern).unwrap();
    let mut a = vec!["import", "-q", "--type", "tcrypt"];
    a.extend(pim);
    a.extend([img.to_str().unwrap(), src.to_str().unwrap()]);
    ok(&run_in(bin(), &a, b"argon pass\n"));
    let mut a = vec!["dump", "--type", "tcrypt", "--dump-volume-key", "-q"];
    a.extend(pim);
    let key = dumped_volume_key(&ok(&cb(&a, &img, b"argon pass\n")));
    assert_eq!(key.len(), 64);
    let key_hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let decrypt = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/xts-decrypt.py");
    let theirs = ok_bytes(&run_in(
        "python3",
        &[
            decrypt.to_str().unwrap(),
            &key_hex,
            img.to_str().unwrap(),
            "131072",
            "0",
            &(2u32 << 20).to_string(),
            "256",
        ],
        b"",
    ));
    assert!(
        theirs[..1 << 20] == pattern[..],
        "Python reads what cryptblk wrote"
    );
    assert!(
        theirs[1 << 20..] == plain[1 << 20..2 << 20],
        "and the rest is untouched"
    );

    // No Argon2id for system volumes.
    let o = cb(
        &[
            "test-passphrase",
            "--type",
            "tcrypt",
            "--tcrypt-system",
            "-h",
            "argon2id",
        ],
        &img,
        b"argon pass\n",
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not for system volumes"));
}
