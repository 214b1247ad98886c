//! Core Storage metadata built here, for what cryptsetup's one test image lacks: several
//! users, damaged fields. Compatibility itself is tested on that image (cli tests).

use super::*;
use cryptblk_crypto::aes_key_wrap;
use cryptblk_device::MemStorage;

const BS: u64 = 4096;
const FAMILY: &str = "33a76caa-1481-4bc5-8d04-1ac1707c19c0";
const VK_HALF: [u8; 16] = [0x5a; 16];
const KEK: [u8; 16] = [0x3c; 16];
const ITER: u32 = 1000;

fn seal(block: &mut [u8]) {
    block[4..8].copy_from_slice(&0xffff_ffffu32.to_le_bytes());
    let crc = crc32c_update(!0, &block[8..]);
    block[..4].copy_from_slice(&crc.to_le_bytes());
}

fn b64(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// A user's entry; the passphrases `!garbage` (not base64) and `!zero` (0 PBKDF2
/// iterations) make damaged ones.
fn wrapped_kek(passphrase: &[u8], salt: u8) -> String {
    if passphrase == b"!garbage" {
        return "<key>PassphraseWrappedKEKStruct</key><data>!!not base64!!</data>".into();
    }
    let mut derived = [0u8; 16];
    Kdf::Pbkdf2 {
        hash: HashAlg::Sha256,
        iterations: ITER,
    }
    .derive(passphrase, &[salt; 16], &mut derived)
    .unwrap();
    let mut raw = vec![0u8; PASSPHRASE_WRAPPED_KEK_LEN];
    raw[8..24].copy_from_slice(&[salt; 16]);
    raw[32..56].copy_from_slice(&aes_key_wrap(&derived, &KEK).unwrap());
    let iterations = if passphrase == b"!zero" { 0 } else { ITER };
    raw[168..172].copy_from_slice(&iterations.to_le_bytes());
    format!(
        "<key>PassphraseWrappedKEKStruct</key><data>{}</data>",
        b64(&raw)
    )
}

fn meta_block(kind: u16, xml_field: usize, xml: &str) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_LEN];
    b[10..12].copy_from_slice(&kind.to_le_bytes());
    let at = 1024usize;
    if !xml.is_empty() {
        b[xml_field..xml_field + 4].copy_from_slice(&(at as u32).to_le_bytes());
        b[xml_field + 4..xml_field + 8].copy_from_slice(&(xml.len() as u32).to_le_bytes());
        b[at..at + xml.len()].copy_from_slice(xml.as_bytes());
    }
    b
}

/// A volume whose users are `passphrases`; `tweak` may damage the plaintext metadata
/// blocks (0x0019, 0x001A, 0x0305) before they are sealed and encrypted.
fn image(passphrases: &[&[u8]], tweak: impl Fn(&mut [Vec<u8>])) -> MemStorage {
    let dev = MemStorage::new(32 * BS);
    let mut vh = [0u8; VOLUME_HEADER_LEN];
    vh[8] = 1;
    vh[88..90].copy_from_slice(&CORE_STORAGE_MAGIC.to_be_bytes());
    vh[96..100].copy_from_slice(&(BS as u32).to_le_bytes());
    vh[104..112].copy_from_slice(&1u64.to_le_bytes());
    vh[168..172].copy_from_slice(&16u32.to_le_bytes());
    vh[176..192].copy_from_slice(&[0x11; 16]);
    vh[304..320].copy_from_slice(&[0x22; 16]);
    seal(&mut vh);
    dev.write_at(&vh, 0).unwrap();

    let mut label = vec![0u8; BLOCK_LEN];
    label[BLOCK_DISK_LABEL_VG_OFFSET..BLOCK_DISK_LABEL_VG_OFFSET + 4]
        .copy_from_slice(&(BLOCK_LEN as u32).to_le_bytes());
    seal(&mut label);
    dev.write_at(&label, BS).unwrap();
    let mut vg = [0u8; 40];
    vg[8..16].copy_from_slice(&8u64.to_le_bytes());
    vg[32..40].copy_from_slice(&4u64.to_le_bytes());
    dev.write_at(&vg, BS + BLOCK_LEN as u64).unwrap();

    let mut kwvk = vec![0u8; KEK_WRAPPED_VOLUME_KEY_LEN];
    kwvk[8..32].copy_from_slice(&aes_key_wrap(&KEK, &VK_HALF).unwrap());
    let users: String = passphrases
        .iter()
        .enumerate()
        .map(|(i, p)| wrapped_kek(p, i as u8))
        .collect();
    let x19 = format!(
        "<dict>{users}<key>KEKWrappedVolumeKeyStruct</key><data>{}</data></dict>",
        b64(&kwvk)
    );
    let x1a = format!(
        "<key>com.apple.corestorage.lv.size</key><integer size=\"64\">0x10000</integer>\
         <key>com.apple.corestorage.lv.familyUUID</key><string>{}</string>",
        FAMILY.to_uppercase()
    );
    let mut blocks = vec![
        meta_block(0x0019, BLOCK_0019_XML, &x19),
        meta_block(0x001a, BLOCK_001A_XML, &x1a),
        meta_block(0x0305, 0, ""),
    ];
    blocks[2][BLOCK_0305_LV_BLOCK..BLOCK_0305_LV_BLOCK + 4].copy_from_slice(&16u32.to_le_bytes());
    tweak(&mut blocks);
    let key = [[0x11u8; 16], [0x22; 16]].concat();
    let xts = UnitCipher::new(BlockCipherAlg::Aes, ChainMode::Xts, &key).unwrap();
    for (i, mut b) in blocks.into_iter().enumerate() {
        seal(&mut b);
        let mut tweak = [0u8; 16];
        tweak[0] = i as u8;
        xts.encrypt(&tweak, &mut b).unwrap();
        dev.write_at(&b, 4 * BS + (i * BLOCK_LEN) as u64).unwrap();
    }
    dev
}

