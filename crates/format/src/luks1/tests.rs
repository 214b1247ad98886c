use super::*;
use crate::MemStorage;

fn fast_kdf() -> KdfRequest {
    KdfRequest {
        forced_iterations: Some(1000),
        ..KdfRequest::luks1_default()
    }
}

fn opts(cipher: &str, key_len: usize) -> FormatOptions {
    let mut o = FormatOptions::new(fast_kdf());
    o.cipher = CipherSpec::parse(cipher).unwrap();
    o.key_len = key_len;
    o
}

fn formatted(cipher: &str, key_len: usize) -> (MemStorage, Luks1Header, Vec<u8>) {
    let mut dev = MemStorage::default();
    let vk: Vec<u8> = (0..key_len as u8).map(|b| b.wrapping_mul(7)).collect();
    let hdr = Luks1Header::format(&mut dev, &opts(cipher, key_len), &vk, b"first").unwrap();
    (dev, hdr, vk)
}

/// Rewrites the phdr bytes of `dev` with `f` applied.
fn damage(dev: &MemStorage, f: impl FnOnce(&mut [u8])) -> MemStorage {
    let mut d = dev.clone();
    d.edit(|b| f(&mut b[..PHDR_SIZE]));
    d
}

fn slot_field(slot: usize, off: usize) -> usize {
    208 + slot * 48 + off
}

#[test]
fn layout_matches_cryptsetup() {
    // 512-bit key: 500 sectors per slot, rounded to 504; last ends at 3536 + 500 = 4036;
    // the payload is aligned to 2048 sectors → 4096.
    let (mut dev, hdr, _) = formatted("aes-xts-plain64", 64);
    let offsets: Vec<u32> = (0..8)
        .map(|i| hdr.slot(i).unwrap().key_material_offset)
        .collect();
    assert_eq!(offsets, [8, 512, 1016, 1520, 2024, 2528, 3032, 3536]);
    assert_eq!(hdr.payload_offset_sectors(), 4096);
    assert_eq!(hdr.header_size(), 4036 * 512);
    assert_eq!(hdr.mk_digest_iterations(), MKD_ITERATIONS_MIN);
    assert_eq!(hdr.hash_spec(), "sha256");
    // 256-bit key: 250 sectors → 256 per slot; 8 + 8*256 = 2056 → payload 4096.
    let (_, h2, _) = formatted("aes-cbc-essiv:sha256", 32);
    assert_eq!(h2.slot(1).unwrap().key_material_offset, 264);
    assert_eq!(h2.payload_offset_sectors(), 4096);
    // The header area was wiped: the bytes after the phdr up to 4096 are zero.
    assert!(dev.to_vec()[PHDR_SIZE..4096].iter().all(|&b| b == 0));
    let again = Luks1Header::read(&mut dev).unwrap();
    assert_eq!(again, hdr);
}

#[test]
fn parse_serialize_roundtrip() {
    let (mut dev, hdr, _) = formatted("aes-xts-plain64", 32);
    let bytes = hdr.to_bytes();
    assert_eq!(&bytes[..], &dev.to_vec()[..PHDR_SIZE]);
    let parsed = Luks1Header::from_bytes(&bytes).unwrap();
    assert_eq!(parsed.to_bytes(), bytes);
    assert_eq!(parsed, hdr);
    assert_eq!(Luks1Header::read(&mut dev).unwrap().to_bytes(), bytes);
    assert_eq!(&bytes[..6], MAGIC);
    assert_eq!(&bytes[8..12], b"aes\0");
    assert_eq!(&bytes[40..52], b"xts-plain64\0");
}

