//! Unit tests of the TCRYPT header logic; whole volumes are checked against cryptsetup's
//! and tcplay's images in crates/cli/tests/formats/tcrypt.rs.

use super::*;

#[test]
fn password_pool_mixes_keyfiles_then_passphrase() {
    let o = TcryptOptions {
        keyfiles: vec![SecretBytes::from_slice(b"k")],
        ..Default::default()
    };
    let pool = password_pool(&o, b"ab").unwrap();
    // One keyfile byte: the CRC register after it, big-endian, into the first 4 bytes.
    let crc = crc32_update(!0, b"k").to_be_bytes();
    assert_eq!(
        pool.len(),
        POOL_LEN,
        "with keyfiles the whole pool is the password"
    );
    assert_eq!(pool[0], crc[0].wrapping_add(b'a'));
    assert_eq!(pool[1], crc[1].wrapping_add(b'b'));
    assert_eq!(&pool[2..4], &crc[2..4]);
    assert!(pool[4..].iter().all(|&b| b == 0));
    let plain = password_pool(&TcryptOptions::default(), b"abc").unwrap();
    assert_eq!(&plain[..], b"abc");
    assert!(password_pool(&TcryptOptions::default(), &[b'x'; 129]).is_err());
    let no_vc = TcryptOptions {
        no_veracrypt: true,
        ..Default::default()
    };
    assert!(
        password_pool(&no_vc, &[b'x'; 65]).is_err(),
        "TrueCrypt stops at 64"
    );
    assert_eq!(
        password_pool(&TcryptOptions::default(), &[b'x'; 72])
            .unwrap()
            .len(),
        72
    );
}

/// A TrueCrypt volume never waits for a VeraCrypt KDF: TrueCrypt's are derived (all at
/// once) before any of those starts, the rest in groups of `workers`, Argon2id last.
#[test]
fn truecrypt_kdfs_are_tried_before_any_veracrypt_one_starts() {
    let all = TcryptHeader::kdf_candidates(&TcryptOptions::default());
    let iterations = |k: &Kdf| match k {
        Kdf::Pbkdf2 { iterations, .. } => Some(*iterations),
        _ => None,
    };
    for workers in [1, 2, 4, 16] {
        let waves = TcryptHeader::kdf_waves(&all, workers);
        assert_eq!(waves.concat().len(), all.len(), "every candidate, once");
        assert_eq!(waves[0].len(), 5, "{workers}: {:?}", waves[0]);
        assert!(waves[0].iter().all(|k| iterations(k) <= Some(2000)));
        for w in &waves[1..] {
            assert!(w.len() <= workers, "{workers}: {w:?}");
            assert!(w.iter().all(|k| iterations(k).is_none_or(|i| i >= 200_000)));
        }
        let last = waves.last().unwrap();
        assert!(matches!(last[..], [Kdf::Argon2 { .. }]), "{last:?}");
        assert!(
            waves[..waves.len() - 1]
                .concat()
                .iter()
                .all(|k| iterations(k).is_some())
        );
    }
    // With one hash given: its TrueCrypt KDF, then its VeraCrypt one, never together.
    let sha512 = TcryptOptions {
        kdf: Some(TcryptKdf::Pbkdf2(HashAlg::Sha512)),
        ..Default::default()
    };
    let waves = TcryptHeader::kdf_waves(&TcryptHeader::kdf_candidates(&sha512), 16);
    assert_eq!(waves.len(), 2, "{waves:?}");
    assert_eq!(iterations(&waves[0][0]), Some(1000));
    assert_eq!(iterations(&waves[1][0]), Some(500_000));
}

#[test]
fn kdf_candidates_follow_the_options() {
    let all = TcryptHeader::kdf_candidates(&TcryptOptions::default());
    assert_eq!(all.len(), KDFS.len());
    let pim = TcryptOptions {
        pim: Some(1234),
        kdf: Some(TcryptKdf::Pbkdf2(HashAlg::Sha512)),
        ..Default::default()
    };
    let c = TcryptHeader::kdf_candidates(&pim);
    assert_eq!(c.len(), 1);
    assert!(
        matches!(c[0], Kdf::Pbkdf2 { hash: HashAlg::Sha512, iterations } if iterations == 15000 + 1000 * 1234)
    );
    let tc = TcryptOptions {
        no_veracrypt: true,
        ..Default::default()
    };
    // TrueCrypt's KDFs only: 1000 or 2000 iterations of PBKDF2.
    let legacy = TcryptHeader::kdf_candidates(&tc);
    assert_eq!(legacy.len(), 5);
    assert!(legacy.iter().all(|k| matches!(
        k,
        Kdf::Pbkdf2 {
            iterations: 1000 | 2000,
            ..
        }
    )));
}