fn expected_key() -> Vec<u8> {
    let family = uuid::Uuid::parse_str(FAMILY).unwrap();
    let mut d = [0u8; 32];
    HashAlg::Sha256.digest_parts(&[&VK_HALF, family.as_bytes()], &mut d);
    [&VK_HALF[..], &d[..16]].concat()
}

#[test]
fn every_user_opens_and_others_do_not() {
    let dev = image(
        &[b"alice", b"bob", b"ABCD-EFGH-IJKL-MNOP-QRST-UVWX"],
        |_| {},
    );
    let h = Fvault2Header::read(&dev).unwrap();
    assert_eq!(h.family_uuid, FAMILY);
    assert_eq!(h.physical_uuid, "22222222-2222-2222-2222-222222222222");
    assert_eq!((h.volume_offset, h.volume_size), (16 * BS, 0x10000));
    assert_eq!(h.passphrase_keks.len(), 3);
    for p in [&b"alice"[..], b"bob", b"ABCD-EFGH-IJKL-MNOP-QRST-UVWX"] {
        assert_eq!(&h.volume_key(p).unwrap()[..], &expected_key()[..]);
    }
    assert!(matches!(h.volume_key(b"eve"), Err(Error::WrongPassphrase)));
    let dump = h.dump("img");
    assert!(dump.contains("PBKDF2 iterations:    \t1000\n"), "{dump}");
    assert!(dump.contains("PBKDF2 salt:          \t00 00 00"), "{dump}");
}

/// cryptsetup reads only the first user's entry; later damaged ones are skipped, and a
/// damaged user does not hide the next.
#[test]
fn later_damaged_users_do_not_cost_the_volume() {
    let dev = image(&[b"alice", b"!garbage", b"!zero", b"bob"], |_| {});
    let h = Fvault2Header::read(&dev).unwrap();
    assert_eq!(h.passphrase_keks.len(), 3, "the garbage entry is skipped");
    for p in [&b"alice"[..], b"bob"] {
        assert_eq!(&h.volume_key(p).unwrap()[..], &expected_key()[..]);
    }
    // The first entry is cryptsetup's: damaged, the volume is refused.
    let first_bad = image(&[b"!garbage", b"alice"], |_| {});
    assert!(Fvault2Header::read(&first_bad).is_err());
}

#[test]
fn damaged_metadata_is_refused_with_a_reason() {
    fn refused(dev: &MemStorage, why: &str) {
        match Fvault2Header::read(dev) {
            Err(
                e @ (Error::Fvault2(Fvault2Error::CorruptMetadata(_)) | Error::Truncated { .. }),
            ) => {
                assert!(e.to_string().contains(why), "{e} (wanted {why})")
            }
            Err(e) => panic!("{e}: not reported as corrupt metadata (wanted {why})"),
            Ok(h) => panic!("accepted damaged metadata: {h:?}"),
        }
    }
    let ok = image(&[b"x"], |_| {});
    // Not Core Storage at all, then a bad checksum in each sealed place.
    let zeros = MemStorage::new(1 << 20);
    assert!(matches!(
        Fvault2Header::read(&zeros),
        Err(Error::Fvault2(Fvault2Error::NotFvault2))
    ));
    for (at, why) in [(40u64, "volume header"), (BS + 100, "disk label")] {
        let dev = image(&[b"x"], |_| {});
        let mut b = [0u8; 1];
        dev.read_at(&mut b, at).unwrap();
        dev.write_at(&[b[0] ^ 1], at).unwrap();
        refused(&dev, why);
    }
    let dev = image(&[b"x"], |_| {});
    dev.write_at(&[0xff], 4 * BS + 3000).unwrap();
    refused(&dev, "encrypted metadata block");
    // Plist damage behind valid checksums.
    refused(&image(&[], |_| {}), "no wrapped keys");
    refused(&image(&[b"x"], |b| b[0][1080] = b'!'), "not base64");
    refused(
        &image(&[b"x"], |b| {
            b[0][BLOCK_0019_XML..BLOCK_0019_XML + 4].copy_from_slice(&8000u32.to_le_bytes())
        }),
        "beyond its metadata block",
    );
    refused(
        &image(&[b"x"], |b| b[1][1024 + 60] = b'z'),
        "no logical volume size",
    );
    refused(
        &image(&[b"x"], |b| b[1].fill(0)),
        "necessary metadata blocks",
    );
    refused(
        &image(&[b"x"], |b| {
            let at = b[1].windows(4).position(|w| w == b"<str").unwrap() + 10;
            b[1][at] = b'-';
        }),
        "family UUID",
    );
    // A truncated device.
    let short = MemStorage::new(5 * BS);
    let mut buf = vec![0u8; 5 * BS as usize];
    ok.read_at(&mut buf, 0).unwrap();
    short.write_at(&buf, 0).unwrap();
    refused(&short, "truncated");
}

#[test]
fn plist_matching_is_cryptsetups_pattern() {
    let xml = "<key>k</key><data a=\"1\">AAA</data><key>k</key> <data>no</data>\
               <key>k</key><data>BBB</data><key>k</key><string>CCC</string>";
    assert_eq!(plist_values(xml, "k", "data"), ["AAA", "BBB"]);
    assert_eq!(plist_values(xml, "k", "string"), ["CCC"]);
    assert_eq!(hex_integer("0xa000000"), Some(0xa00_0000));
    assert_eq!(hex_integer("ff zz"), Some(0xff));
    assert_eq!(hex_integer("zz"), None);
}
