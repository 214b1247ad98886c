use super::*;

fn params(hash: &str, key_bits: usize) -> PlainParams {
    // cryptsetup's password-hash-test uses aes-cbc-essiv:sha256, or aes-xts-plain above 256 bits.
    let cipher = if key_bits > 256 {
        "aes-xts-plain"
    } else {
        "aes-cbc-essiv:sha256"
    };
    let mut p = PlainParams {
        cipher: CipherSpec::parse(cipher).unwrap(),
        key_len: key_bits / 8,
        ..PlainParams::default()
    };
    p.set_hash_spec(hash).unwrap();
    p
}

fn key_hex(p: &PlainParams, pass: &[u8]) -> String {
    hex::encode(&*p.derive_key(pass).unwrap())
}

/// Known answers from cryptsetup's tests/password-hash-test, where each expected key was
/// read back from the kernel with `dmsetup table --showkeys` after `cryptsetup create`.
#[test]
fn passphrase_hashing_matches_cryptsetup_vectors() {
    let cases: [(&str, usize, &[u8], &str); 9] = [
        (
            "ripemd160",
            256,
            b"xxx",
            "aeb26d1f69eb6dddfb9381eed4d7299f091e99aa5d3ff06866d4ce9f620f7aca",
        ),
        ("ripemd160", 128, b"xxx", "aeb26d1f69eb6dddfb9381eed4d7299f"),
        (
            "sha1",
            256,
            b"xxx",
            "b60d121b438a380c343d5ec3c2037564b82ffef30b1e0a6ad9af7a73aa91c197",
        ),
        ("sha1", 128, b"xxx", "b60d121b438a380c343d5ec3c2037564"),
        (
            "sha256",
            256,
            b"xxx",
            "cd2eb0837c9b4c962c22d2ff8b5441b7b45805887f051d39bf133b583baf6860",
        ),
        (
            "sha256:20",
            256,
            b"xxx",
            "cd2eb0837c9b4c962c22d2ff8b5441b7b4580588000000000000000000000000",
        ),
        (
            "sha256:32",
            256,
            b"xxx",
            "cd2eb0837c9b4c962c22d2ff8b5441b7b45805887f051d39bf133b583baf6860",
        ),
        (
            "plain",
            256,
            b"xxxxxxxx",
            "7878787878787878000000000000000000000000000000000000000000000000",
        ),
        (
            "plain:2",
            256,
            b"xxxxxxxx",
            "7878000000000000000000000000000000000000000000000000000000000000",
        ),
    ];
    for (hash, bits, pass, want) in cases {
        assert_eq!(key_hex(&params(hash, bits), pass), want, "{hash} {bits}");
    }
}

/// Keys longer than one digest: independently computed with Python's hashlib
/// (`b"".join(hashlib.new(h, b"A"*r + pw).digest() for r in ...)[:len]`).
#[test]
fn multi_round_keys_match_hashlib() {
    let cases: [(&str, usize, &[u8], &str); 5] = [
        (
            "ripemd160",
            256,
            b"password",
            "2c08e8f5884750a7b99f6f2f342fc638db25ff31fb00ff3460badc65d7758851",
        ),
        (
            "sha256",
            512,
            b"password",
            "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8\
             9fff15cdec1f0b4f804c2217cce94ad7194ebc18744892bc7bb52be9fd7bb942",
        ),
        (
            "sha1",
            512,
            b"secret",
            "e5e9fa1ba31ecd1ae84f75caaa474f3a663f05f4308510fd5b1f140c6139710a\
             a75ef64f19a6add6e297a462536dd62664ccb57c1e215021c995d3ff7149c2bf",
        ),
        (
            "ripemd160",
            512,
            b"",
            "9c1185a5c5e9fc54612808977ee8f548b2258d31ddadef707ba62c166051b9e3\
             cd0294c27515f2bccee924e8823ca6e124b8fc3167ed478bca702babe4e130ac",
        ),
        (
            "sha512",
            256,
            b"correct horse",
            "56b698defedb5a435b634afe3320bbaf3fdcd920b6c503a446fc7b7a776b298d",
        ),
    ];
    for (hash, bits, pass, want) in cases {
        assert_eq!(key_hex(&params(hash, bits), pass), want, "{hash} {bits}");
    }
}

