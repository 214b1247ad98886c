//! Helpers shared by the interoperability tests: running the real cryptsetup on image files,
//! and parsing what `luksDump` prints.
//!
//! These tests need cryptsetup; a missing binary fails the test instead of skipping it.
//! `CRYPTSETUP` overrides the path (default `/usr/sbin/cryptsetup`).

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Path of the cryptsetup binary under test.
pub(crate) fn cryptsetup_path() -> PathBuf {
    let p = PathBuf::from(
        std::env::var_os("CRYPTSETUP").unwrap_or_else(|| "/usr/sbin/cryptsetup".into()),
    );
    assert!(
        p.exists(),
        "cryptsetup not found at {} (set CRYPTSETUP)",
        p.display()
    );
    p
}

/// Runs cryptsetup with `args` and returns its output, whatever the exit status.
pub(crate) fn try_cryptsetup<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    Command::new(cryptsetup_path())
        .args(args)
        .env("LC_ALL", "C")
        .output()
        .expect("cannot run cryptsetup")
}

/// Runs cryptsetup and panics with its stderr unless it succeeds; returns stdout.
pub(crate) fn cryptsetup<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> String {
    let out = try_cryptsetup(args);
    let shown: Vec<String> = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    assert!(
        out.status.success(),
        "cryptsetup {} failed ({}):\n{}{}",
        shown.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("cryptsetup output is UTF-8")
}

/// A sparse image file of `size` bytes in `dir`.
pub(crate) fn image(dir: &Path, name: &str, size: u64) -> PathBuf {
    let p = dir.join(name);
    let f = std::fs::File::create(&p).expect("create image");
    f.set_len(size).expect("size image");
    p
}

/// A key file holding exactly `contents` (passphrases go through files, never argv).
pub(crate) fn key_file(dir: &Path, name: &str, contents: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, contents).expect("write key file");
    p
}

/// A cryptsetup-made volume with `p0` in keyslot 0 and `p1` in keyslot 1 (PBKDF2-SHA256,
/// 1000 iterations): LUKS1 aes-cbc-essiv:sha256 with a 128-bit key, or LUKS2
/// aes-xts-plain64 with a 256-bit key. `layout` holds the test's extra `luksFormat`
/// options (offsets, metadata sizes).
pub(crate) fn two_passphrase_volume(
    dir: &Path,
    name: &str,
    size: u64,
    luks1: bool,
    (p0, p1): (&[u8], &[u8]),
    layout: &[&str],
) -> PathBuf {
    let img = image(dir, name, size);
    let k0 = key_file(dir, &format!("{name}.k0"), p0);
    let k1 = key_file(dir, &format!("{name}.k1"), p1);
    let (k0, k1, img_s) = (
        k0.to_str().unwrap(),
        k1.to_str().unwrap(),
        img.to_str().unwrap(),
    );
    let kdf = [
        "--batch-mode",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--hash",
        "sha256",
    ];
    let (kind, cipher, key_size) = if luks1 {
        ("luks1", "aes-cbc-essiv:sha256", "128")
    } else {
        ("luks2", "aes-xts-plain64", "256")
    };
    let mut args = vec!["luksFormat"];
    args.extend(kdf);
    args.extend(["--type", kind, "--cipher", cipher, "--key-size", key_size]);
    args.extend(layout);
    args.extend(["--key-file", k0, img_s]);
    cryptsetup(&args);
    let mut args = vec!["luksAddKey"];
    args.extend(kdf);
    args.extend(["--key-file", k0, "--new-keyfile", k1, img_s]);
    cryptsetup(&args);
    img
}

/// Opens an image read-write for the code under test.
pub(crate) fn open_rw(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open image")
}

/// Parses hex bytes separated by any whitespace ("07 0c b3 ...").
pub(crate) fn parse_hex_bytes(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap_or_else(|_| panic!("bad hex byte '{b}'")))
        .collect()
}

/// The `key: value` lines of a dump, in order. A line without a key whose content is hex
/// (a salt or digest wrapped onto several lines) is appended to the previous value.
/// Keys and values are trimmed; indentation is dropped.
pub(crate) fn dump_fields(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let continuation = line.starts_with(char::is_whitespace)
            && !t.contains(':')
            && t.split_whitespace()
                .all(|w| w.len() == 2 && u8::from_str_radix(w, 16).is_ok());
        if continuation && let Some(last) = out.last_mut() {
            last.1.push(' ');
            last.1.push_str(t);
            continue;
        }
        if let Some((k, v)) = t.split_once(':') {
            out.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    out
}

/// First value of `key` in dump fields.
pub(crate) fn field<'a>(fields: &'a [(String, String)], key: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// One LUKS1 keyslot as `cryptsetup luksDump` prints it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Luks1DumpSlot {
    pub enabled: bool,
    pub iterations: Option<u32>,
    pub salt: Option<Vec<u8>>,
    pub key_material_offset: Option<u32>,
    pub stripes: Option<u32>,
}