#[test]
fn format_unlock_add_kill() {
    let (mut dev, mut hdr, vk) = formatted("aes-xts-plain64", 64);
    let (slot, key) = hdr.unlock(&mut dev, b"first", None).unwrap();
    assert_eq!((slot, &key[..]), (0, &vk[..]));
    assert!(matches!(
        hdr.unlock(&mut dev, b"wrong", None),
        Err(Error::WrongPassphrase)
    ));
    assert!(matches!(
        hdr.unlock(&mut dev, b"first", Some(1)),
        Err(Error::Keyslot(_))
    ));
    assert!(matches!(
        hdr.unlock(&mut dev, b"first", Some(8)),
        Err(Error::Keyslot(_))
    ));

    let s = hdr
        .add_keyslot(&mut dev, &vk, b"second", Some(5), &fast_kdf())
        .unwrap();
    assert_eq!(s, 5);
    // The change is on disk.
    let reread = Luks1Header::read(&mut dev).unwrap();
    assert_eq!(reread, hdr);
    assert_eq!(reread.unlock(&mut dev, b"second", None).unwrap().0, 5);
    assert_eq!(
        &reread.unlock(&mut dev, b"second", Some(5)).unwrap().1[..],
        &vk[..]
    );
    // Occupied slot, wrong volume key, non-PBKDF2 KDF.
    assert!(matches!(
        hdr.add_keyslot(&mut dev, &vk, b"x", Some(0), &fast_kdf()),
        Err(Error::Keyslot(_))
    ));
    let mut bad_vk = vk.clone();
    bad_vk[0] ^= 1;
    assert!(matches!(
        hdr.add_keyslot(&mut dev, &bad_vk, b"x", None, &fast_kdf()),
        Err(Error::Luks1(Luks1Error::VolumeKeyMismatch))
    ));
    let argon = KdfRequest {
        forced_iterations: Some(4),
        ..KdfRequest::luks2_default()
    };
    assert!(matches!(
        hdr.add_keyslot(&mut dev, &vk, b"x", None, &argon),
        Err(Error::InvalidOption(_))
    ));

    let area = hdr.keyslots()[0].clone();
    hdr.kill_keyslot(&mut dev, 0).unwrap();
    let reread = Luks1Header::read(&mut dev).unwrap();
    let s0 = reread.slot(0).unwrap();
    assert!(!s0.active && s0.iterations == 0 && s0.salt == [0; 32]);
    assert!(matches!(
        reread.unlock(&mut dev, b"first", None),
        Err(Error::WrongPassphrase)
    ));
    assert!(matches!(
        reread.unlock(&mut dev, b"first", Some(0)),
        Err(Error::Keyslot(_))
    ));
    assert_eq!(reread.unlock(&mut dev, b"second", None).unwrap().0, 5);
    assert!(matches!(
        hdr.kill_keyslot(&mut dev, 0),
        Err(Error::Keyslot(_))
    ));
    assert!(matches!(
        hdr.kill_keyslot(&mut dev, 9),
        Err(Error::Keyslot(_))
    ));
    assert_eq!(area.area_offset, 4096);
    assert_eq!(area.area_size, 500 * 512);

    // Fill every slot: the next add finds none free.
    for _ in 0..7 {
        hdr.add_keyslot(&mut dev, &vk, b"more", None, &fast_kdf())
            .unwrap();
    }
    assert!(matches!(
        hdr.add_keyslot(&mut dev, &vk, b"more", None, &fast_kdf()),
        Err(Error::NoFreeKeyslot)
    ));
}

#[test]
fn verify_volume_key_and_keyslot_info() {
    let (_, hdr, vk) = formatted("aes-cbc-essiv:sha256", 32);
    assert!(hdr.verify_volume_key(&vk).unwrap());
    assert!(!hdr.verify_volume_key(&vk[..16]).unwrap());
    let mut other = vk.clone();
    other[31] ^= 0x80;
    assert!(!hdr.verify_volume_key(&other).unwrap());
    let ks = hdr.keyslots();
    assert_eq!(ks.len(), 8);
    assert!(ks[0].active && !ks[1].active);
    assert_eq!(
        ks[0].kdf,
        Some(Kdf::Pbkdf2 {
            hash: HashAlg::Sha256,
            iterations: 1000
        })
    );
    assert_eq!(ks[1].kdf, None);
    assert_eq!((ks[0].stripes, ks[0].af_hash), (4000, HashAlg::Sha256));
    assert_eq!(hdr.data_offset(), 4096 * 512);
    assert_eq!(
        (hdr.version(), hdr.sector_size(), hdr.max_keyslots()),
        (1, 512, 8)
    );
}

