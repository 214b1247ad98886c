//! Known answers from the kernel's dm-crypt in AEAD mode over dm-integrity (LUKS2
//! `--integrity`; `data/dmcrypt-aead.txt`, written by `scripts/probe-integrity-layout.sh`
//! in the test VM): issue 38's groundwork. What cryptblk already has must reproduce the
//! kernel's blocks: AES-GCM (vaes512) with associated data le64(sector) || IV and the tag
//! then the IV in the block's metadata; AES-XTS under the HMAC modes, whose HMAC-SHA256
//! (the volume key's last 32 bytes) covers sector || IV || ciphertext. ChaCha20-Poly1305
//! is RustCrypto's, checked through `AeadSectorCipher` below with every other mode.

use crate::common::{assert_bytes_eq, load};
use cryptblk_crypto::testing::xts_data_unit;
use cryptblk_crypto::{AeadSectorCipher, AesGcm, Backend, CipherSpec, IvOptions, SectorCipher};
use hmac::{Hmac, KeyInit, Mac};

#[test]
fn dm_crypt_aead_known_answers() {
    let recs = load("dmcrypt-aead.txt");
    assert_eq!(recs.len(), 7, "every mode the probe made");
    let mut checked = 0;
    for r in &recs {
        let (key, meta, ct, pt) = (r.hex("key"), r.hex("meta"), r.hex("ct"), r.hex("pt"));
        let (ss, s) = (r.u32("sector_size"), r.u64("sector"));
        let aad_sector = s.to_le_bytes();
        assert_eq!(ct.len(), ss as usize, "{}", r.label());
        match r.get("spec") {
            "aes-gcm-random" => {
                if !AesGcm::is_available() {
                    eprintln!(
                        "NOT TESTED: {}: AES-GCM has code for the vaes512 backend only",
                        r.label()
                    );
                    continue;
                }
                let (tag, iv) = (&meta[..16], &meta[16..28]);
                let iv: &[u8; 12] = iv.try_into().unwrap();
                let aad = [&aad_sector[..], iv].concat();
                let gcm = AesGcm::new(&key).unwrap();
                let mut buf = ct.clone();
                let mut m = gcm.begin(iv, &aad);
                m.decrypt_in_place(&mut buf);
                m.verify(tag)
                    .unwrap_or_else(|e| panic!("{}: {e}", r.label()));
                assert_bytes_eq(&buf, &pt, &r.label());
                // Sealing the plaintext with the kernel's IV gives the kernel's block.
                let mut m = gcm.begin(iv, &aad);
                m.encrypt_in_place(&mut buf);
                assert_bytes_eq(&buf, &ct, &r.label());
                assert_eq!(&m.tag()[..], tag, "{}", r.label());
                // The same block claimed for the next sector: refused.
                let moved = [&(s + 1).to_le_bytes()[..], iv].concat();
                let mut m = gcm.begin(iv, &moved);
                let mut buf = ct.clone();
                m.decrypt_in_place(&mut buf);
                assert!(m.verify(tag).is_err(), "{}: moved block", r.label());
            }
            "aes-xts-plain64" | "aes-xts-random" => {
                let (xts_key, mac_key) = key.split_at(64);
                let iv: [u8; 16] = if r.get("spec").ends_with("random") {
                    meta[32..48].try_into().unwrap()
                } else {
                    let mut iv = [0u8; 16];
                    iv[..8].copy_from_slice(&aad_sector);
                    iv
                };
                let mut mac = Hmac::<sha2::Sha256>::new_from_slice(mac_key).unwrap();
                mac.update(&aad_sector);
                mac.update(&iv);
                mac.update(&ct);
                assert_eq!(
                    &mac.finalize().into_bytes()[..],
                    &meta[..32],
                    "{}: HMAC",
                    r.label()
                );
                let mut buf = ct.clone();
                xts_data_unit(Backend::current().unwrap(), xts_key, iv, &mut buf, false).unwrap();
                assert_bytes_eq(&buf, &pt, &r.label());
                if r.get("spec") == "aes-xts-plain64" {
                    // The sector engine reads it as it reads any aes-xts-plain64 volume:
                    // IVs in 512-byte units also with 4 KiB sectors.
                    let spec = CipherSpec::parse("aes-xts-plain64").unwrap();
                    let c = SectorCipher::new(spec, xts_key, ss, IvOptions::default()).unwrap();
                    let mut buf = ct.clone();
                    c.decrypt(s * 512 / u64::from(ss), &mut buf).unwrap();
                    assert_bytes_eq(&buf, &pt, &r.label());
                }
            }
            // ChaCha20-Poly1305 has no code of cryptblk's own: the sector cipher below
            // (RustCrypto's) is checked on it in `aead_sector_cipher_known_answers`.
            "chacha20-random" | "aegis128-random" => continue,
            other => panic!("{}: unexpected spec {other}", r.label()),
        }
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} records checked");
}

