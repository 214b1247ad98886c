//! The `cryptblk` binary end to end, checked against the real cryptsetup.

use crate::common::{bin, ok, run_in as run, tool};
use std::path::PathBuf;
use std::process::Output;

fn cryptsetup() -> String {
    tool("cryptsetup", "cryptsetup-bin")
}

fn cb(args: &[&str]) -> Output {
    run(bin(), args, b"")
}

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        Env {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn s(&self, name: &str) -> String {
        self.path(name).to_str().unwrap().to_string()
    }
    fn file(&self, name: &str, content: &[u8]) -> String {
        std::fs::write(self.path(name), content).unwrap();
        self.s(name)
    }
    fn image(&self, name: &str, mib: u64) -> String {
        let f = std::fs::File::create(self.path(name)).unwrap();
        f.set_len(mib << 20).unwrap();
        self.s(name)
    }
}

const CHEAP: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn format(env: &Env, img: &str, kind: &str, extra: &[&str]) -> String {
    let pw = env.file("pw", b"first passphrase");
    let mut args = vec!["format", "-q", "--type", kind, "--key-file", &pw];
    args.extend_from_slice(&CHEAP);
    args.extend_from_slice(extra);
    args.push(img);
    ok(&cb(&args));
    pw
}

fn sha(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[test]
fn formatted_volumes_open_in_cryptsetup_and_dump_agrees() {
    for kind in ["luks1", "luks2"] {
        for cipher in ["aes-xts-plain64", "aes-cbc-essiv:sha256"] {
            let env = Env::new();
            let img = env.image("v.img", 20);
            let pw = format(
                &env,
                &img,
                kind,
                &[
                    "--cipher",
                    cipher,
                    "--uuid",
                    "0a1b2c3d-1111-2222-3333-444455556666",
                ],
            );
            let o = run(
                &cryptsetup(),
                &["open", "--test-passphrase", "--key-file", &pw, &img],
                b"",
            );
            ok(&o);
            let dump = ok(&run(&cryptsetup(), &["luksDump", &img], b""));
            assert!(
                dump.contains("0a1b2c3d-1111-2222-3333-444455556666"),
                "{dump}"
            );
            assert!(
                dump.contains(if kind == "luks1" {
                    "Version:       \t1"
                } else {
                    "Version:       \t2"
                }),
                "{dump}"
            );
            let j: serde_json::Value =
                serde_json::from_str(&ok(&cb(&["dump", "--json", &img]))).unwrap();
            assert_eq!(j["cipher"], cipher);
            assert_eq!(j["uuid"], "0a1b2c3d-1111-2222-3333-444455556666");
            assert_eq!(j["version"], if kind == "luks1" { 1 } else { 2 });
            assert_eq!(j["keyslots"].as_array().unwrap().len(), 1);
            let uuid = ok(&cb(&["uuid", &img]));
            assert_eq!(uuid.trim(), "0a1b2c3d-1111-2222-3333-444455556666");
            ok(&cb(&["is-luks", &img]));
        }
    }
}

#[test]
fn volume_key_matches_cryptsetup() {
    let env = Env::new();
    let img = env.image("v.img", 20);
    let pw = format(&env, &img, "luks2", &[]);
    // Like cryptsetup, it asks before printing the key only when stdin is a terminal;
    // here it is not, so the key is printed without -q, as cryptsetup prints it.
    let asked = ok(&cb(&[
        "dump",
        "--json",
        "--dump-volume-key",
        "--key-file",
        &pw,
        &img,
    ]));
    assert!(asked.contains("volume_key"));
    let mine: serde_json::Value = serde_json::from_str(&ok(&cb(&[
        "dump",
        "--json",
        "--dump-volume-key",
        "--batch-mode",
        "--key-file",
        &pw,
        &img,
    ])))
    .unwrap();
    let theirs = ok(&run(
        &cryptsetup(),
        &[
            "luksDump",
            "--dump-volume-key",
            "--batch-mode",
            "--key-file",
            &pw,
            &img,
        ],
        b"",
    ));
    let hex: String = theirs
        .lines()
        .skip_while(|l| !l.starts_with("MK dump:"))
        .flat_map(|l| {
            l.trim_start_matches("MK dump:")
                .split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(mine["volume_key"].as_str().unwrap(), hex);
}

#[test]
fn volume_key_file_opens_what_cryptsetup_writes() {
    // cryptsetup writes the volume key to a file; cryptblk opens the volume with it (no
    // keyslot), checks it alone, and refuses a wrong one as a wrong passphrase (exit 2).
    let env = Env::new();
    let img = env.image("vk.img", 20);
    let pw = format(&env, &img, "luks2", &[]);
    let data = env.s("data.bin");
    std::fs::write(
        &data,
        (0..1u32 << 20).map(|i| (i * 7) as u8).collect::<Vec<_>>(),
    )
    .unwrap();
    ok(&cb(&["import", "--key-file", &pw, &img, &data]));
    let vk = env.s("vk.bin");
    ok(&run(
        &cryptsetup(),
        &[
            "luksDump",
            "-q",
            "--dump-volume-key",
            "--volume-key-file",
            &vk,
            "--key-file",
            &pw,
            &img,
        ],
        b"",
    ));
    let out = env.s("out.bin");
    ok(&cb(&["export", "--volume-key-file", &vk, &img, &out]));
    assert_eq!(
        std::fs::read(&out).unwrap()[..1 << 20],
        std::fs::read(&data).unwrap()[..]
    );
    ok(&cb(&[
        "open",
        "--test-passphrase",
        "--volume-key-file",
        &vk,
        &img,
    ]));
    let bad = env.s("bad.bin");
    std::fs::write(&bad, [0x5a; 64]).unwrap();
    let o = cb(&[
        "export",
        "--volume-key-file",
        &bad,
        &img,
        &env.s("out2.bin"),
    ]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        cb(&["open", "--test-passphrase", "--volume-key-file", &bad, &img])
            .status
            .code(),
        Some(2)
    );
}

#[test]
fn unbound_keys_are_not_a_way_in() {
    // An unbound key's keyslot (made by cryptblk, checked by cryptsetup) never vouches
    // for killing a keyslot of the volume's key, and does not count as one that remains.
    let env = Env::new();
    let img = env.image("u.img", 20);
    let pw = format(&env, &img, "luks2", &["--key-slot", "2"]);
    let upw = env.file("upw", b"unbound passphrase");
    let mut add = vec![
        "add-key",
        "--unbound",
        "-s",
        "72",
        "-S",
        "0",
        "--new-keyfile",
        &upw,
        "--key-file",
        &pw,
    ];
    add.extend_from_slice(&CHEAP);
    add.push(&img);
    ok(&cb(&add));
    let pw2 = env.file("pw2", b"second passphrase");
    let mut add2 = vec!["add-key", "-S", "3", "--key-file", &pw];
    add2.extend_from_slice(&CHEAP);
    add2.extend_from_slice(&[&img, &pw2]);
    ok(&cb(&add2));
    let dump = ok(&run(&cryptsetup(), &["luksDump", &img], b""));
    assert!(dump.contains("0: luks2 (unbound)"), "{dump}");
    ok(&run(
        &cryptsetup(),
        &[
            "open",
            "--test-passphrase",
            "--unbound",
            "--key-file",
            &upw,
            &img,
        ],
        b"",
    ));
    // The unbound passphrase opens no data and vouches for no kill.
    assert_eq!(
        cb(&["open", "--test-passphrase", "--key-file", &upw, &img])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        cb(&["kill-slot", "--key-file", &upw, &img, "3"])
            .status
            .code(),
        Some(2)
    );
    // The volume's passphrase does, whatever keyslot comes first.
    ok(&cb(&["kill-slot", "--key-file", &pw, &img, "3"]));
    ok(&cb(&["kill-slot", "-q", &img, "0"]));
    ok(&run(
        &cryptsetup(),
        &["open", "--test-passphrase", "--key-file", &pw, &img],
        b"",
    ));
}

#[test]
fn keyslot_commands_round_trip_with_cryptsetup() {
    for kind in ["luks1", "luks2"] {
        let env = Env::new();
        let img = env.image("v.img", 20);
        let pw = format(&env, &img, kind, &[]);
        let pw2 = env.file("pw2", b"second passphrase");
        let pw3 = env.file("pw3", b"third passphrase");
        // add-key with the existing key from --key-file, the new one from a file.
        let mut add = vec!["add-key", "--key-file", &pw];
        add.extend_from_slice(&CHEAP);
        add.extend([img.as_str(), pw2.as_str()]);
        ok(&cb(&add));
        ok(&run(
            &cryptsetup(),
            &["open", "--test-passphrase", "--key-file", &pw2, &img],
            b"",
        ));
        // A key cryptsetup adds opens in cryptblk.
        ok(&run(
            &cryptsetup(),
            &[
                "luksAddKey",
                "--batch-mode",
                "--pbkdf-force-iterations",
                "1000",
                "--pbkdf",
                "pbkdf2",
                "--key-file",
                &pw,
                &img,
                &pw3,
            ],
            b"",
        ));
        ok(&cb(&["test-passphrase", "--key-file", &pw3, &img]));
        // change-key: pw2 → new, pw2 no longer works anywhere.
        let pw4 = env.file("pw4", b"fourth passphrase");
        let mut change = vec!["change-key", "--key-file", &pw2];
        change.extend_from_slice(&CHEAP);
        change.extend([img.as_str(), pw4.as_str()]);
        ok(&cb(&change));
        assert_eq!(
            cb(&["test-passphrase", "--key-file", &pw2, &img])
                .status
                .code(),
            Some(2)
        );
        ok(&run(
            &cryptsetup(),
            &["open", "--test-passphrase", "--key-file", &pw4, &img],
            b"",
        ));
        // remove-key pw3; cryptsetup no longer accepts it.
        ok(&cb(&["remove-key", "-q", &img, &pw3]));
        assert_eq!(
            run(
                &cryptsetup(),
                &["open", "--test-passphrase", "--key-file", &pw3, &img],
                b""
            )
            .status
            .code(),
            Some(2)
        );
        // kill-slot 0 (the first passphrase), with a remaining passphrase as proof.
        ok(&cb(&["kill-slot", "--key-file", &pw4, &img, "0"]));
        assert_eq!(
            cb(&["test-passphrase", "--key-file", &pw, &img])
                .status
                .code(),
            Some(2)
        );
        ok(&cb(&["test-passphrase", "--key-file", &pw4, &img]));
    }
}

#[test]
fn passphrase_from_stdin_and_wrong_passphrase_writes_nothing() {
    let env = Env::new();
    let img = env.image("v.img", 20);
    let mut args = vec!["format", "-q", "--type", "luks2"];
    args.extend_from_slice(&CHEAP);
    args.push(&img);
    ok(&run(bin(), &args, b"typed secret\n"));
    ok(&run(bin(), &["test-passphrase", &img], b"typed secret\n"));
    ok(&run(
        &cryptsetup(),
        &["open", "--test-passphrase", &img],
        b"typed secret",
    ));
    let before = sha(&img);
    let o = run(bin(), &["add-key", &img], b"wrong secret\nnew secret\n");
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("No key available"));
    assert!(sha(&img) == before, "a failed add-key changed the image");
}

#[test]
fn bad_input_gives_clear_errors_and_changes_nothing() {
    let env = Env::new();
    let img = env.image("v.img", 20);
    let pw = format(&env, &img, "luks2", &[]);
    // Missing device: exit 4.
    assert_eq!(cb(&["dump", &env.s("absent.img")]).status.code(), Some(4));
    // Not LUKS.
    let junk = env.file("junk.img", &[0x42u8; 65536]);
    let o = cb(&["dump", &junk]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not a valid LUKS device"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(cb(&["is-luks", &junk]).status.code(), Some(1));
    // Truncated header (LUKS1 and LUKS2).
    for kind in ["luks1", "luks2"] {
        let img2 = env.image(&format!("t-{kind}.img"), 20);
        format(&env, &img2, kind, &[]);
        let data = std::fs::read(&img2).unwrap();
        let trunc = env.file(&format!("trunc-{kind}.img"), &data[..3000]);
        let before = sha(&trunc);
        let o = cb(&["test-passphrase", "--key-file", &pw, &trunc]);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{kind}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
        assert!(sha(&trunc) == before);
    }
    // Bad checksum in the primary LUKS2 copy: falls back to the secondary, read-only.
    let mut data = std::fs::read(&img).unwrap();
    data[0x1000 + 10] ^= 0xff; // inside the primary's JSON area
    std::fs::write(&img, &data).unwrap();
    ok(&cb(&["test-passphrase", "--key-file", &pw, &img]));
    assert!(sha(&img) == data, "reading must not repair or write");
    // Too small for the default layout.
    let tiny = env.image("tiny.img", 1);
    let o = cb(&[
        "format",
        "-q",
        "--key-file",
        &pw,
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        &tiny,
    ]);
    // As cryptsetup: formatted (the image grows to hold the header) with a warning that
    // no data fits; opening it then fails.
    assert_eq!(o.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("too small for activation"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(std::fs::metadata(&tiny).unwrap().len(), 16 << 20);
    let cs = run(
        &cryptsetup(),
        &[
            "-q",
            "luksFormat",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            &pw,
            &env.image("tiny2.img", 1),
        ],
        b"",
    );
    assert_eq!(cs.status.code(), Some(0), "cryptsetup formats it too");

    // Unknown cipher.
    let o = cb(&[
        "format",
        "-q",
        "--cipher",
        "anubis-xts-plain64",
        "--key-file",
        &pw,
        &img,
    ]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn header_backup_and_restore() {
    let env = Env::new();
    let img = env.image("v.img", 20);
    let pw = format(&env, &img, "luks2", &[]);
    let bak = env.s("hdr.bak");
    ok(&cb(&["header-backup", "--header-backup-file", &bak, &img]));
    let mut data = std::fs::read(&img).unwrap();
    data[..1 << 20].fill(0);
    std::fs::write(&img, &data).unwrap();
    assert_ne!(
        cb(&["test-passphrase", "--key-file", &pw, &img])
            .status
            .code(),
        Some(0)
    );
    // With no terminal on stdin there is nobody to ask: it goes ahead without -q, as
    // cryptsetup's confirmation does (scripts rely on it).
    ok(&cb(&["header-restore", "--header-backup-file", &bak, &img]));
    ok(&cb(&["test-passphrase", "--key-file", &pw, &img]));
    ok(&run(
        &cryptsetup(),
        &["open", "--test-passphrase", "--key-file", &pw, &img],
        b"",
    ));
}

#[test]
fn detached_header_and_data_roundtrip() {
    for kind in ["luks1", "luks2"] {
        let env = Env::new();
        let img = env.image("data.img", 8);
        let hdr = env.s("hdr.img");
        let pw = format(&env, &img, kind, &["--header", &hdr]);
        // A new header file is ours alone: its keyslots invite an offline passphrase attack.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&hdr).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{kind}: header file mode {mode:o}");
        ok(&run(
            &cryptsetup(),
            &[
                "open",
                "--test-passphrase",
                "--header",
                &hdr,
                "--key-file",
                &pw,
                &img,
            ],
            b"",
        ));
        let j: serde_json::Value =
            serde_json::from_str(&ok(&cb(&["dump", "--json", "--header", &hdr, &img]))).unwrap();
        assert_eq!(j["data_offset"], 0);
        let payload: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
        let src = env.file("payload", &payload);
        ok(&cb(&[
            "import",
            "--header",
            &hdr,
            "--key-file",
            &pw,
            &img,
            &src,
        ]));
        let out = env.s("out");
        ok(&cb(&[
            "export",
            "--header",
            &hdr,
            "--key-file",
            &pw,
            "--length",
            &payload.len().to_string(),
            &img,
            &out,
        ]));
        assert!(std::fs::read(&out).unwrap() == payload);
        // The data device holds no plaintext.
        let raw = std::fs::read(&img).unwrap();
        assert!(!raw.windows(64).any(|w| w == &payload[1000..1064]));
    }
}

#[test]
fn benchmark_json_has_the_documented_fields() {
    let o = ok(&cb(&[
        "benchmark",
        "--json",
        "--cipher",
        "aes-xts-plain64",
        "--key-size",
        "512",
        "--seconds",
        "0.02",
    ]));
    let rows: Vec<serde_json::Value> = o
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3, "512/512, 512/4096 and 4096/4096: {o}");
    for r in &rows {
        assert_eq!(r["cipher"], "aes-xts-plain64");
        assert_eq!(r["key_bits"], 512);
        assert!(
            r["encrypt_mb_s"].as_f64().unwrap() > 1.0 && r["decrypt_mb_s"].as_f64().unwrap() > 1.0,
            "{r}"
        );
        assert!(r["request_size"].as_u64().unwrap() >= r["sector_size"].as_u64().unwrap());
    }
}

/// `benchmark --integrity`: a row per default cipher of the mode, the key sized as
/// `format --integrity` sizes it (the MAC key appended), seal and open both measured (an
/// open that fails to verify is an error, not a figure); a bad mode fails before any
/// output, and `--backend` does not apply.
#[test]
fn benchmark_integrity_measures_each_authenticated_mode() {
    let run = |mode: &str| {
        let o = ok(&cb(&[
            "benchmark",
            "--json",
            "--integrity",
            mode,
            "--sector-size",
            "4096",
            "--request-size",
            "16384",
            "--seconds",
            "0.02",
        ]));
        o.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .map(|r| {
                assert!(
                    r["encrypt_mb_s"].as_f64().unwrap() > 1.0
                        && r["decrypt_mb_s"].as_f64().unwrap() > 1.0,
                    "{r}"
                );
                assert_eq!(r["request_size"], 16384);
                (
                    r["cipher"].as_str().unwrap().to_string(),
                    r["key_bits"].as_u64().unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    let s = |c: &str, k: u64| (c.to_string(), k);
    assert_eq!(
        run("aead"),
        [
            s("aes-gcm-random + aead", 256),
            s("aegis128-random + aead", 128)
        ]
    );
    assert_eq!(run("poly1305"), [s("chacha20-random + poly1305", 256)]);
    assert_eq!(
        run("hmac-sha256"),
        [s("aes-xts-plain64 + hmac(sha256)", 512 + 256)]
    );
    let o = cb(&["benchmark", "--integrity", "hmac-md4"]);
    assert_eq!(o.status.code(), Some(1), "an unknown mode is refused");
    assert!(o.stdout.is_empty(), "nothing printed before the refusal");
    let o = cb(&["benchmark", "--integrity", "aead", "--backend", "aesni"]);
    assert_ne!(
        o.status.code(),
        Some(0),
        "--backend with --integrity is refused"
    );
}

/// `import` and `export` keep several requests (1 MiB, or `--request-size`) in flight on
/// worker threads; the bytes
/// must still land and leave in order. With cipher_null the image holds the plaintext at the
/// same offsets, so the image file itself checks both directions (a round trip alone would
/// pass if both sides permuted chunks alike).
#[test]
fn import_and_export_keep_chunk_order_over_many_chunks() {
    let env = Env::new();
    let img = env.image("plain.img", 12);
    let key = env.file("null.key", &[0u8; 32]);
    let vol = [
        "--type",
        "plain",
        "--cipher",
        "cipher_null-ecb",
        "--key-size",
        "256",
        "--key-file",
        &key,
    ];
    // 9.5 MiB and a bit: ten chunks, the last one short, at an offset that is not a chunk.
    let len = (19usize << 19) + 4096 + 123;
    let payload: Vec<u8> = (0..len as u64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let src = env.file("payload", &payload);
    // cryptblk COMMAND... [the cipher_null volume options] img FILE
    let on_vol = |cmd: &[&str], file: &str, stdin: &[u8]| {
        let mut args = cmd.to_vec();
        args.extend_from_slice(&vol);
        args.extend([img.as_str(), file]);
        run(bin(), &args, stdin)
    };
    let at = 3 * 4096;
    ok(&on_vol(&["import", "--at", &at.to_string()], &src, b""));
    let raw = std::fs::read(&img).unwrap();
    assert!(
        raw[at..at + len] == payload[..],
        "import put the chunks out of order"
    );
    assert!(
        raw[..at].iter().all(|&b| b == 0),
        "import wrote before --at"
    );
    assert!(
        raw[at + len..].iter().all(|&b| b == 0),
        "import wrote past its input"
    );
    // At an offset inside a sector: neighbouring chunks share a sector at every boundary
    // and are written at the same time (read-modify-write).
    let before = raw.clone();
    let odd = &payload[..(3 << 20) + 5];
    let odd_src = env.file("odd", odd);
    ok(&on_vol(&["import", "--at", "1000"], &odd_src, b""));
    let raw = std::fs::read(&img).unwrap();
    assert!(
        raw[1000..1000 + odd.len()] == odd[..],
        "import at an odd offset"
    );
    assert!(raw[..1000] == before[..1000], "bytes before the odd offset");
    assert!(
        raw[1000 + odd.len()..] == before[1000 + odd.len()..],
        "bytes after it"
    );
    // From stdin too.
    ok(&on_vol(
        &["import", "--at", "0"],
        "-",
        &payload[..len - 5000],
    ));
    let raw = std::fs::read(&img).unwrap();
    assert!(
        raw[..len - 5000] == payload[..len - 5000],
        "import from stdin"
    );
    // Export: a pattern written straight into the image, read back through the volume.
    let pattern: Vec<u8> = (0..12u64 << 20).map(|i| (i % 253) as u8).collect();
    std::fs::write(&img, &pattern).unwrap();
    let n = (7usize << 20) + 777;
    let n_s = n.to_string();
    let o = on_vol(&["export", "--at", "4096", "--length", &n_s], "-", b"");
    ok(&o);
    assert!(
        o.stdout == pattern[4096..4096 + n],
        "export to stdout out of order"
    );
    let out = env.s("out");
    ok(&on_vol(&["export"], &out, b""));
    assert!(
        std::fs::read(&out).unwrap() == pattern,
        "export of the whole volume"
    );
    // Smaller requests: many more chunks in flight and reordered, both directions, at
    // odd offsets; sizes out of bounds are refused by name.
    let o = on_vol(
        &[
            "export",
            "--request-size",
            "4K",
            "--at",
            "1000",
            "--length",
            &n_s,
        ],
        "-",
        b"",
    );
    ok(&o);
    assert!(
        o.stdout == pattern[1000..1000 + n],
        "export in 4 KiB requests"
    );
    ok(&on_vol(
        &["import", "--request-size", "12K", "--at", "777"],
        &odd_src,
        b"",
    ));
    let raw = std::fs::read(&img).unwrap();
    assert!(
        raw[777..777 + odd.len()] == odd[..],
        "import in 12 KiB requests"
    );
    assert!(raw[..777] == pattern[..777] && raw[777 + odd.len()..] == pattern[777 + odd.len()..]);
    std::fs::write(&img, &pattern).unwrap();
    for bad in ["1K", "65M", "4X", "5000"] {
        let o = on_vol(&["export", "--request-size", bad], "-", b"");
        assert!(!o.status.success(), "--request-size {bad} must fail");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("request-size"),
            "{bad}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // Nothing to export is no error; a start past the end is one.
    let o = on_vol(&["export", "--at", "8192", "--length", "0"], "-", b"");
    ok(&o);
    assert!(o.stdout.is_empty());
    let past = ((12u64 << 20) + 512).to_string();
    let o = on_vol(&["export", "--at", &past], "-", b"");
    assert!(!o.status.success(), "--at past the end must fail");
    assert!(String::from_utf8_lossy(&o.stderr).contains("past the end"));
    // An import that starts near 2^64 does not fit either (no overflow).
    let o = on_vol(&["import", "--at", "18446744073709551000"], &odd_src, b"");
    assert!(!o.status.success(), "import at 2^64 - 616 must fail");
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not fit"));
    // And a LUKS2 volume (AES) round trip over the same sizes.
    let luks = env.image("luks.img", 32);
    let pw = format(&env, &luks, "luks2", &[]);
    ok(&cb(&["import", "--key-file", &pw, &luks, &src]));
    let o = cb(&[
        "export",
        "--key-file",
        &pw,
        "--length",
        &len.to_string(),
        &luks,
        "-",
    ]);
    ok(&o);
    assert!(o.stdout == payload, "LUKS2 round trip");
}

/// `luksKillSlot` checks a passphrase that was supplied, even in batch mode (a pipe or a
/// key file; only an empty standard input counts as none, as in cryptsetup): a wrong one,
/// or the killed slot's own while others remain, refuses with exit 2 and wipes nothing.
/// Every case is run through cryptsetup too, which must agree.
#[test]
fn kill_slot_checks_a_supplied_passphrase_even_in_batch_mode() {
    let env = Env::new();
    for kind in ["luks1", "luks2"] {
        let img = env.image(&format!("{kind}.img"), 20);
        let pw = format(&env, &img, kind, &[]);
        let pw1 = env.file("pw1", b"second passphrase");
        let pw2 = env.file("pw2", b"third passphrase");
        for (new, slot) in [(&pw1, "1"), (&pw2, "2")] {
            let mut add = vec!["add-key", "--key-file", &pw, "--key-slot", slot];
            add.extend_from_slice(&CHEAP);
            add.extend([img.as_str(), new.as_str()]);
            ok(&cb(&add));
        }
        let pristine = sha(&img);
        // (tool, stdin or key file, expected exit code, slot 2 wiped?)
        let cases: [(&[u8], Option<&str>, i32, bool); 5] = [
            (b"bad passphrase\n", None, 2, false),
            (b"", Some(&env.file("bad", b"bad passphrase")), 2, false),
            (b"third passphrase\n", None, 2, false),
            (b"second passphrase\n", None, 0, true),
            (b"", None, 0, true),
        ];
        for (i, (stdin, key_file, code, wiped)) in cases.iter().enumerate() {
            for tool_bin in [bin().to_string(), cryptsetup()] {
                std::fs::write(&img, &pristine).unwrap();
                let mut args = vec!["luksKillSlot", "-q", img.as_str(), "2"];
                if let Some(k) = key_file {
                    args.extend(["--key-file", k]);
                }
                let out = run(&tool_bin, &args, stdin);
                assert_eq!(
                    out.status.code(),
                    Some(*code),
                    "{kind} case {i} with {tool_bin}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let slot2 = run(
                    &cryptsetup(),
                    &["open", "--test-passphrase", "--key-file", &pw2, &img],
                    b"",
                );
                assert_eq!(
                    slot2.status.success(),
                    !wiped,
                    "{kind} case {i} with {tool_bin}: slot 2 wiped: {}",
                    !slot2.status.success()
                );
                if !wiped {
                    assert!(
                        sha(&img) == pristine,
                        "{kind} case {i} with {tool_bin}: the image changed"
                    );
                }
            }
        }
    }
}

/// `luksHeaderRestore` refuses what cryptsetup refuses and restores what it restores,
/// byte for byte: a LUKS1 backup over a LUKS1 header of another key size (or data
/// offset), a LUKS2 backup over a LUKS2 header of another data offset or keyslot-area
/// size; across versions, and between same-version headers that match, the header is
/// replaced. Every pair runs through both tools on copies of the same images.
#[test]
fn header_restore_refuses_what_cryptsetup_refuses() {
    let env = Env::new();
    let pw = env.file("pw", b"restore");
    // (name, type, key bits, extra format options)
    let volumes: [(&str, &str, &str, &[&str]); 5] = [
        ("l1-256", "luks1", "256", &[]),
        ("l1-512", "luks1", "512", &[]),
        ("l2-256", "luks2", "256", &[]),
        ("l2-512", "luks2", "512", &[]),
        ("l2-off", "luks2", "512", &["--offset", "65536"]),
    ];
    for (name, kind, bits, extra) in volumes {
        let img = env.image(&format!("{name}.img"), 40);
        let mut args = vec![
            "luksFormat",
            "-q",
            "--type",
            kind,
            "-s",
            bits,
            "--key-file",
            &pw,
        ];
        args.extend_from_slice(&CHEAP);
        args.extend_from_slice(extra);
        args.push(&img);
        ok(&run(&cryptsetup(), &args, b""));
        let bak = env.s(&format!("{name}.bak"));
        ok(&run(
            &cryptsetup(),
            &["luksHeaderBackup", &img, "--header-backup-file", &bak],
            b"",
        ));
    }
    let mut refused = 0;
    for (dev, ..) in volumes {
        for (from, ..) in volumes {
            let outcome = |tool_bin: &str| {
                let copy = env.s("copy.img");
                std::fs::copy(env.path(&format!("{dev}.img")), &copy).unwrap();
                let bak = env.s(&format!("{from}.bak"));
                let out = run(
                    tool_bin,
                    &[
                        "luksHeaderRestore",
                        "-q",
                        &copy,
                        "--header-backup-file",
                        &bak,
                    ],
                    b"",
                );
                (
                    out.status.success(),
                    sha(&copy),
                    String::from_utf8_lossy(&out.stderr).into_owned(),
                )
            };
            let (cs_ok, cs_img, cs_err) = outcome(&cryptsetup());
            let (cb_ok, cb_img, cb_err) = outcome(bin());
            assert_eq!(
                cb_ok, cs_ok,
                "{from}.bak over {dev}: cryptblk {cb_ok} ({cb_err}), cryptsetup {cs_ok} ({cs_err})"
            );
            assert!(cb_img == cs_img, "{from}.bak over {dev}: the images differ");
            refused += !cs_ok as u32;
        }
    }
    assert!(
        refused >= 4,
        "cryptsetup refused only {refused} of the pairs"
    );
}

/// `repair` on headers cryptsetup repairs: a LUKS1 header with free keyslots off the
/// standard layout (offset, stripes, an invalid state word, a partition table's signature
/// over keyslot 6) and an uppercase hash name comes out byte for byte as `cryptsetup
/// repair` leaves it, and opens; a LUKS2 header with a damaged primary copy gets both
/// copies back, after which `cryptsetup repair` finds nothing to change. A sound header
/// is left alone.
#[test]
fn repair_fixes_headers_as_cryptsetup_does() {
    let env = Env::new();
    let img = env.image("l1.img", 20);
    let pw = format(&env, &img, "luks1", &["--key-size", "256"]);
    let pristine = sha(&img);
    // A sound header: nothing written.
    ok(&cb(&["repair", "-q", &img]));
    assert!(sha(&img) == pristine, "repair wrote a sound header");
    let mut bad = pristine.clone();
    let slot = |i: usize| 208 + i * 48;
    bad[slot(3) + 40..slot(3) + 44].copy_from_slice(&9u32.to_be_bytes()); // offset
    bad[slot(4) + 44..slot(4) + 48].copy_from_slice(&3999u32.to_be_bytes()); // stripes
    bad[slot(5)..slot(5) + 4].copy_from_slice(&0x1234_5678u32.to_be_bytes()); // state
    bad[0x1fe] = 0x55; // a DOS partition table's signature, over keyslot 6
    bad[0x1ff] = 0xaa;
    bad[72..72 + 6].copy_from_slice(b"SHA256");
    let (ours, theirs) = (env.s("ours.img"), env.s("theirs.img"));
    std::fs::write(&ours, &bad).unwrap();
    std::fs::write(&theirs, &bad).unwrap();
    let o = cb(&["repair", "-q", &ours]);
    ok(&o);
    ok(&run(&cryptsetup(), &["repair", "-q", &theirs], b""));
    let (a, b) = (sha(&ours), sha(&theirs));
    assert!(a[..1024] == b[..1024], "the repaired LUKS1 headers differ");
    assert!(a[..1024] != bad[..1024], "nothing was repaired");
    ok(&run(
        &cryptsetup(),
        &["open", "--test-passphrase", "--key-file", &pw, &ours],
        b"",
    ));
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(said.contains("Keyslot 3: offset repaired"), "{said}");

    // LUKS2: the primary copy's JSON damaged.
    let img = env.image("l2.img", 20);
    let pw = format(&env, &img, "luks2", &[]);
    let mut bad = sha(&img);
    bad[4096 + 100] ^= 0x55;
    std::fs::write(&img, &bad).unwrap();
    ok(&cb(&["repair", "-q", &img]));
    let fixed = sha(&img);
    assert!(
        fixed[..16384] != bad[..16384],
        "the damaged copy was not rewritten"
    );
    let copy = env.s("l2-copy.img");
    std::fs::write(&copy, &fixed).unwrap();
    ok(&run(&cryptsetup(), &["repair", "-q", &copy], b""));
    assert!(
        sha(&copy) == fixed,
        "cryptsetup still found something to repair"
    );
    ok(&cb(&["test-passphrase", "--key-file", &pw, &img]));
}

/// A missing device is said at once, exit 4 as cryptsetup, for every type and every
/// command that opens a volume: the device is checked before any secret is read (a
/// terminal would have been asked for a passphrase first).
#[test]
fn a_missing_device_is_an_error_before_any_passphrase() {
    let env = Env::new();
    let missing = env.s("missing.img");
    let sock = format!("unix:{}", env.s("s.sock"));
    let run_dir = env.s("run");
    let out = env.s("out");
    for kind in [
        "luks", "luks2", "plain", "loopaes", "tcrypt", "bitlk", "fvault2",
    ] {
        for args in [
            vec![
                "open",
                &missing,
                "vol",
                "--nbd",
                &sock,
                "--run-dir",
                &run_dir,
            ],
            vec!["export", &missing, &out],
        ] {
            let mut a = args.clone();
            a.extend(["--type", kind]);
            // A passphrase on stdin: it must not even be read.
            let o = run(bin(), &a, b"some passphrase\n");
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(4), "{kind} {}: {err}", args[0]);
            assert!(err.contains("No such file"), "{kind} {}: {err}", args[0]);
        }
    }
}

#[test]
fn a_reader_that_goes_away_ends_the_output_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    let env = Env::new();
    let img = env.image("v.img", 20);
    format(&env, &img, "luks2", &[]);
    // `dump | head -c 0`: the reader has gone before the first write.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = Command::new(bin())
        .args(["dump", &img])
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    // Ended as C tools end on a closed pipe.
    assert_eq!(
        o.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {err}",
        o.status
    );
}

/// Runs `args` on a pseudo-terminal (util-linux's `script`): what a user at a terminal
/// sees, stdout and stderr together.
fn on_a_terminal(args: &[&str]) -> String {
    let cmd = std::iter::once(bin())
        .chain(args.iter().copied())
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let o = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .output()
        .expect("script (util-linux)");
    assert!(
        o.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stdout).to_string()
}

#[test]
fn export_and_import_show_progress_on_a_terminal_only() {
    let dir = tempfile::tempdir().unwrap();
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    std::fs::write(p("key"), b"progress passphrase").unwrap();
    crate::common::quick_luks2(&p("v.img"), &p("key"), 32);
    std::fs::write(p("in.raw"), vec![0x5a; 4 << 20]).unwrap();
    let shown = on_a_terminal(&["import", &p("v.img"), &p("in.raw"), "--key-file", &p("key")]);
    assert!(shown.contains("import:   0.0% of 4.0 MiB"), "{shown:?}");
    assert!(
        shown.contains("import: 4.0 MiB in "),
        "the last line says what was done: {shown:?}"
    );
    let shown = on_a_terminal(&[
        "export",
        &p("v.img"),
        &p("out.raw"),
        "--key-file",
        &p("key"),
    ]);
    assert!(shown.contains("% of 16.0 MiB"), "{shown:?}");
    assert!(shown.contains("export: 16.0 MiB in "), "{shown:?}");
    // Not a terminal, or --batch-mode: nothing.
    let o = run(
        bin(),
        &[
            "export",
            &p("v.img"),
            &p("out.raw"),
            "--key-file",
            &p("key"),
        ],
        b"",
    );
    assert!(o.status.success() && o.stderr.is_empty(), "{o:?}");
    let quiet = on_a_terminal(&[
        "export",
        "-q",
        &p("v.img"),
        &p("out.raw"),
        "--key-file",
        &p("key"),
    ]);
    assert!(!quiet.contains("export:"), "{quiet:?}");
    assert_eq!(
        std::fs::read(p("out.raw")).unwrap()[..4 << 20],
        vec![0x5a; 4 << 20][..]
    );
}

#[test]
fn benchmark_counts_its_measurements_on_a_terminal_only() {
    let args = [
        "benchmark",
        "--cipher",
        "aes-xts-plain64",
        "--seconds",
        "0.02",
        "--no-kdf",
    ];
    let shown = on_a_terminal(&args);
    assert!(shown.contains("benchmark: 0 of 6 done"), "{shown:?}");
    assert!(shown.contains("benchmark: 6 done in "), "{shown:?}");
    // Each result is on a line of its own, the progress line erased before it.
    assert!(
        shown.contains("\r\x1b[K       aes-xts-plain64"),
        "{shown:?}"
    );
    let o = cb(&args);
    assert!(o.status.success() && o.stderr.is_empty(), "{o:?}");
}
