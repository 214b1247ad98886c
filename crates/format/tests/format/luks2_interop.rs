//! LUKS2 interoperability with the real cryptsetup, on image files in a temporary directory.
//!
//! Matrix: aes-xts-plain64 (256/512), aes-cbc-essiv:sha256, aes-xts-plain ×
//! sector 512/4096 × pbkdf2/argon2id × attached/detached header, in both directions.

use std::path::{Path, PathBuf};

use crate::common::*;
use cryptblk_crypto::{Argon2Variant, CipherSpec, HashAlg, Kdf, KdfKind, KdfRequest};
use cryptblk_format::luks2::Luks2Header;
use cryptblk_format::{Error, FormatOptions, LuksHeader};
use serde_json::Value;

#[derive(Debug, Clone, Copy)]
struct Case {
    cipher: &'static str,
    key_bits: usize,
    sector: u32,
    argon: bool,
    detached: bool,
}

fn matrix() -> Vec<Case> {
    let mut v = Vec::new();
    for (cipher, key_bits) in [
        ("aes-xts-plain64", 256),
        ("aes-xts-plain64", 512),
        ("aes-cbc-essiv:sha256", 256),
        ("aes-xts-plain", 512),
    ] {
        for sector in [512, 4096] {
            for argon in [false, true] {
                for detached in [false, true] {
                    v.push(Case {
                        cipher,
                        key_bits,
                        sector,
                        argon,
                        detached,
                    });
                }
            }
        }
    }
    v
}

fn kdf_args(argon: bool) -> Vec<&'static str> {
    if argon {
        vec![
            "--pbkdf",
            "argon2id",
            "--pbkdf-force-iterations",
            "4",
            "--pbkdf-memory",
            "32",
            "--pbkdf-parallel",
            "1",
        ]
    } else {
        vec!["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]
    }
}

fn kdf_request(argon: bool) -> KdfRequest {
    KdfRequest {
        kind: if argon {
            KdfKind::Argon2(Argon2Variant::Argon2id)
        } else {
            KdfKind::Pbkdf2
        },
        hash: HashAlg::Sha256,
        iter_time_ms: 2000,
        forced_iterations: Some(if argon { 4 } else { 1000 }),
        memory_kib: 32,
        parallel: 1,
    }
}

/// One volume: data image plus (for detached headers) the header image.
struct Vol {
    data: PathBuf,
    header: Option<PathBuf>,
}

impl Vol {
    fn new(dir: &Path, name: &str, detached: bool) -> Vol {
        if detached {
            Vol {
                data: image(dir, &format!("{name}-data.img"), 4 << 20),
                header: Some(image(dir, &format!("{name}-hdr.img"), 16 << 20)),
            }
        } else {
            Vol {
                data: image(dir, &format!("{name}.img"), 20 << 20),
                header: None,
            }
        }
    }
    /// The file that holds the LUKS header.
    fn hdr_path(&self) -> &Path {
        self.header.as_deref().unwrap_or(&self.data)
    }
    fn hdr_file(&self) -> std::fs::File {
        open_rw(self.hdr_path())
    }
    /// `cryptsetup <args...> [--header H] <data> [extra...]`.
    fn run(&self, args: &[&str], extra: &[&Path]) -> String {
        cryptsetup(&self.args(args, extra))
    }
    fn try_run(&self, args: &[&str], extra: &[&Path]) -> std::process::Output {
        try_cryptsetup(&self.args(args, extra))
    }
    fn args(&self, args: &[&str], extra: &[&Path]) -> Vec<std::ffi::OsString> {
        let mut a: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
        if let Some(h) = &self.header {
            a.push("--header".into());
            a.push(h.into());
        }
        a.push(self.data.clone().into());
        a.extend(extra.iter().map(|p| p.as_os_str().to_owned()));
        a
    }
    fn json_dump(&self) -> Value {
        serde_json::from_str(&self.run(&["luksDump", "--dump-json-metadata"], &[])).unwrap()
    }
}