/// The sector engine of LUKS2 `--integrity` ([`AeadSectorCipher`]) on the kernel's blocks,
/// every mode: it opens each with the kernel's metadata; a flipped ciphertext byte, a
/// flipped tag byte or the block claimed for the next sector is refused (zeros, the sector
/// listed); sealing gives the kernel's block where the IV is not random, and a block that
/// opens again where it is.
#[test]
fn aead_sector_cipher_known_answers() {
    let recs = load("dmcrypt-aead.txt");
    for r in &recs {
        let (key, meta, ct, pt) = (r.hex("key"), r.hex("meta"), r.hex("ct"), r.hex("pt"));
        let (ss, s) = (r.u32("sector_size"), r.u64("sector"));
        let (spec, integrity) = (r.get("spec"), r.get("integrity"));
        let c = AeadSectorCipher::new(spec, integrity, &key, ss, 0)
            .unwrap_or_else(|e| panic!("{}: {e}", r.label()));
        assert_eq!(c.tag_size(), meta.len(), "{}: tag size", r.label());
        assert_eq!(
            AeadSectorCipher::tag_size_of(spec, integrity).unwrap(),
            meta.len()
        );
        let index = s * 512 / u64::from(ss);
        let open = |data: &[u8], m: &[u8], at: u64| {
            let (mut d, mut bad) = (data.to_vec(), Vec::new());
            c.open(at, &mut d, m, &mut bad).unwrap();
            (d, bad)
        };
        let (d, bad) = open(&ct, &meta, index);
        assert!(bad.is_empty(), "{}: the kernel's block refused", r.label());
        assert_bytes_eq(&d, &pt, &r.label());
        let mut flipped = ct.clone();
        flipped[100] ^= 1;
        let (d, bad) = open(&flipped, &meta, index);
        assert_eq!(bad, [0], "{}: flipped ciphertext", r.label());
        assert!(d.iter().all(|&b| b == 0), "{}: data handed out", r.label());
        let mut m2 = meta.clone();
        m2[3] ^= 0x80;
        assert_eq!(open(&ct, &m2, index).1, [0], "{}: flipped tag", r.label());
        assert_eq!(open(&ct, &meta, index + 1).1, [0], "{}: moved", r.label());
        let (mut sealed, mut m3) = (pt.clone(), vec![0u8; meta.len()]);
        c.seal(index, &mut sealed, &mut m3).unwrap();
        if spec.ends_with("plain64") {
            assert_bytes_eq(&sealed, &ct, &r.label());
            assert_eq!(m3, meta, "{}: metadata", r.label());
        } else {
            assert_ne!(m3, meta, "{}: a random IV repeated", r.label());
            let (d, bad) = open(&sealed, &m3, index);
            assert!(bad.is_empty(), "{}", r.label());
            assert_bytes_eq(&d, &pt, &r.label());
        }
    }
}

/// A request of 21 sectors in every mode the probe made (AEGIS then takes two groups of
/// eight side by side, then four, then one alone; AES-GCM a stream of sixteen, then one
/// of five), and one of a single sector: opened, it reads back what was sealed; with one
/// ciphertext byte flipped in sectors 2, 10 and 18 and the tag of sector 20 changed,
/// exactly those four are refused and zeroed and every other sector reads back intact.
#[test]
fn a_request_of_many_sectors_refuses_exactly_the_damaged_ones() {
    let recs = load("dmcrypt-aead.txt");
    for r in &recs {
        let (spec, integrity) = (r.get("spec"), r.get("integrity"));
        let key = r.hex("key");
        let ss = r.u32("sector_size");
        let c = AeadSectorCipher::new(spec, integrity, &key, ss, 0)
            .unwrap_or_else(|e| panic!("{}: {e}", r.label()));
        let (ss, ts) = (ss as usize, c.tag_size());
        let n = 21;
        let pt: Vec<u8> = (0..n * ss).map(|i| (i * 31 + i / 4096) as u8).collect();
        let (mut data, mut meta) = (pt.clone(), vec![0u8; n * ts]);
        c.seal(40, &mut data, &mut meta).unwrap();
        let (mut back, mut bad) = (data.clone(), Vec::new());
        c.open(40, &mut back, &meta, &mut bad).unwrap();
        assert!(bad.is_empty(), "{}: {bad:?} refused", r.label());
        assert_bytes_eq(&back, &pt, &r.label());
        data[2 * ss + 7] ^= 0x10;
        data[10 * ss + ss - 1] ^= 0x01;
        data[18 * ss] ^= 0x80;
        meta[20 * ts] ^= 0x04;
        let mut bad = Vec::new();
        c.open(40, &mut data, &meta, &mut bad).unwrap();
        assert_eq!(bad, [2, 10, 18, 20], "{}: the sectors refused", r.label());
        for i in 0..n {
            let got = &data[i * ss..][..ss];
            if bad.contains(&i) {
                assert!(
                    got.iter().all(|&b| b == 0),
                    "{}: sector {i} handed out",
                    r.label()
                );
            } else {
                assert_bytes_eq(
                    got,
                    &pt[i * ss..][..ss],
                    &format!("{} sector {i}", r.label()),
                );
            }
        }
        // One sector alone (AES-GCM's one-call path): sealed, opened, then refused damaged.
        let (mut one, mut m1) = (pt[..ss].to_vec(), vec![0u8; ts]);
        c.seal(7, &mut one, &mut m1).unwrap();
        let (mut back, mut bad) = (one.clone(), Vec::new());
        c.open(7, &mut back, &m1, &mut bad).unwrap();
        assert!(bad.is_empty(), "{}: one sector refused", r.label());
        assert_bytes_eq(&back, &pt[..ss], &r.label());
        one[0] ^= 1;
        c.open(7, &mut one, &m1, &mut bad).unwrap();
        assert_eq!(bad, [0], "{}: one damaged sector", r.label());
        assert!(
            one.iter().all(|&b| b == 0),
            "{}: one sector handed out",
            r.label()
        );
    }
}

