//! Standalone integritysetup volumes (`--type integrity`, issue 38): dm-integrity's own
//! checksums, no encryption. Volumes the 6.12 kernel formatted and wrote
//! (`data/integritysetup`, made by scripts/probe-integrity-standalone.sh) read back as the
//! kernel wrote them, and fail where it never wrote; `dump` prints what `integritysetup
//! dump` printed for them; cryptblk's own format gives the superblock integritysetup
//! writes (checked with the host's integritysetup) and round-trips data; a flipped byte
//! fails exactly its block. The kernel's side of cryptblk's volumes, both ways, runs in the
//! test VM (tests/vm/integrity.sh standalone).

use crate::common::*;
use std::path::{Path, PathBuf};

const DATA: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/formats/data/integritysetup"
);

/// The 8 KiB the kernel wrote at byte 4096 of each volume.
fn pattern() -> Vec<u8> {
    (0..8192u32).map(|i| ((i * 7 + 3) & 255) as u8).collect()
}

/// The options each kernel-made volume opens with (`hkey`: the probe's HMAC key, 0..32).
fn options(name: &str, hkey: &str) -> Vec<String> {
    let mut o: Vec<String> = vec!["--type".into(), "integrity".into()];
    let alg = name.split('-').next().unwrap();
    let alg = if alg == "hmac" { "hmac-sha256" } else { alg };
    o.extend(["-I".into(), alg.into()]);
    if alg.starts_with("hmac") {
        o.extend(["--integrity-key-file".into(), hkey.into()]);
    }
    o
}

fn unxz(name: &str, dir: &Path) -> PathBuf {
    let out = run_in(
        &tool("xz", "xz-utils"),
        &["-dc", &format!("{DATA}/{name}.img.xz")],
        b"",
    );
    assert!(out.status.success(), "xz: {name}");
    let p = dir.join(format!("{name}.img"));
    std::fs::write(&p, &out.stdout).unwrap();
    p
}

fn cb(args: &[String]) -> std::process::Output {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    run_in(bin(), &refs, b"")
}

fn export(opts: &[String], img: &Path, at: u64, len: u64, out: &Path) -> std::process::Output {
    let mut a = vec!["export".to_string()];
    a.extend(opts.iter().cloned());
    a.extend([
        "--at".into(),
        at.to_string(),
        "--length".into(),
        len.to_string(),
        img.to_str().unwrap().into(),
        out.to_str().unwrap().into(),
    ]);
    cb(&a)
}

fn names() -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(DATA)
        .unwrap()
        .filter_map(|e| {
            let f = e.unwrap().file_name().into_string().unwrap();
            f.strip_suffix(".img.xz").map(str::to_string)
        })
        .collect();
    n.sort();
    n
}

#[test]
fn kernel_formatted_volumes_read_as_the_kernel_wrote_them() {
    let dir = tempfile::tempdir().unwrap();
    let hkey = dir.path().join("hkey");
    std::fs::write(&hkey, (0..32u8).collect::<Vec<u8>>()).unwrap();
    let out = dir.path().join("out");
    let names = names();
    assert_eq!(names.len(), 7, "{names:?}");
    for name in &names {
        let img = unxz(name, dir.path());
        let opts = options(name, hkey.to_str().unwrap());
        ok(&export(&opts, &img, 4096, 8192, &out));
        assert!(
            std::fs::read(&out).unwrap() == pattern(),
            "{name}: the kernel's data"
        );
        // Written with --no-wipe: the first block was never written, and fails.
        let e = export(&opts, &img, 0, 4096, &out);
        assert!(!e.status.success(), "{name}: a block never written");
        assert!(
            String::from_utf8_lossy(&e.stderr).contains("integrity check failed"),
            "{name}: {}",
            String::from_utf8_lossy(&e.stderr)
        );
        // Another checksum, or another key, verifies nothing.
        let mut wrong = opts.clone();
        if name.starts_with("hmac") {
            let other = dir.path().join("other-key");
            std::fs::write(&other, [7u8; 32]).unwrap();
            *wrong.last_mut().unwrap() = other.to_str().unwrap().into();
        } else {
            wrong[3] = if name.starts_with("crc32c") {
                "crc32"
            } else {
                "crc32c"
            }
            .into();
        }
        assert!(
            !export(&wrong, &img, 4096, 8192, &out).status.success(),
            "{name}: opened with {wrong:?}"
        );
        // `dump`: what integritysetup printed in the VM, the path aside.
        let want = std::fs::read_to_string(format!("{DATA}/{name}.dump"))
            .unwrap()
            .replace(&format!("/tmp/{name}.img"), img.to_str().unwrap());
        assert_eq!(
            ok(&run_in(bin(), &["dump", img.to_str().unwrap()], b"")),
            want,
            "{name}"
        );
    }
}