#[test]
fn format_options() {
    let vk = [3u8; 64];
    let mut dev = MemStorage::default();
    let mut o = opts("aes-xts-plain64", 64);
    o.uuid = Some("0F0E0D0C-0B0A-4908-8706-050403020100".into());
    o.detached_header = true;
    o.keyslot = Some(3);
    o.hash = HashAlg::Sha512;
    let hdr = Luks1Header::format(&mut dev, &o, &vk, b"p").unwrap();
    assert_eq!(hdr.uuid(), "0f0e0d0c-0b0a-4908-8706-050403020100");
    assert_eq!(hdr.payload_offset_sectors(), 0);
    assert!(hdr.slot(3).unwrap().active && !hdr.slot(0).unwrap().active);
    assert_eq!(hdr.hash_spec(), "sha512");
    // Detached: the file holds exactly the header and keyslots, the last one's area
    // wiped to its 4 KiB boundary as cryptsetup's wipe leaves it.
    assert_eq!(dev.len(), hdr.header_size().next_multiple_of(4096));
    assert_eq!(hdr.unlock(&mut dev, b"p", None).unwrap().0, 3);

    o.detached_header = false;
    o.data_offset = Some(8192 * 512);
    let hdr = Luks1Header::format(&mut MemStorage::default(), &o, &vk, b"p").unwrap();
    assert_eq!(hdr.payload_offset_sectors(), 8192);

    let rejects: [fn(&mut FormatOptions); 8] = [
        |o| o.data_offset = Some(1000),       // not sector aligned
        |o| o.data_offset = Some(2048 * 512), // inside the keyslot area
        |o| o.sector_size = 4096,
        |o| o.kdf = KdfRequest::luks2_default(),
        |o| o.key_len = 16, // XTS needs 32/48/64 and vk length differs
        |o| o.uuid = Some("not-a-uuid".into()),
        |o| o.uuid = Some("0f0e0d0c0b0a49088706050403020100".into()),
        |o| o.label = Some("x".into()),
    ];
    for (i, f) in rejects.iter().enumerate() {
        let mut o = opts("aes-xts-plain64", 64);
        f(&mut o);
        let r = Luks1Header::format(&mut MemStorage::default(), &o, &vk, b"p");
        assert!(matches!(r, Err(Error::InvalidOption(_))), "case {i}: {r:?}");
    }
    let mut o = opts("aes-xts-plain64", 64);
    o.keyslot = Some(8);
    assert!(matches!(
        Luks1Header::format(&mut MemStorage::default(), &o, &vk, b"p"),
        Err(Error::Keyslot(_))
    ));
}

#[test]
fn calibrated_digest_iterations() {
    let mut o = opts("aes-xts-plain64", 32);
    o.kdf = KdfRequest {
        iter_time_ms: 200,
        ..KdfRequest::luks1_default()
    };
    let hdr = Luks1Header::format(&mut MemStorage::default(), &o, &[1; 32], b"p").unwrap();
    let slot_it = hdr.slot(0).unwrap().iterations;
    let d = hdr.mk_digest_iterations();
    // digest = slot iterations * 125 / 200 (at least 1000).
    assert_eq!(d, (u64::from(slot_it) * 125 / 200).max(1000) as u32);
}

fn assert_luks1_err(dev: &mut MemStorage, check: impl Fn(&Luks1Error) -> bool) {
    match Luks1Header::read(dev) {
        Err(Error::Luks1(e)) if check(&e) => {}
        other => panic!("unexpected result {other:?}"),
    }
}