fn cs_format(v: &Vol, c: &Case, key: &Path) {
    let bits = c.key_bits.to_string();
    let sector = c.sector.to_string();
    let mut a = vec![
        "luksFormat",
        "--type",
        "luks2",
        "--batch-mode",
        "--cipher",
        c.cipher,
        "--key-size",
        &bits,
    ];
    a.extend([
        "--sector-size",
        &sector,
        "--key-file",
        key.to_str().unwrap(),
    ]);
    a.extend(["--label", "cs-label", "--subsystem", "cs-sub"]);
    a.extend(kdf_args(c.argon));
    v.run(&a, &[]);
}

fn our_opts(c: &Case) -> FormatOptions {
    let mut o = FormatOptions::new(kdf_request(c.argon));
    o.cipher = CipherSpec::parse(c.cipher).unwrap();
    o.key_len = c.key_bits / 8;
    o.sector_size = c.sector;
    o.detached_header = c.detached;
    o.label = Some("our label".into());
    o
}

/// Checks our reading of a cryptsetup-made header against what cryptsetup prints.
fn compare_with_dump(v: &Vol, h: &Luks2Header, c: &Case) {
    assert_eq!(
        h.json(),
        &v.json_dump(),
        "{c:?}: JSON differs from cryptsetup's"
    );
    let text = luks_dump(&v.data, v.header.as_deref());
    let f = dump_fields(&text);
    assert_eq!(field(&f, "UUID"), Some(h.uuid()));
    assert_eq!(
        field(&f, "Epoch").unwrap().parse::<u64>().unwrap(),
        h.seqid()
    );
    let label = if h.label().is_empty() {
        "(no label)"
    } else {
        h.label()
    };
    assert_eq!(field(&f, "Label"), Some(label));
    assert_eq!(field(&f, "cipher"), Some(h.cipher().to_string().as_str()));
    assert_eq!(
        field(&f, "sector"),
        Some(format!("{} [bytes]", h.sector_size()).as_str())
    );
    assert_eq!(
        field(&f, "offset"),
        Some(format!("{} [bytes]", h.data_offset()).as_str())
    );
    assert_eq!(
        field(&f, "Key"),
        Some(format!("{} bits", h.key_len() * 8).as_str())
    );
    assert_eq!(h.cipher().to_string(), c.cipher);
    assert_eq!((h.key_len() * 8, h.sector_size()), (c.key_bits, c.sector));
    // Per-keyslot KDF lines, in keyslot order (each slot's block starts with "PBKDF").
    let mut dumped: Vec<Vec<(&str, &str)>> = Vec::new();
    for (k, val) in &f {
        if k == "PBKDF" {
            dumped.push(Vec::new());
        }
        if let Some(slot) = dumped.last_mut()
            && !slot.iter().any(|(sk, _)| sk == k)
        {
            slot.push((k.as_str(), val.as_str()));
        }
    }
    let keyslots = h.keyslots();
    assert_eq!(dumped.len(), keyslots.len(), "{c:?}");
    for (k, d) in keyslots.iter().zip(&dumped) {
        let get = |key: &str| {
            d.iter()
                .find(|(dk, _)| *dk == key)
                .map(|(_, v)| *v)
                .unwrap()
        };
        let num = |key: &str| get(key).parse::<u32>().unwrap();
        match k.kdf.clone().unwrap() {
            Kdf::Pbkdf2 { iterations, .. } => {
                assert_eq!(get("PBKDF"), "pbkdf2");
                assert_eq!(num("Iterations"), iterations);
            }
            Kdf::Argon2 {
                time,
                memory_kib,
                parallel,
                ..
            } => {
                assert_eq!(get("PBKDF"), "argon2id");
                assert_eq!(
                    (num("Time cost"), num("Memory"), num("Threads")),
                    (time, memory_kib, parallel)
                );
            }
        }
        assert_eq!(get("Area offset"), format!("{} [bytes]", k.area_offset));
    }
}