/// cryptblk's format: byte for byte the superblock fields the kernel wrote for the same
/// options (a salt of its own), read by the host's integritysetup; data round-trips; one
/// flipped byte fails its block only.
#[test]
fn format_writes_what_integritysetup_writes_and_data_round_trips() {
    let integritysetup = tool("integritysetup", "cryptsetup-bin");
    let dir = tempfile::tempdir().unwrap();
    let hkey = dir.path().join("hkey");
    std::fs::write(&hkey, (0..32u8).collect::<Vec<u8>>()).unwrap();
    let k = hkey.to_str().unwrap();
    let img = dir.path().join("img");
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();
    // No period shorter than the volume (a block is found on the device by its content).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect();
    let data_f = dir.path().join("data");
    std::fs::write(&data_f, &data).unwrap();
    let back = dir.path().join("back");
    for (name, format_only, ss) in [
        ("crc32c-512", s(&[]), 512u64),
        ("crc32-512", s(&[]), 512),
        ("sha256-4096", s(&["--sector-size", "4096"]), 4096),
        ("sha1-t8-512", s(&["--tag-size", "8"]), 512),
        ("hmac-sha256-512", s(&[]), 512),
        (
            "hmac-sha256-legacy-512",
            s(&["--integrity-legacy-hmac"]),
            512,
        ),
    ] {
        let opts = options(name, k);
        std::fs::write(&img, []).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&img)
            .unwrap()
            .set_len(8 << 20)
            .unwrap();
        let mut a = s(&["format", "-q"]);
        a.extend(opts.iter().cloned());
        a.extend(format_only);
        a.push(img.to_str().unwrap().into());
        ok(&cb(&a));
        let want = std::fs::read_to_string(format!("{DATA}/{name}.dump"))
            .unwrap()
            .replace(&format!("/tmp/{name}.img"), img.to_str().unwrap());
        let theirs = ok(&run_in(
            &integritysetup,
            &["dump", img.to_str().unwrap()],
            b"",
        ));
        assert_eq!(theirs, want, "{name}: integritysetup dump");
        assert_eq!(
            ok(&run_in(bin(), &["dump", img.to_str().unwrap()], b"")),
            want,
            "{name}: cryptblk dump"
        );
        // Wiped: every block reads (zeros) before anything is written.
        ok(&export(&opts, &img, 0, 1 << 20, &back));
        assert!(std::fs::read(&back).unwrap().iter().all(|&b| b == 0));
        // Without the journal (mode D: straight home; the open emptied the journal), so
        // that what is flipped below is not restored from the journal at the next open.
        let mut a = s(&["import", "--integrity-no-journal"]);
        a.extend(opts.iter().cloned());
        a.extend([
            img.to_str().unwrap().into(),
            data_f.to_str().unwrap().into(),
        ]);
        ok(&cb(&a));
        ok(&export(&opts, &img, 0, 1 << 20, &back));
        assert!(std::fs::read(&back).unwrap() == data, "{name}: round trip");
        // Block 3's home copy, one byte flipped: standalone volumes keep the data in the
        // clear, so it is found by its content (the journal splits blocks: never there).
        let mut raw = std::fs::read(&img).unwrap();
        let block3 = &data[3 * ss as usize..][..ss as usize];
        let at = raw
            .windows(ss as usize)
            .position(|w| w == block3)
            .expect("block 3 on the device");
        raw[at + 9] ^= 1;
        std::fs::write(&img, &raw).unwrap();
        assert!(
            !export(&opts, &img, 3 * ss, ss, &back).status.success(),
            "{name}: the flipped block"
        );
        ok(&export(&opts, &img, 0, 3 * ss, &back));
        ok(&export(&opts, &img, 4 * ss, ss, &back));
    }
}