#[test]
fn hostile_headers_are_rejected() {
    let (dev, _, _) = formatted("aes-xts-plain64", 64);

    // Truncated: shorter than the phdr, or without all keyslot areas.
    for len in [0usize, 7, 100, 591] {
        let mut d = MemStorage::from_vec(dev.to_vec()[..len].to_vec());
        assert!(
            matches!(Luks1Header::read(&mut d), Err(Error::Truncated { .. })),
            "{len}"
        );
    }
    let mut d = MemStorage::from_vec(dev.to_vec()[..4036 * 512 - 1].to_vec());
    assert!(
        matches!(Luks1Header::read(&mut d), Err(Error::Truncated { need, .. }) if need == 4036 * 512)
    );

    let mut d = damage(&dev, |b| b[0] = b'X');
    assert!(matches!(Luks1Header::read(&mut d), Err(Error::NotLuks)));
    let mut d = damage(&dev, |b| b[7] = 2);
    assert_luks1_err(&mut d, |e| *e == Luks1Error::UnsupportedVersion(2));
    let mut d = damage(&dev, |b| b[8..40].fill(b'a'));
    assert_luks1_err(&mut d, |e| {
        matches!(
            e,
            Luks1Error::BadString {
                field: "cipher_name",
                ..
            }
        )
    });
    let mut d = damage(&dev, |b| b[168..208].fill(0xff));
    assert_luks1_err(&mut d, |e| {
        matches!(e, Luks1Error::BadString { field: "uuid", .. })
    });
    let mut d = damage(&dev, |b| b[8..16].copy_from_slice(b"anubis\0\0"));
    assert_luks1_err(
        &mut d,
        |e| matches!(e, Luks1Error::UnsupportedCipher(c) if c == "anubis-xts-plain64"),
    );
    let mut d = damage(&dev, |b| b[40..52].copy_from_slice(b"xts-bogus\0\0\0"));
    assert_luks1_err(&mut d, |e| matches!(e, Luks1Error::UnsupportedCipher(_)));
    let mut d = damage(&dev, |b| b[72..82].copy_from_slice(b"tiger192\0\0"));
    assert_luks1_err(
        &mut d,
        |e| matches!(e, Luks1Error::UnsupportedHash(h) if h == "tiger192"),
    );
    for kb in [0u32, 16, 65, u32::MAX] {
        let mut d = damage(&dev, |b| b[108..112].copy_from_slice(&kb.to_be_bytes()));
        assert_luks1_err(&mut d, |e| matches!(e, Luks1Error::KeyBytes { .. }));
    }
    let mut d = damage(&dev, |b| b[164..168].fill(0));
    assert_luks1_err(&mut d, |e| *e == Luks1Error::DigestIterations);
    let mut d = damage(&dev, |b| {
        b[slot_field(2, 0)..slot_field(2, 4)].copy_from_slice(&0xCAFEu32.to_be_bytes())
    });
    assert_luks1_err(&mut d, |e| {
        *e == Luks1Error::SlotState {
            slot: 2,
            state: 0xCAFE,
        }
    });
    // Zero stripes (active and free slots), absurd stripes, zero iterations.
    for slot in [0usize, 4] {
        let mut d = damage(&dev, |b| {
            b[slot_field(slot, 44)..slot_field(slot, 48)].fill(0)
        });
        assert_luks1_err(&mut d, |e| {
            *e == Luks1Error::Stripes {
                slot: slot as u32,
                stripes: 0,
            }
        });
    }
    let mut d = damage(&dev, |b| b[slot_field(0, 44)..slot_field(0, 48)].fill(0xff));
    assert_luks1_err(&mut d, |e| matches!(e, Luks1Error::Stripes { slot: 0, .. }));
    let mut d = damage(&dev, |b| b[slot_field(0, 4)..slot_field(0, 8)].fill(0));
    assert_luks1_err(&mut d, |e| *e == Luks1Error::SlotIterations { slot: 0 });
    // Slot areas: overlapping the phdr, each other, or the payload.
    let set_offset = |slot: usize, off: u32| {
        damage(&dev, move |b| {
            b[slot_field(slot, 40)..slot_field(slot, 44)].copy_from_slice(&off.to_be_bytes())
        })
    };
    let mut d = set_offset(0, 1);
    assert_luks1_err(&mut d, |e| {
        matches!(e, Luks1Error::SlotArea { slot: 0, .. })
    });
    let mut d = set_offset(3, 1020);
    assert_luks1_err(&mut d, |e| matches!(e, Luks1Error::SlotOverlap { .. }));
    let mut d = set_offset(6, 512);
    assert_luks1_err(&mut d, |e| matches!(e, Luks1Error::SlotOverlap { .. }));
    let mut d = set_offset(7, 4000);
    assert_luks1_err(&mut d, |e| {
        matches!(e, Luks1Error::SlotArea { slot: 7, .. })
    });
    let mut d = set_offset(7, u32::MAX);
    assert_luks1_err(&mut d, |e| {
        matches!(e, Luks1Error::SlotArea { slot: 7, .. })
    });
    let mut d = damage(&dev, |b| {
        b[104..108].copy_from_slice(&3000u32.to_be_bytes())
    });
    assert_luks1_err(&mut d, |e| matches!(e, Luks1Error::SlotArea { .. }));
    // Detached header (payload 0): slot areas are bounded by the device only.
    let mut d = damage(&dev, |b| b[104..108].fill(0));
    assert!(Luks1Header::read(&mut d).is_ok());
    let mut d = damage(&d, |b| {
        b[slot_field(7, 40)..slot_field(7, 44)].copy_from_slice(&100_000u32.to_be_bytes())
    });
    assert!(matches!(
        Luks1Header::read(&mut d),
        Err(Error::Truncated { .. })
    ));
}

