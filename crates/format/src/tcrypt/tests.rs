//! Unit tests of the TCRYPT header logic; whole volumes are checked against cryptsetup's
//! and tcplay's images in crates/cli/tests/tcrypt.rs.

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

#[test]
fn kdf_candidates_follow_the_options() {
    let all = TcryptHeader::kdf_candidates(&TcryptOptions::default());
    assert_eq!(all.len(), KDFS.len());
    let pim = TcryptOptions {
        pim: Some(1234),
        hash: Some(HashAlg::Sha512),
        ..Default::default()
    };
    let c = TcryptHeader::kdf_candidates(&pim);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].1, 15000 + 1000 * 1234);
    let tc = TcryptOptions {
        no_veracrypt: true,
        ..Default::default()
    };
    assert!(
        TcryptHeader::kdf_candidates(&tc)
            .iter()
            .all(|(k, _)| !k.veracrypt)
    );
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
        hash: Some(HashAlg::Sha512),
        no_veracrypt: true,
        ..Default::default()
    };
    let e = TcryptHeader::open(&dev, 4096, &o, b"pw").unwrap_err();
    assert!(matches!(e, Error::WrongPassphrase), "{e}");
    let small = crate::MemStorage::from_vec(vec![0; 100]);
    let e = TcryptHeader::open(&small, 100, &o, b"pw").unwrap_err();
    assert!(matches!(e, Error::Truncated { .. }), "{e}");
}