/// What `cryptsetup luksDump` prints for a LUKS1 header.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Luks1Dump {
    pub version: u32,
    pub cipher_name: String,
    pub cipher_mode: String,
    pub hash_spec: String,
    pub payload_offset: u64,
    pub mk_bits: u32,
    pub mk_digest: Vec<u8>,
    pub mk_salt: Vec<u8>,
    pub mk_iterations: u32,
    pub uuid: String,
    pub slots: Vec<Luks1DumpSlot>,
}

/// Parses LUKS1 `luksDump` output.
pub(crate) fn parse_luks1_dump(text: &str) -> Luks1Dump {
    let fields = dump_fields(text);
    let get =
        |k: &str| field(&fields, k).unwrap_or_else(|| panic!("luksDump lacks '{k}':\n{text}"));
    let mut d = Luks1Dump {
        version: get("Version").parse().unwrap(),
        cipher_name: get("Cipher name").to_string(),
        cipher_mode: get("Cipher mode").to_string(),
        hash_spec: get("Hash spec").to_string(),
        payload_offset: get("Payload offset").parse().unwrap(),
        mk_bits: get("MK bits").parse().unwrap(),
        mk_digest: parse_hex_bytes(get("MK digest")),
        mk_salt: parse_hex_bytes(get("MK salt")),
        mk_iterations: get("MK iterations").parse().unwrap(),
        uuid: get("UUID").to_string(),
        slots: Vec::new(),
    };
    for (k, v) in &fields {
        if let Some(n) = k.strip_prefix("Key Slot ") {
            assert_eq!(
                n.parse::<usize>().unwrap(),
                d.slots.len(),
                "slots out of order"
            );
            d.slots.push(Luks1DumpSlot {
                enabled: v == "ENABLED",
                ..Default::default()
            });
            continue;
        }
        let Some(slot) = d.slots.last_mut() else {
            continue;
        };
        match k.as_str() {
            "Iterations" => slot.iterations = Some(v.parse().unwrap()),
            "Salt" => slot.salt = Some(parse_hex_bytes(v)),
            "Key material offset" => slot.key_material_offset = Some(v.parse().unwrap()),
            "AF stripes" => slot.stripes = Some(v.parse().unwrap()),
            _ => {}
        }
    }
    d
}

/// `cryptsetup luksDump [--header H] DEV`.
pub(crate) fn luks_dump(device: &Path, header: Option<&Path>) -> String {
    let mut args: Vec<&std::ffi::OsStr> = vec!["luksDump".as_ref()];
    if let Some(h) = header {
        args.extend(["--header".as_ref(), h.as_os_str()]);
    }
    args.push(device.as_os_str());
    cryptsetup(&args)
}

/// The volume key via `luksDump --dump-volume-key` (cryptsetup >= 2.5; older releases only
/// know `--dump-master-key`, which is tried when the first is rejected).
pub(crate) fn dump_volume_key(device: &Path, header: Option<&Path>, key_file: &Path) -> Vec<u8> {
    for flag in ["--dump-volume-key", "--dump-master-key"] {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "luksDump".as_ref(),
            flag.as_ref(),
            "--batch-mode".as_ref(),
            "--key-file".as_ref(),
        ];
        args.push(key_file.as_os_str());
        if let Some(h) = header {
            args.extend(["--header".as_ref(), h.as_os_str()]);
        }
        args.push(device.as_os_str());
        let out = try_cryptsetup(&args);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains(flag) || err.contains("unknown option") || err.contains("bad argument")
            {
                continue;
            }
            panic!("cryptsetup luksDump {flag} failed: {err}");
        }
        let text = String::from_utf8(out.stdout).unwrap();
        let fields = dump_fields(&text);
        let key = field(&fields, "MK dump")
            .or_else(|| field(&fields, "Volume key"))
            .unwrap_or_else(|| panic!("no key in dump output:\n{text}"));
        return parse_hex_bytes(key);
    }
    panic!("cryptsetup knows neither --dump-volume-key nor --dump-master-key");
}

/// Exit status of `cryptsetup open --test-passphrase`: 0 accepted, 2 wrong passphrase,
/// 1 e.g. "No usable keyslot" for a given inactive slot.
pub(crate) fn test_passphrase(
    device: &Path,
    header: Option<&Path>,
    key_file: &Path,
    slot: Option<u32>,
) -> i32 {
    let slot_s = slot.map(|s| s.to_string());
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "open".as_ref(),
        "--test-passphrase".as_ref(),
        "--key-file".as_ref(),
        key_file.as_os_str(),
    ];
    if let Some(h) = header {
        args.extend(["--header".as_ref(), h.as_os_str()]);
    }
    if let Some(s) = &slot_s {
        args.extend([std::ffi::OsStr::new("--key-slot"), std::ffi::OsStr::new(s)]);
    }
    args.push(device.as_os_str());
    let out = try_cryptsetup(&args);
    out.status.code().expect("cryptsetup killed by a signal")
}
