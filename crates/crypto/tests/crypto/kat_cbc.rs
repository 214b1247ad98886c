//! AES-CBC known answers through `SectorCipher` on every supported backend.
//!
//! * NIST SP 800-38A F.2 (raw IV 000102..0f): no dm-crypt IV mode produces that IV, but CBC
//!   only ever uses the IV as a mask on the first plaintext block, so `aes-cbc-null` (all-zero
//!   IV) on `P1 ^ IV, P2, P3, P4` gives exactly the F.2 ciphertext, and CBC is prefix-
//!   preserving, so the 64-byte vector is the head of a longer sector whatever follows.
//!   Decryption of a block depends only on it and the previous ciphertext block, so a
//!   sector starting with the F.2 ciphertext decrypts to `P1 ^ IV, P2, P3, P4` too.
//! * `aes-cbc-essiv:sha256` sectors produced with the OpenSSL command line (`data/essiv.txt`).

use crate::common::{Rng, assert_bytes_eq, backends, load};
use cryptblk_crypto::{Backend, CipherSpec, IvOptions, SectorCipher};

fn cipher(spec: &str, key: &[u8], ss: u32, iv: IvOptions, b: Backend) -> SectorCipher {
    SectorCipher::with_backend(CipherSpec::parse(spec).unwrap(), key, ss, iv, b)
        .unwrap_or_else(|e| panic!("{spec} on {b}: {e}"))
}

fn xor16(a: &mut [u8], iv: &[u8]) {
    for (x, y) in a[..16].iter_mut().zip(iv) {
        *x ^= y;
    }
}

#[test]
fn sp800_38a_f2_cbc() {
    let recs = load("cbc_sp800_38a.txt");
    assert_eq!(recs.len(), 3, "AES-128, -192, -256");
    let mut rng = Rng::new(0x38a);
    for b in backends() {
        for r in &recs {
            let (key, iv, pt, ct) = (r.hex("key"), r.hex("iv"), r.hex("pt"), r.hex("ct"));
            let mut masked = pt.clone();
            xor16(&mut masked, &iv);
            for ss in [512u32, 4096] {
                let ss_us = ss as usize;
                let c = cipher("aes-cbc-null", &key, ss, IvOptions::default(), b);
                // Several sectors in one call (multi-sector CBC paths), each holding the vector
                // at its head with different tails; the null IV is the same for every sector.
                for run in [1usize, 3, 65] {
                    let what = format!(
                        "{} [backend {b}, {ss}-byte sectors, run of {run}]",
                        r.label()
                    );
                    let mut data = rng.bytes(run * ss_us);
                    for s in data.chunks_mut(ss_us) {
                        s[..64].copy_from_slice(&masked);
                    }
                    let plain = data.clone();
                    let start = rng.next_u64() >> 1;
                    c.encrypt(start, &mut data).unwrap();
                    for (i, s) in data.chunks(ss_us).enumerate() {
                        assert_bytes_eq(&s[..64], &ct, &format!("{what}: encrypt, sector {i}"));
                    }
                    c.decrypt(start, &mut data).unwrap();
                    assert_bytes_eq(&data, &plain, &format!("{what}: roundtrip"));

                    let mut data = rng.bytes(run * ss_us);
                    for s in data.chunks_mut(ss_us) {
                        s[..64].copy_from_slice(&ct);
                    }
                    c.decrypt(start, &mut data).unwrap();
                    for (i, s) in data.chunks_mut(ss_us).enumerate() {
                        xor16(s, &iv);
                        assert_bytes_eq(&s[..64], &pt, &format!("{what}: decrypt, sector {i}"));
                    }
                }
            }
        }
    }
}

#[test]
fn essiv_sha256_openssl_sectors() {
    let recs = load("essiv.txt");
    assert!(recs.len() >= 12);
    let mut rng = Rng::new(0xe551);
    for b in backends() {
        for r in &recs {
            let (key, pt, ct) = (r.hex("key"), r.hex("pt"), r.hex("ct"));
            let ss = r.u32("sector_size");
            let ss_us = ss as usize;
            let large = r.flag("large_sectors");
            let sector = r.u64("sector");
            assert_eq!(pt.len(), ss_us, "{}", r.label());
            let expect_iv = if large {
                sector
            } else {
                sector * (ss as u64 / 512)
            };
            assert_eq!(
                r.u64("iv_sector"),
                expect_iv,
                "{}: data file inconsistent",
                r.label()
            );
            let c = cipher(
                "aes-cbc-essiv:sha256",
                &key,
                ss,
                IvOptions {
                    large_sectors: large,
                    offset: 0,
                },
                b,
            );
            let what = format!("{} [backend {b}]", r.label());

            let mut buf = pt.clone();
            c.encrypt(sector, &mut buf).unwrap();
            assert_bytes_eq(&buf, &ct, &format!("{what}: encrypt"));
            c.decrypt(sector, &mut buf).unwrap();
            assert_bytes_eq(&buf, &pt, &format!("{what}: decrypt"));

            // Embedded in runs (first / last position), both directions.
            for run in [3usize, 66] {
                for pos in [0, run - 1] {
                    let Some(start) = sector.checked_sub(pos as u64) else {
                        continue;
                    };
                    let at = format!("{what}: sector {pos} of a {run}-sector run");
                    let mut data = rng.bytes(run * ss_us);
                    data[pos * ss_us..(pos + 1) * ss_us].copy_from_slice(&pt);
                    let plain = data.clone();
                    c.encrypt(start, &mut data).unwrap();
                    assert_bytes_eq(
                        &data[pos * ss_us..(pos + 1) * ss_us],
                        &ct,
                        &format!("{at}, encrypt"),
                    );
                    c.decrypt(start, &mut data).unwrap();
                    assert_bytes_eq(&data, &plain, &format!("{at}, roundtrip"));
                    let mut data = rng.bytes(run * ss_us);
                    data[pos * ss_us..(pos + 1) * ss_us].copy_from_slice(&ct);
                    c.decrypt(start, &mut data).unwrap();
                    assert_bytes_eq(
                        &data[pos * ss_us..(pos + 1) * ss_us],
                        &pt,
                        &format!("{at}, decrypt"),
                    );
                }
            }
        }
    }
}