/// The HMAC modes over requests of 1 to 35 sectors (the SHA-256 lanes take up to 32 at a
/// time from six on, one register set up to sixteen; fewer, and the rest of a request, go
/// one by one): every sector's tag
/// is RustCrypto's HMAC of le64(sector) || IV || its ciphertext under the key's last
/// bytes, and a damaged sector anywhere in a group is refused alone.
#[test]
fn hmac_modes_tag_each_sector_of_a_request_as_the_kernel_does() {
    fn mac<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        let mut m = <M as KeyInit>::new_from_slice(key).unwrap();
        parts.iter().for_each(|p| m.update(p));
        m.finalize().into_bytes().to_vec()
    }
    for (spec, integrity, mac_len) in [
        ("aes-xts-plain64", "hmac-sha256", 32),
        ("aes-xts-random", "hmac-sha256", 32),
        ("aes-xts-plain64", "hmac-sha512", 64),
    ] {
        let key: Vec<u8> = (0..64 + mac_len).map(|i| (i * 13 + 5) as u8).collect();
        let mac_key = &key[64..];
        for ss in [512usize, 4096] {
            let c = AeadSectorCipher::new(spec, integrity, &key, ss as u32, 0).unwrap();
            let ts = c.tag_size();
            let per = ss as u64 / 512;
            for n in [1usize, 5, 6, 16, 21, 35] {
                let label = format!("{spec} {integrity} {ss}-byte sectors, {n} sectors");
                let pt: Vec<u8> = (0..n * ss).map(|i| (i * 7 + i / 999) as u8).collect();
                let (mut data, mut meta) = (pt.clone(), vec![0u8; n * ts]);
                c.seal(9, &mut data, &mut meta).unwrap();
                for i in 0..n {
                    let s = (9 + i as u64) * per;
                    let m = &meta[i * ts..][..ts];
                    let mut iv = [0u8; 16];
                    if spec.ends_with("random") {
                        iv.copy_from_slice(&m[mac_len..][..16]);
                    } else {
                        iv[..8].copy_from_slice(&s.to_le_bytes());
                    }
                    let ct = &data[i * ss..][..ss];
                    let want = match mac_len {
                        32 => mac::<Hmac<sha2::Sha256>>(mac_key, &[&s.to_le_bytes(), &iv, ct]),
                        _ => mac::<Hmac<sha2::Sha512>>(mac_key, &[&s.to_le_bytes(), &iv, ct]),
                    };
                    assert_eq!(m[..mac_len], want[..], "{label}: sector {i}'s tag");
                }
                let hit = [n - 1, n / 2, 0];
                for &i in &hit {
                    data[i * ss + (i % ss)] ^= 0x20;
                }
                let mut bad = Vec::new();
                c.open(9, &mut data, &meta, &mut bad).unwrap();
                let mut want: Vec<usize> = hit.to_vec();
                want.sort();
                want.dedup();
                assert_eq!(bad, want, "{label}: the sectors refused");
                for i in (0..n).filter(|i| !want.contains(i)) {
                    assert_bytes_eq(&data[i * ss..][..ss], &pt[i * ss..][..ss], &label);
                }
            }
        }
    }
}