#[test]
fn cryptsetup_made_volumes_read_and_unlock() {
    let dir = tempfile::tempdir().unwrap();
    let k0 = key_file(dir.path(), "k0", b"cs passphrase 0");
    for (i, c) in matrix().iter().enumerate() {
        let v = Vol::new(dir.path(), &format!("cs{i}"), c.detached);
        cs_format(&v, c, &k0);
        let mut dev = v.hdr_file();
        let h = Luks2Header::read(&mut dev).unwrap_or_else(|e| panic!("{c:?}: {e}"));
        assert_eq!((h.label(), h.subsystem()), ("cs-label", "cs-sub"));
        assert_eq!(h.data_offset(), if c.detached { 0 } else { 16 << 20 });
        compare_with_dump(&v, &h, c);
        let (slot, key) = h.unlock(&mut dev, b"cs passphrase 0", None).unwrap();
        assert_eq!(slot, 0);
        assert_eq!(
            key.to_vec(),
            dump_volume_key(&v.data, v.header.as_deref(), &k0),
            "{c:?}"
        );
        assert!(matches!(
            h.unlock(&mut dev, b"nope", None),
            Err(Error::WrongPassphrase)
        ));
        // The generic loader agrees.
        let g = cryptblk_format::load_header(&mut dev).unwrap();
        assert_eq!((g.version(), g.key_len()), (2, c.key_bits / 8));
    }
}

#[test]
fn our_volumes_accepted_by_cryptsetup() {
    let dir = tempfile::tempdir().unwrap();
    let good = key_file(dir.path(), "good", b"our passphrase");
    let bad = key_file(dir.path(), "bad", b"not it");
    for (i, c) in matrix().iter().enumerate() {
        let v = Vol::new(dir.path(), &format!("ours{i}"), c.detached);
        let mut vk = vec![0u8; c.key_bits / 8];
        cryptblk_crypto::random_bytes(&mut vk).unwrap();
        let mut dev = v.hdr_file();
        let h = Luks2Header::format(&mut dev, &our_opts(c), &vk, b"our passphrase").unwrap();
        drop(dev);
        compare_with_dump(&v, &h, c);
        let hd = v.header.as_deref();
        assert_eq!(test_passphrase(&v.data, hd, &good, None), 0, "{c:?}");
        assert_eq!(test_passphrase(&v.data, hd, &bad, None), 2, "{c:?}");
        assert_eq!(dump_volume_key(&v.data, hd, &good), vk, "{c:?}");
        let before = std::fs::read(v.hdr_path()).unwrap();
        let out = v.try_run(&["repair", "--batch-mode"], &[]);
        assert!(
            out.status.success(),
            "{c:?}: repair: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            std::fs::read(v.hdr_path()).unwrap(),
            before,
            "{c:?}: repair changed our header"
        );
    }
}

fn slots(h: &Luks2Header) -> Vec<u32> {
    h.keyslots().iter().map(|k| k.id).collect()
}