/// The 80-byte key file of password-hash-test.
const KEY_FILE: &str = "303132333435363738396162636465660a010003ffff0dffff0a0d20323335326a33726b\
                        6a686164636661736338323372716177376531203364712073647133642032646b6a71\
                        773368323d3d3d3d3d";

#[test]
fn keyfile_is_used_directly() {
    let file = hex::decode(KEY_FILE).unwrap();
    // cryptsetup ignores the hash for key files (password-hash-test "file" cases).
    for (hash, bits) in [
        ("ripemd160", 256),
        ("sha256", 256),
        ("sha256", 128),
        ("sha256", 512),
    ] {
        let p = params(hash, bits);
        let k = p.key_from_keyfile(&file, 0).unwrap();
        assert_eq!(hex::encode(&*k), KEY_FILE[..bits / 4], "{hash} {bits}");
    }
    let p = params("sha256", 256);
    assert_eq!(&*p.key_from_keyfile(&file, 10).unwrap(), &file[10..42]);
    // Too short after the offset, or an offset past the end: errors, as in cryptsetup.
    assert!(matches!(
        p.key_from_keyfile(&file, 50),
        Err(Error::InvalidOption(_))
    ));
    assert!(matches!(
        p.key_from_keyfile(&file, 81),
        Err(Error::InvalidOption(_))
    ));
    assert!(matches!(
        p.key_from_keyfile(&file[..31], 0),
        Err(Error::InvalidOption(_))
    ));
}

#[test]
fn stdin_keyfile_is_a_hashed_passphrase() {
    // password-hash-test "cat-" cases: `-d -` hashes the (limited/offset) input.
    let file = hex::decode(KEY_FILE).unwrap();
    let p = params("sha256", 128);
    assert_eq!(key_hex(&p, &file), "f3b827c8a6f159ad8c8ed5bd5ab3f8c5");
    assert_eq!(key_hex(&p, &file[..14]), "a82c9227cc54c7475620ce85ba1fca1e");
    assert_eq!(
        key_hex(&p, &file[2..16]),
        "7df3f4a41a33805596be85c781cac3b4"
    );
    assert_eq!(
        key_hex(&p, &file[40..80]),
        "ebbe65a178e886ddbb778e0a5538db72"
    );
}

#[test]
fn bad_hash_specs_and_parameters() {
    let mut p = PlainParams::default();
    for bad in ["sha256:", "sha256:xx", "sha256:-1", "md5", "tiger192"] {
        assert!(p.set_hash_spec(bad).is_err(), "{bad}");
    }
    // plain:9 with an 8-byte passphrase fails; hash length above key length fails.
    let p = params("plain:9", 256);
    assert!(matches!(
        p.derive_key(b"xxxxxxxx"),
        Err(Error::InvalidOption(_))
    ));
    let p = params("sha256:33", 256);
    assert!(matches!(p.derive_key(b"x"), Err(Error::InvalidOption(_))));
    // aes-cbc takes at most 256 bits.
    let p = PlainParams {
        key_len: 64,
        ..PlainParams::default()
    };
    assert!(p.derive_key(b"x").is_err());
    let p = PlainParams {
        sector_size: 768,
        ..PlainParams::default()
    };
    assert!(p.validate().is_err());
}

#[test]
fn defaults_and_helpers() {
    let mut p = PlainParams::default();
    assert_eq!(p.cipher.to_string(), "aes-cbc-essiv:sha256");
    assert_eq!((p.key_len, p.hash_spec().as_str()), (32, "ripemd160"));
    p.set_hash_spec("sha512:16").unwrap();
    assert_eq!((p.hash, p.hash_len), (Some(HashAlg::Sha512), Some(16)));
    assert_eq!(p.hash_spec(), "sha512:16");
    p.set_hash_spec("plain").unwrap();
    assert_eq!(
        (p.hash, p.hash_len, p.hash_spec().as_str()),
        (None, None, "plain")
    );
    p.offset = 8;
    p.skip = 3;
    p.size = Some(100);
    p.iv_large_sectors = true;
    assert_eq!(p.data_offset_bytes(), 4096);
    assert_eq!(p.data_length_bytes(), Some(51200));
    assert_eq!(
        p.iv_options(),
        IvOptions {
            large_sectors: true,
            offset: 3
        }
    );
}