#[test]
fn chain_table_is_consistent() {
    for ch in CHAINS {
        let sum: usize = ch.ciphers.iter().map(|c| c.key_size).sum::<usize>()
            + ch.ciphers.last().unwrap().key_extra_size;
        assert_eq!(sum, ch.key_size, "{}-{}", ch.name, ch.mode_name);
        let names: Vec<&str> = ch.ciphers.iter().map(|c| c.alg.name()).collect();
        assert_eq!(names.join("-"), ch.name);
        for c in ch.ciphers {
            assert!(c.key_offset + c.key_size.min(64) <= 256);
        }
    }
}

/// A header that decrypts to nothing is a wrong passphrase, not a panic; short devices
/// are a clear error.
#[test]
fn garbage_and_short_devices() {
    let dev = crate::MemStorage::from_vec(vec![0x5a; 4096]);
    let o = TcryptOptions {
        kdf: Some(TcryptKdf::Pbkdf2(HashAlg::Sha512)),
        no_veracrypt: true,
        ..Default::default()
    };
    let e = TcryptHeader::open(&dev, 4096, &o, b"pw").unwrap_err();
    assert!(matches!(e, Error::WrongPassphrase), "{e}");
    let small = crate::MemStorage::from_vec(vec![0; 100]);
    let e = TcryptHeader::open(&small, 100, &o, b"pw").unwrap_err();
    assert!(matches!(e, Error::Truncated { .. }), "{e}");
}

#[test]
fn veracrypt_argon2_costs_follow_its_pim_rule() {
    // (PIM, passes, KiB) from VeraCrypt's get_argon2_params.
    for (pim, t, m) in [
        (None, 6, 425_984),
        (Some(0), 6, 425_984),
        (Some(12), 6, 425_984),
        (Some(1), 3, 65_536),
        (Some(3), 3, 131_072),
        (Some(4), 4, 163_840),
        (Some(31), 13, 1_048_576),
        (Some(32), 14, 1_048_576),
        (Some(100), 82, 1_048_576),
    ] {
        assert_eq!(veracrypt_argon2_costs(pim), (t, m), "PIM {pim:?}");
    }
    // Never for system volumes; the only KDF `-h argon2id` leaves.
    let sys = TcryptOptions {
        system: true,
        kdf: Some(TcryptKdf::Argon2id),
        ..Default::default()
    };
    assert!(TcryptHeader::kdf_candidates(&sys).is_empty());
    let only = TcryptOptions {
        kdf: Some(TcryptKdf::from_name("argon2id").unwrap()),
        ..Default::default()
    };
    assert!(matches!(
        TcryptHeader::kdf_candidates(&only)[..],
        [Kdf::Argon2 {
            time: 6,
            memory_kib: 425_984,
            parallel: 1,
            ..
        }]
    ));
}

/// `-h` as cryptsetup matches it: a hash's own name, or part of exactly one header KDF's
/// hash (cryptsetup 2.7's scripts say `blake2s` for VeraCrypt's BLAKE2s-256).
#[test]
fn kdf_names_match_as_cryptsetup_matches_them() {
    assert_eq!(
        TcryptKdf::from_name("blake2s").unwrap(),
        TcryptKdf::Pbkdf2(HashAlg::Blake2s256)
    );
    assert_eq!(
        TcryptKdf::from_name("sha256").unwrap(),
        TcryptKdf::Pbkdf2(HashAlg::Sha256)
    );
    assert_eq!(
        TcryptKdf::from_name("stribog").unwrap(),
        TcryptKdf::Pbkdf2(HashAlg::Stribog512)
    );
    // `sha` is part of three: ambiguous, refused rather than guessed.
    assert!(TcryptKdf::from_name("sha").is_err());
    assert!(TcryptKdf::from_name("md5").is_err());
    let vera_blake2s = TcryptHeader::kdf_candidates(&TcryptOptions {
        kdf: Some(TcryptKdf::Pbkdf2(HashAlg::Blake2s256)),
        ..Default::default()
    });
    assert_eq!(vera_blake2s.len(), 2, "{vera_blake2s:?}");
}