#[test]
fn keyslot_changes_cross_over() {
    let dir = tempfile::tempdir().unwrap();
    let k0 = key_file(dir.path(), "k0", b"zero");
    let k1 = key_file(dir.path(), "k1", b"one");
    let k2 = key_file(dir.path(), "k2", b"two");
    let k3 = key_file(dir.path(), "k3", b"three");
    let cases = [
        Case {
            cipher: "aes-xts-plain64",
            key_bits: 512,
            sector: 4096,
            argon: true,
            detached: false,
        },
        Case {
            cipher: "aes-cbc-essiv:sha256",
            key_bits: 256,
            sector: 512,
            argon: false,
            detached: true,
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        let v = Vol::new(dir.path(), &format!("x{i}"), c.detached);
        let hd = v.header.as_deref();
        cs_format(&v, c, &k0);
        // cryptsetup adds slot 1: we see it and open it.
        let mut a = vec![
            "luksAddKey",
            "--batch-mode",
            "--key-file",
            k0.to_str().unwrap(),
        ];
        a.extend(kdf_args(!c.argon));
        v.run(&a, &[&k1]);
        let mut dev = v.hdr_file();
        let mut h = Luks2Header::read(&mut dev).unwrap();
        assert_eq!(slots(&h), [0, 1]);
        assert_eq!(h.unlock(&mut dev, b"one", None).unwrap().0, 1);
        let vk = h.unlock(&mut dev, b"zero", None).unwrap().1;
        compare_with_dump(&v, &h, c);

        // We kill slot 0 and add slot 2: cryptsetup agrees.
        h.kill_keyslot(&mut dev, 0).unwrap();
        assert_eq!(
            h.add_keyslot(&mut dev, &vk, b"two", Some(2), &kdf_request(c.argon))
                .unwrap(),
            2
        );
        assert_eq!(test_passphrase(&v.data, hd, &k0, None), 2);
        assert_eq!(test_passphrase(&v.data, hd, &k1, Some(1)), 0);
        assert_eq!(test_passphrase(&v.data, hd, &k2, Some(2)), 0);
        compare_with_dump(&v, &h, c);

        // cryptsetup kills slot 1 and changes slot 2's passphrase: we follow.
        v.run(&["luksKillSlot", "--batch-mode"], &[Path::new("1")]);
        let mut a = vec![
            "luksChangeKey",
            "--batch-mode",
            "--key-file",
            k2.to_str().unwrap(),
        ];
        a.extend(kdf_args(c.argon));
        v.run(&a, &[&k3]);
        let h = Luks2Header::read(&mut dev).unwrap();
        assert_eq!(h.keyslots().len(), 1);
        assert!(h.unlock(&mut dev, b"two", None).is_err());
        assert_eq!(&h.unlock(&mut dev, b"three", None).unwrap().1[..], &vk[..]);

        // Our luksChangeKey: cryptsetup accepts the new passphrase only.
        let mut h = h;
        h.change_keyslot(
            &mut dev,
            b"three",
            b"zero",
            None,
            None,
            &kdf_request(c.argon),
        )
        .unwrap();
        assert_eq!(test_passphrase(&v.data, hd, &k3, None), 2);
        assert_eq!(test_passphrase(&v.data, hd, &k0, None), 0);
        compare_with_dump(&v, &h, c);
        let out = v.try_run(&["repair", "--batch-mode"], &[]);
        assert!(
            out.status.success(),
            "repair: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn tokens_and_flags_survive_our_updates() {
    let dir = tempfile::tempdir().unwrap();
    let k0 = key_file(dir.path(), "k0", b"zero");
    let c = Case {
        cipher: "aes-xts-plain64",
        key_bits: 256,
        sector: 512,
        argon: false,
        detached: false,
    };
    let v = Vol::new(dir.path(), "tok", false);
    cs_format(&v, &c, &k0);
    let token = dir.path().join("token.json");
    std::fs::write(
        &token,
        br#"{"type":"my-token","keyslots":["0"],"x-data":{"a":[1,2,3]}}"#,
    )
    .unwrap();
    v.run(
        &[
            "token",
            "import",
            "--json-file",
            token.to_str().unwrap(),
            "--token-id",
            "4",
        ],
        &[],
    );
    let mut dev = v.hdr_file();
    let mut h = Luks2Header::read(&mut dev).unwrap();
    assert_eq!(h.tokens().len(), 1);
    // (cryptsetup sets persistent flags only through dm-crypt activation, not available here.)
    h.set_config_flags(&mut dev, &["allow-discards", "no-read-workqueue"])
        .unwrap();
    let vk = h.unlock(&mut dev, b"zero", None).unwrap().1;
    h.add_keyslot(&mut dev, &vk, b"one", None, &kdf_request(false))
        .unwrap();
    h.set_label(&mut dev, Some("relabelled")).unwrap();
    let exported = v.run(&["token", "export", "--token-id", "4"], &[]);
    let t: Value = serde_json::from_str(&exported).unwrap();
    assert_eq!(t["x-data"]["a"], serde_json::json!([1, 2, 3]));
    assert_eq!(t["keyslots"], serde_json::json!(["0"]));
    compare_with_dump(&v, &h, &c);
    h.kill_keyslot(&mut dev, 0).unwrap();
    let t: Value =
        serde_json::from_str(&v.run(&["token", "export", "--token-id", "4"], &[])).unwrap();
    assert_eq!(t["keyslots"], serde_json::json!([]));
    let f = dump_fields(&luks_dump(&v.data, None));
    assert_eq!(field(&f, "Flags"), Some("allow-discards no-read-workqueue"));
    assert_eq!(field(&f, "Label"), Some("relabelled"));
}