#[test]
fn keys_checksums_and_devices_are_checked_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    std::fs::write(&img, vec![0u8; 4 << 20]).unwrap();
    let i = img.to_str().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, [1u8; 32]).unwrap();
    let k = key.to_str().unwrap();
    for (args, says) in [
        (
            vec![
                "format",
                "-q",
                "--type",
                "integrity",
                "-I",
                "hmac-sha256",
                i,
            ],
            "needs --integrity-key-file",
        ),
        (
            vec![
                "format",
                "-q",
                "--type",
                "integrity",
                "--integrity-key-file",
                k,
                i,
            ],
            "takes no key",
        ),
        (
            vec!["format", "-q", "--type", "integrity", "-I", "md4", i],
            "integrity algorithm 'md4'",
        ),
        (
            vec!["export", "--type", "integrity", i, "/dev/null"],
            "no dm-integrity superblock",
        ),
        (
            vec![
                "format",
                "-q",
                "--type",
                "integrity",
                "--journal-crypt",
                "cbc-twofish",
                "--journal-crypt-key-file",
                k,
                i,
            ],
            "journal encryption 'cbc-twofish'",
        ),
    ] {
        let o = run_in(bin(), &args, b"");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{args:?}: {err}");
    }
    assert!(
        std::fs::read(&img).unwrap().iter().all(|&b| b == 0),
        "nothing written"
    );
    ok(&run_in(
        bin(),
        &["format", "-q", "--type", "integrity", i],
        b"",
    ));
    let o = run_in(
        bin(),
        &[
            "export",
            "--type",
            "integrity",
            "--allow-discards",
            i,
            "/dev/null",
        ],
        b"",
    );
    assert!(!o.status.success(), "discards refused");
}

/// Bitmap mode from the command line: `import -B` writes under the bitmap and its clean
/// close leaves the superblock unmarked (`dump` shows no `dirty_bitmap`), and LUKS2 with
/// integrity refuses it (its tags cannot be recalculated).
#[test]
fn bitmap_mode_imports_and_closes_clean() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    std::fs::write(&img, vec![0u8; 8 << 20]).unwrap();
    let i = img.to_str().unwrap();
    let data = dir.path().join("data");
    std::fs::write(&data, pattern()).unwrap();
    let d = data.to_str().unwrap();
    let back = dir.path().join("back");
    ok(&run_in(
        bin(),
        &["format", "-q", "--type", "integrity", i],
        b"",
    ));
    ok(&run_in(
        bin(),
        &["import", "--type", "integrity", "-B", "--at", "4096", i, d],
        b"",
    ));
    let dump = ok(&run_in(bin(), &["dump", i], b""));
    assert!(!dump.contains("dirty_bitmap"), "{dump}");
    let opts = vec!["--type".to_string(), "integrity".to_string()];
    ok(&export(&opts, &img, 4096, 8192, &back));
    assert!(std::fs::read(&back).unwrap() == pattern());
    let pw = dir.path().join("pw");
    std::fs::write(&pw, b"pass").unwrap();
    let luks = dir.path().join("luks");
    std::fs::write(&luks, vec![0u8; 24 << 20]).unwrap();
    let l = luks.to_str().unwrap();
    let p = pw.to_str().unwrap();
    ok(&run_in(
        bin(),
        &[
            "format",
            "-q",
            "--type",
            "luks2",
            "--cipher",
            "aes-gcm-random",
            "--integrity",
            "aead",
            "--integrity-no-wipe",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            p,
            l,
        ],
        b"",
    ));
    let o = run_in(bin(), &["import", "-B", "--key-file", p, l, d], b"");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("bitmap mode"), "{err}");
}

/// Run as `integritysetup` (a link of that name), cryptblk takes integritysetup's command
/// line: its `format` (`-t` the tag size, `-s` the sector size, `--no-wipe`) writes what the
/// kernel's integritysetup wrote, `dump` prints what it printed, `open` returns once the
/// volume is served, `status` and `close` name it.
#[test]
fn run_as_integritysetup_it_takes_integritysetups_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("integritysetup");
    std::os::unix::fs::symlink(bin(), &link).unwrap();
    let is = link.to_str().unwrap();
    let img = dir.path().join("v.img");
    std::fs::write(&img, vec![0u8; 8 << 20]).unwrap();
    let i = img.to_str().unwrap();
    let run_dir = dir.path().join("run");
    let r = run_dir.to_str().unwrap();
    ok(&run_in(
        is,
        &["-q", "format", "-t", "8", "-I", "sha1", "--no-wipe", i],
        b"",
    ));
    let want = std::fs::read_to_string(format!("{DATA}/sha1-t8-512.dump"))
        .unwrap()
        .replace("/tmp/sha1-t8-512.img", i);
    assert_eq!(ok(&run_in(is, &["dump", i], b"")), want);
    let o = run_in(is, &["open", "-I", "sha1", i, "iv", "--run-dir", r], b"");
    ok(&o);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("`integritysetup close iv` stops it"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let st = ok(&run_in(is, &["status", "iv", "--run-dir", r], b""));
    assert!(st.contains("INTEGRITY") && st.contains("sha1"), "{st}");
    ok(&run_in(is, &["close", "iv", "--run-dir", r], b""));
    let v = ok(&run_in(is, &["--version"], b""));
    assert!(v.starts_with("integritysetup 2.6.1"), "{v}");
}