#[test]
fn random_garbage_never_panics() {
    let (dev, _, _) = formatted("aes-cbc-essiv:sha256", 32);
    let mut seed = 0x1234_5678_9abc_def0u64;
    for _ in 0..2000 {
        let mut d = dev.clone();
        for _ in 0..4 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let pos = (seed % PHDR_SIZE as u64) as usize;
            d.write_at(&[(seed >> 32) as u8], pos as u64).unwrap();
        }
        let _ = Luks1Header::read(&mut d);
    }
}

#[test]
fn debug_output_has_no_surprises() {
    let (_, hdr, _) = formatted("aes-cbc-essiv:sha256", 32);
    let s = format!("{hdr:?}");
    assert!(s.contains("mk_digest") && s.contains("aes"));
}

/// Regression (damaged-header suite): cryptsetup refuses a header with a stripe count other
/// than 4000 in any slot, free ones included; so do we.
#[test]
fn non_standard_stripes_in_a_free_slot_are_refused() {
    let (dev, _, _) = formatted("aes-xts-plain64", 32);
    let mut d = damage(&dev, |b| {
        b[slot_field(5, 44)..slot_field(5, 48)].copy_from_slice(&3999u32.to_be_bytes())
    });
    assert_luks1_err(&mut d, |e| {
        *e == Luks1Error::Stripes {
            slot: 5,
            stripes: 3999,
        }
    });
}

/// Regression (crash-point suite): kill-slot disables the slot in the header before it
/// wipes the key material, so power loss during the wipe never leaves an ENABLED slot
/// whose material is half gone.
#[test]
fn kill_writes_the_header_before_wiping() {
    let (mut dev, mut hdr, vk) = formatted("aes-xts-plain64", 32);
    hdr.add_keyslot(&mut dev, &vk, b"second", None, &fast_kdf())
        .unwrap();
    let base = dev.clone();
    let mut dry = crate::CrashDevice::new(base.clone(), None, crate::Tear::Lost, true);
    hdr.clone().kill_keyslot(&mut dry, 0).unwrap();
    let writes = dry.writes();
    assert_eq!(writes, 2, "header, then the wipe");
    // Power fails during the wipe, half of it on disk.
    let mut crashing = crate::CrashDevice::new(base, Some(2), crate::Tear::Prefix, false);
    assert!(hdr.clone().kill_keyslot(&mut crashing, 0).is_err());
    let mut img = crashing.after_power_loss();
    let r = Luks1Header::read(&mut img).unwrap();
    assert!(!r.slot(0).unwrap().active);
    assert_eq!(r.unlock(&mut img, b"second", None).unwrap().0, 1);
}

#[test]
fn change_keeps_the_keyslot_number_when_asked() {
    let (mut dev, mut hdr, vk) = formatted("aes-xts-plain64", 32);
    // A free keyslot: the new passphrase goes through it and ends in slot 0; the
    // temporary copy is gone.
    let slot = hdr
        .replace_keyslot(&mut dev, 0, &vk, b"second", Some(0), &fast_kdf())
        .unwrap();
    assert_eq!(slot, 0);
    assert_eq!(hdr.keyslots().iter().filter(|k| k.active).count(), 1);
    assert!(hdr.unlock(&mut dev, b"first", None).is_err());
    assert_eq!(hdr.unlock(&mut dev, b"second", None).unwrap().0, 0);
    // Every keyslot in use: slot 3 is rewritten in place, the others untouched.
    for _ in 0..7 {
        hdr.add_keyslot(&mut dev, &vk, b"other", None, &fast_kdf())
            .unwrap();
    }
    let slot = hdr
        .replace_keyslot(&mut dev, 3, &vk, b"third", Some(3), &fast_kdf())
        .unwrap();
    assert_eq!(slot, 3);
    assert_eq!(hdr.keyslots().iter().filter(|k| k.active).count(), 8);
    assert_eq!(hdr.unlock(&mut dev, b"third", Some(3)).unwrap().0, 3);
    assert_eq!(hdr.unlock(&mut dev, b"second", None).unwrap().0, 0);
}
