use super::binary::{BinHeader, encode_copy};
use super::*;
use crate::MemStorage;
use cryptblk_crypto::{Argon2Variant, HashAlg, Kdf, KdfKind};

const MIB: u64 = 1024 * 1024;

fn fast_kdf() -> KdfRequest {
    KdfRequest {
        kind: KdfKind::Pbkdf2,
        hash: HashAlg::Sha256,
        iter_time_ms: 10,
        forced_iterations: Some(1000),
        memory_kib: 32,
        parallel: 1,
    }
}

fn opts() -> FormatOptions {
    let mut o = FormatOptions::new(fast_kdf());
    o.key_len = 32;
    o
}

fn vk() -> Vec<u8> {
    (0..32u8).collect()
}

fn fresh() -> (MemStorage, Luks2Header) {
    let mut dev = MemStorage::new(17 * MIB);
    let h = Luks2Header::format(&mut dev, &opts(), &vk(), b"pass0").unwrap();
    (dev, h)
}

fn luks2_err(r: Result<Luks2Header>) -> Luks2Error {
    match r {
        Err(Error::Luks2(e)) => e,
        other => panic!("expected a LUKS2 error, got {other:?}"),
    }
}

/// Writes `text` as the JSON of both copies, with valid checksums and a higher seqid.
fn put_json_text(dev: &mut MemStorage, h: &Luks2Header, text: &[u8]) {
    for (secondary, off) in [(false, 0), (true, h.hdr_size())] {
        let bin = BinHeader {
            secondary,
            hdr_size: h.hdr_size(),
            seqid: h.seqid() + 1,
            label: String::new(),
            checksum_alg: "sha256".into(),
            salt: [7; 64],
            uuid: h.uuid().to_string(),
            subsystem: String::new(),
            hdr_offset: off,
        };
        dev.write_at(&encode_copy(&bin, text).unwrap(), off)
            .unwrap();
    }
}

/// Re-reads after changing the JSON with `f`.
fn with_json(f: impl FnOnce(&mut Value)) -> Result<Luks2Header> {
    let (mut dev, h) = fresh();
    let mut j = h.json().clone();
    f(&mut j);
    put_json_text(&mut dev, &h, &serde_json::to_vec(&j).unwrap());
    Luks2Header::read(&mut dev)
}

fn metadata_error(f: impl FnOnce(&mut Value), needle: &str) {
    match luks2_err(with_json(f)) {
        Luks2Error::NoValidCopy { primary, secondary } => {
            assert!(
                primary.contains(needle),
                "primary: {primary} (want {needle})"
            );
            assert!(secondary.contains(needle), "secondary: {secondary}");
        }
        e => panic!("unexpected {e:?}"),
    }
}

#[test]
fn format_matches_cryptsetup_layout_and_roundtrips() {
    let (mut dev, h) = fresh();
    assert_eq!(h.hdr_size(), 16384);
    assert_eq!(h.json_size(), 12288);
    assert_eq!(h.keyslots_size(), 16744448);
    assert_eq!(h.data_offset(), 16 * MIB);
    assert_eq!(h.data_length(), None);
    assert_eq!(h.header_size(), 16 * MIB);
    assert_eq!(
        h.iv_options(),
        IvOptions {
            large_sectors: false,
            offset: 0
        }
    );
    let ks = h.keyslots();
    assert_eq!(ks.len(), 1);
    assert_eq!(
        (ks[0].id, ks[0].area_offset, ks[0].area_size, ks[0].stripes),
        (0, 32768, 131072, 4000)
    );
    assert_eq!(
        ks[0].kdf,
        Some(Kdf::Pbkdf2 {
            hash: HashAlg::Sha256,
            iterations: 1000
        })
    );
    let j = h.json();
    assert_eq!(
        j["digests"]["0"]["iterations"], 1000,
        "forced PBKDF cost → digest minimum"
    );
    assert_eq!(j["keyslots"]["0"]["area"]["encryption"], "aes-xts-plain64");
    assert_eq!(j["segments"]["0"]["offset"], "16777216");
    let order: Vec<&String> = j.as_object().unwrap().keys().collect();
    assert_eq!(
        order,
        ["keyslots", "tokens", "segments", "digests", "config"]
    );

    let r = Luks2Header::read(&mut dev).unwrap();
    assert_eq!(r.json(), h.json());
    assert_eq!(
        (r.uuid(), r.seqid(), r.key_len(), r.sector_size()),
        (h.uuid(), 1, 32, 512)
    );
    assert!(r.copy_status().both_valid() && r.copies_in_sync());
    let (slot, key) = r.unlock(&mut dev, b"pass0", None).unwrap();
    assert_eq!((slot, &key[..]), (0, &vk()[..]));
    assert!(matches!(
        r.unlock(&mut dev, b"wrong", None),
        Err(Error::WrongPassphrase)
    ));
    assert!(r.verify_volume_key(&vk()).unwrap());
    assert!(!r.verify_volume_key(&[0u8; 32]).unwrap());
    assert!(matches!(crate::load_header(&mut dev).unwrap().version(), 2));
}

#[test]
fn layout_follows_cryptsetup() {
    let l = |ks, off, det| compute_layout(0x4000, ks, off, det).unwrap();
    assert_eq!(l(None, None, false), (16744448, 16 * MIB));
    assert_eq!(l(None, None, true), (16744448, 0));
    assert_eq!(l(None, Some(2 * MIB), false), (2 * MIB - 32768, 2 * MIB));
    assert_eq!(l(None, Some(2 * MIB), true), (2 * MIB - 32768, 2 * MIB));
    assert_eq!(l(Some(MIB), None, false), (MIB, 2 * MIB));
    assert_eq!(
        compute_layout(0x10000, None, None, false).unwrap(),
        (16 * MIB - 0x20000, 16 * MIB)
    );
    assert!(compute_layout(0x4000, None, Some(16384), false).is_err());
}

#[test]
fn format_options_are_honoured() {
    let mut o = opts();
    o.label = Some("my label".into());
    o.subsystem = Some("sub".into());
    o.uuid = Some("12345678-1234-1234-1234-123456789ABC".into());
    o.sector_size = 4096;
    o.luks2_metadata_size = Some(0x8000);
    o.luks2_keyslots_size = Some(MIB);
    o.keyslot = Some(5);
    o.detached_header = true;
    let mut dev = MemStorage::default();
    let h = Luks2Header::format(&mut dev, &o, &vk(), b"p").unwrap();
    let r = Luks2Header::read(&mut dev).unwrap();
    assert_eq!((r.label(), r.subsystem()), ("my label", "sub"));
    assert_eq!(r.uuid(), "12345678-1234-1234-1234-123456789abc");
    assert_eq!(
        (r.hdr_size(), r.keyslots_size(), r.data_offset()),
        (0x8000, MIB, 0)
    );
    assert_eq!(r.sector_size(), 4096);
    assert_eq!(dev.len(), 0x10000 + MIB);
    assert_eq!(r.unlock(&mut dev, b"p", None).unwrap().0, 5);
    assert_eq!(r.json(), h.json());

    o.uuid = Some("not-a-uuid".into());
    assert!(matches!(
        Luks2Header::format(&mut MemStorage::default(), &o, &vk(), b"p"),
        Err(Error::Luks2(Luks2Error::InvalidUuid(_)))
    ));
    o.uuid = None;
    o.label = Some("x".repeat(48));
    assert!(matches!(
        Luks2Header::format(&mut MemStorage::default(), &o, &vk(), b"p"),
        Err(Error::Luks2(Luks2Error::InvalidLabel(_)))
    ));
    o.label = None;
    o.luks2_metadata_size = Some(0x5000);
    assert!(Luks2Header::format(&mut MemStorage::default(), &o, &vk(), b"p").is_err());
    // Not detached, on a store smaller than the header: a store that can grow (a file,
    // memory) grows to hold it, as cryptsetup formats an image file that is too small;
    // header_end says what a store that cannot grow must hold.
    let mut o = opts();
    o.detached_header = false;
    let mut small = MemStorage::new(MIB);
    Luks2Header::format(&mut small, &o, &vk(), b"p").unwrap();
    assert_eq!(Luks2Header::header_end(&o).unwrap(), 16 * MIB);
    assert!(small.size().unwrap() >= 16 * MIB);
    assert!(Luks2Header::read(&mut small).is_ok());
}

#[test]
fn argon2_keyslot_and_cipher_null_keyslot_cipher() {
    let mut o = opts();
    o.cipher = CipherSpec::parse("cipher_null-ecb").unwrap();
    o.kdf = KdfRequest {
        kind: KdfKind::Argon2(Argon2Variant::Argon2id),
        forced_iterations: Some(4),
        ..fast_kdf()
    };
    // cipher_null ignores its key, but LUKS2 still needs a volume key for the digest, and
    // cryptsetup protects the keyslot with aes-xts-plain64/512 instead of the null cipher.
    o.key_len = 32;
    let mut dev = MemStorage::new(17 * MIB);
    let h = Luks2Header::format(&mut dev, &o, &vk(), b"p").unwrap();
    assert_eq!(
        h.json()["keyslots"]["0"]["area"]["encryption"],
        "aes-xts-plain64"
    );
    assert_eq!(h.json()["keyslots"]["0"]["area"]["key_size"], 64);
    assert_eq!(h.json()["keyslots"]["0"]["kdf"]["type"], "argon2id");
    assert_eq!(h.json()["keyslots"]["0"]["kdf"]["memory"], 32);
    assert_eq!(h.unlock(&mut dev, b"p", None).unwrap().1[..], vk()[..]);
}

#[test]
fn corrupt_primary_opens_from_secondary_and_read_never_writes() {
    for corrupt in [0usize, 4096 + 3, 448, 200] {
        let (mut dev, h) = fresh();
        dev.edit(|d| d[corrupt] ^= 0x55);
        let before = dev.to_vec();
        let r = Luks2Header::read(&mut dev).unwrap();
        assert_eq!(r.json(), h.json());
        assert!(r.copy_status().primary_error.is_some(), "offset {corrupt}");
        assert!(r.copy_status().secondary_error.is_none());
        assert_eq!(dev.to_vec(), before, "read must not write");
        assert!(r.unlock(&mut dev, b"pass0", None).is_ok());
    }
    // Primary wiped entirely (e.g. by wipefs): found through the secondary's magic.
    let (mut dev, _) = fresh();
    dev.edit(|d| d[..16384].fill(0));
    let mut r = Luks2Header::read(&mut dev).unwrap();
    assert!(r.copy_status().primary_error.is_some());
    assert!(crate::load_header(&mut dev).is_ok());
    // Explicit repair restores both copies.
    r.repair(&mut dev).unwrap();
    let r2 = Luks2Header::read(&mut dev).unwrap();
    assert!(r2.copy_status().both_valid() && r2.copies_in_sync());
    assert_eq!(r2.seqid(), r.seqid());
}

#[test]
fn secondary_found_at_every_header_size() {
    let mut o = opts();
    o.luks2_metadata_size = Some(0x40000);
    let mut dev = MemStorage::new(17 * MIB);
    Luks2Header::format(&mut dev, &o, &vk(), b"p").unwrap();
    dev.edit(|d| d[..4096].fill(0xff));
    let r = Luks2Header::read(&mut dev).unwrap();
    assert_eq!(r.hdr_size(), 0x40000);
}

#[test]
fn both_corrupt_and_not_luks_are_clear_errors() {
    let (mut dev, h) = fresh();
    dev.edit(|d| {
        d[5000] ^= 1;
        d[h.hdr_size() as usize + 5000] ^= 1;
    });
    match luks2_err(Luks2Header::read(&mut dev)) {
        Luks2Error::NoValidCopy { primary, secondary } => {
            assert!(
                primary.contains("checksum") && secondary.contains("checksum"),
                "{primary} / {secondary}"
            );
        }
        e => panic!("{e:?}"),
    }
    assert!(
        Luks2Header::read(&mut dev)
            .unwrap_err()
            .to_string()
            .contains("no valid header copy")
    );
    let mut zero = MemStorage::new(MIB);
    assert!(matches!(Luks2Header::read(&mut zero), Err(Error::NotLuks)));
    // Bad version in the primary, secondary wiped.
    let (mut dev, _) = fresh();
    dev.edit(|d| {
        d[7] = 3;
        d[16384..16390].fill(0);
    });
    assert!(matches!(
        Luks2Header::read(&mut dev),
        Err(Error::Luks2(Luks2Error::NoValidCopy { .. }))
    ));
}

#[test]
fn truncated_devices_error_without_panic() {
    let (dev, _) = fresh();
    for len in [
        0usize,
        7,
        4000,
        4096,
        10000,
        16384,
        20000,
        40000,
        (16 * MIB - 1) as usize,
    ] {
        let mut d = MemStorage::from_vec(dev.to_vec()[..len].to_vec());
        assert!(Luks2Header::read(&mut d).is_err(), "len {len}");
    }
    let mut d = MemStorage::from_vec(dev.to_vec()[..40000].to_vec());
    assert!(
        matches!(Luks2Header::read(&mut d), Err(Error::Truncated { need, .. }) if need == 16 * MIB)
    );
}

#[test]
fn higher_seqid_wins() {
    let (mut dev, mut h) = fresh();
    let old = dev.to_vec();
    h.add_keyslot(&mut dev, &vk(), b"pass1", None, &fast_kdf())
        .unwrap();
    let hs = h.hdr_size() as usize;
    // New primary + old secondary → new.
    let mut d = dev.clone();
    d.write_at(&old[hs..2 * hs], hs as u64).unwrap();
    let r = Luks2Header::read(&mut d).unwrap();
    assert_eq!(r.keyslots().len(), 2);
    assert!(!r.copies_in_sync());
    // Old primary + new secondary → new as well.
    let mut d = dev.clone();
    d.write_at(&old[..hs], 0).unwrap();
    assert_eq!(Luks2Header::read(&mut d).unwrap().keyslots().len(), 2);
}

#[test]
fn hostile_metadata_is_rejected() {
    metadata_error(
        |j| j["keyslots"]["0"]["area"]["offset"] = "0".into(),
        "inside the metadata",
    );
    metadata_error(
        |j| j["keyslots"]["0"]["area"]["offset"] = "16777216".into(),
        "overflows the keyslots area",
    );
    metadata_error(
        |j| {
            let mut k = j["keyslots"]["0"].clone();
            k["area"]["offset"] = "36864".into();
            j["keyslots"]["1"] = k;
            j["digests"]["0"]["keyslots"] = json!(["0", "1"]);
        },
        "overlap",
    );
    // cryptsetup's rule: a luks2 keyslot belongs to exactly one digest.
    metadata_error(
        |j| j["digests"]["0"]["keyslots"] = json!([]),
        "assigned to 0 digests",
    );
    metadata_error(
        |j| {
            let d = j["digests"]["0"].clone();
            j["digests"]["1"] = d;
            j["digests"]["1"]["segments"] = json!([]);
        },
        "assigned to 2 digests",
    );
    metadata_error(
        |j| j["segments"]["0"]["offset"] = "1048576".into(),
        "overlaps the data segment",
    );
    metadata_error(
        |j| j["config"]["json_size"] = "999999999999".into(),
        "json_size",
    );
    metadata_error(
        |j| j["config"]["keyslots_size"] = "18446744073709551615".into(),
        "keyslots_size",
    );
    metadata_error(
        |j| j["config"]["keyslots_size"] = "-1".into(),
        "number string",
    );
    metadata_error(
        |j| j["digests"]["0"]["keyslots"] = json!(["0", "3"]),
        "missing keyslot 3",
    );
    metadata_error(
        |j| j["digests"]["0"]["segments"] = json!(["7"]),
        "missing segment 7",
    );
    metadata_error(
        |j| j["digests"]["0"]["segments"] = json!([]),
        "not assigned to a key digest",
    );
    metadata_error(
        |j| j["keyslots"]["0"]["af"]["stripes"] = 4_000_000_000u32.into(),
        "larger than its area",
    );
    metadata_error(|j| j["keyslots"]["0"]["key_size"] = (-1).into(), "key_size");
    metadata_error(
        |j| j["keyslots"]["0"]["kdf"]["salt"] = "!!".into(),
        "base64",
    );
    metadata_error(|j| j["keyslots"]["0"]["area"] = json!([]), "not an object");
    metadata_error(
        |j| j["segments"]["0"]["sector_size"] = 1000.into(),
        "sector size",
    );
    metadata_error(|j| j["segments"]["0"]["size"] = "12".into(), "aligned");
    metadata_error(
        |j| {
            let v = j["keyslots"]["0"].clone();
            j["keyslots"]["00"] = v;
        },
        "keyslot id",
    );
    metadata_error(
        |j| j["tokens"]["0"] = json!({"type": "x", "keyslots": ["9"]}),
        "missing keyslot 9",
    );
    metadata_error(|j| *j = json!([1, 2]), "does not start with '{'");
    metadata_error(
        |j| {
            j.as_object_mut()
                .unwrap()
                .shift_remove("config")
                .map(|_| ())
                .unwrap()
        },
        "config",
    );

    let (mut dev, h) = fresh();
    put_json_text(&mut dev, &h, b"{\"keyslots\": {");
    assert!(
        format!("{}", Luks2Header::read(&mut dev).unwrap_err()).contains("JSON does not parse")
    );
    let deep = "[".repeat(10_000);
    put_json_text(&mut dev, &h, deep.as_bytes());
    assert!(Luks2Header::read(&mut dev).is_err());
}

#[test]
fn unknown_mandatory_requirement_refuses() {
    let (mut dev, h) = fresh();
    let mut j = h.json().clone();
    j["config"]["requirements"] = json!({"mandatory": ["online-reencrypt-v4", "future-thing"]});
    put_json_text(&mut dev, &h, &serde_json::to_vec(&j).unwrap());
    let e = Luks2Header::read(&mut dev).unwrap_err();
    assert!(e.to_string().contains("future-thing"), "{e}");
    let mut r = Luks2Header::read_ignoring_requirements(&mut dev).unwrap();
    assert_eq!(r.requirements(), ["online-reencrypt-v4", "future-thing"]);
    assert_eq!(
        r.unmet_requirements(),
        Some(
            &[
                "online-reencrypt-v4".to_string(),
                "future-thing".to_string()
            ][..]
        )
    );
    // As cryptsetup: the passphrase is checked and the volume key read...
    let (slot, vk) = r.unlock(&mut dev, b"pass0", None).unwrap();
    assert_eq!(slot, 0);
    assert!(r.verify_volume_key(&vk).unwrap());
    // ...but the volume is not mapped, and nothing is changed but keyslots destroyed.
    let size = dev.size().unwrap();
    assert!(r.unlock_segments(&mut dev, b"pass0", None, size).is_err());
    let before = dev.to_vec();
    let e = r.set_label(&mut dev, Some("x")).unwrap_err();
    assert!(e.to_string().contains("future-thing"), "{e}");
    assert!(
        r.set_uuid(&mut dev, "12345678-1234-1234-1234-123456789abc")
            .is_err()
    );
    assert!(dev.to_vec() == before, "a refused change wrote nothing");
    r.kill_keyslot(&mut dev, 0).unwrap();
    let again = Luks2Header::read_ignoring_requirements(&mut dev).unwrap();
    assert_eq!(again.requirements(), r.requirements(), "requirements kept");
    assert!(again.keyslots().iter().all(|k| !k.active));
}

#[test]
fn reencryption_requirement_needs_its_metadata() {
    // A known reencryption requirement without the reencrypt keyslot and backup segments
    // is broken metadata, not a volume to open with one key.
    let (mut dev, h) = fresh();
    let mut j = h.json().clone();
    j["config"]["requirements"] = json!({"mandatory": ["online-reencrypt-v2"]});
    put_json_text(&mut dev, &h, &serde_json::to_vec(&j).unwrap());
    let e = Luks2Header::read(&mut dev).unwrap_err();
    assert!(e.to_string().contains("reencrypt keyslot"), "{e}");
    j["config"]["requirements"] = json!({"mandatory": ["online-reencrypt"]});
    put_json_text(&mut dev, &h, &serde_json::to_vec(&j).unwrap());
    let e = Luks2Header::read(&mut dev).unwrap_err();
    assert!(e.to_string().contains("cryptsetup repair"), "{e}");
}

#[test]
fn unsupported_algorithms_are_kept_not_fatal() {
    let (mut dev, h) = fresh();
    let mut j = h.json().clone();
    let mut k = j["keyslots"]["0"].clone();
    k["area"]["offset"] = "163840".into();
    k["area"]["encryption"] = "anubis-xts-plain64".into();
    j["keyslots"]["1"] = k;
    j["digests"]["0"]["keyslots"] = json!(["0", "1"]);
    put_json_text(&mut dev, &h, &serde_json::to_vec(&j).unwrap());
    let r = Luks2Header::read(&mut dev).unwrap();
    assert_eq!(r.keyslots().len(), 2);
    assert_eq!(r.keyslots()[1].kdf, None);
    assert_eq!(r.unlock(&mut dev, b"pass0", None).unwrap().0, 0);
    assert!(matches!(
        r.unlock(&mut dev, b"pass0", Some(1)),
        Err(Error::Luks2(Luks2Error::Unsupported(_)))
    ));
}

#[test]
fn unknown_fields_and_tokens_survive_add_and_kill() {
    let (mut dev, h) = fresh();
    let mut j = h.json().clone();
    j["x-vendor"] = json!({"keep": [1, 2, {"deep": "yes"}]});
    j["keyslots"]["0"]["x-extra"] = "slot-extra".into();
    j["segments"]["0"]["x-seg"] = 42.into();
    j["tokens"]["0"] = json!({"type": "luks2-keyring", "keyslots": ["0"], "key_description": "k"});
    j["tokens"]["3"] = json!({"type": "systemd-tpm2", "keyslots": [], "tpm2-blob": "AAAA"});
    put_json_text(&mut dev, &h, &serde_json::to_vec(&j).unwrap());
    let mut h = Luks2Header::read(&mut dev).unwrap();
    assert_eq!(h.tokens().len(), 2);

    let s = h
        .add_keyslot(&mut dev, &vk(), b"pass1", None, &fast_kdf())
        .unwrap();
    assert_eq!(s, 1);
    assert_eq!(h.keyslots()[1].area_offset, 32768 + 131072);
    let r = Luks2Header::read(&mut dev).unwrap();
    assert_eq!(r.json()["x-vendor"], j["x-vendor"]);
    assert_eq!(r.json()["keyslots"]["0"]["x-extra"], "slot-extra");
    assert_eq!(r.json()["segments"]["0"]["x-seg"], 42);
    assert_eq!(r.json()["tokens"], j["tokens"]);
    assert_eq!(r.json()["digests"]["0"]["keyslots"], json!(["0", "1"]));

    h.kill_keyslot(&mut dev, 0).unwrap();
    let r = Luks2Header::read(&mut dev).unwrap();
    assert_eq!(r.json()["x-vendor"], j["x-vendor"]);
    assert_eq!(r.json()["tokens"]["0"]["keyslots"], json!([]));
    assert_eq!(r.json()["tokens"]["3"], j["tokens"]["3"]);
    assert_eq!(r.json()["digests"]["0"]["keyslots"], json!(["1"]));
    assert!(r.json()["keyslots"].get("0").is_none());
    // The killed area is wiped.
    assert!(!dev.to_vec()[32768..32768 + 131072].iter().all(|&b| b == 0));
    assert!(matches!(
        r.unlock(&mut dev, b"pass0", None),
        Err(Error::WrongPassphrase)
    ));
    assert_eq!(r.unlock(&mut dev, b"pass1", None).unwrap().0, 1);
    assert_eq!(r.key_len(), 32);

    // The freed gap is reused first, as cryptsetup does.
    let mut h = r;
    assert_eq!(
        h.add_keyslot(&mut dev, &vk(), b"pass2", Some(7), &fast_kdf())
            .unwrap(),
        7
    );
    assert_eq!(
        h.keyslots().iter().find(|k| k.id == 7).unwrap().area_offset,
        32768
    );
    assert!(matches!(
        h.add_keyslot(&mut dev, &vk(), b"x", Some(7), &fast_kdf()),
        Err(Error::Keyslot(_))
    ));
    assert!(matches!(
        h.add_keyslot(&mut dev, &[1u8; 32], b"x", None, &fast_kdf()),
        Err(Error::Luks2(Luks2Error::VolumeKeyMismatch))
    ));
    assert!(h.kill_keyslot(&mut dev, 9).is_err());
}

#[test]
fn keyslots_area_fills_up() {
    let mut o = opts();
    o.luks2_keyslots_size = Some(3 * 131072);
    let mut dev = MemStorage::new(17 * MIB);
    let mut h = Luks2Header::format(&mut dev, &o, &vk(), b"p").unwrap();
    h.add_keyslot(&mut dev, &vk(), b"q", None, &fast_kdf())
        .unwrap();
    h.add_keyslot(&mut dev, &vk(), b"r", None, &fast_kdf())
        .unwrap();
    assert!(matches!(
        h.add_keyslot(&mut dev, &vk(), b"s", None, &fast_kdf()),
        Err(Error::Luks2(Luks2Error::NoKeyslotSpace))
    ));
    // A change with the area full rewrites the keyslot in its own area, as cryptsetup
    // does (slot number kept, the other keyslots untouched).
    let slots_before: Vec<u32> = h.keyslots().iter().map(|k| k.id).collect();
    let changed = h
        .change_keyslot(&mut dev, b"r", b"s", None, None, &fast_kdf())
        .unwrap();
    assert_eq!(changed, 2);
    let r = Luks2Header::read(&mut dev).unwrap();
    let slots_after: Vec<u32> = r.keyslots().iter().map(|k| k.id).collect();
    assert_eq!(slots_before, slots_after);
    assert!(r.unlock(&mut dev, b"r", None).is_err());
    assert_eq!(r.unlock(&mut dev, b"s", None).unwrap().0, 2);
    assert_eq!(r.unlock(&mut dev, b"p", None).unwrap().0, 0);
    assert_eq!(r.unlock(&mut dev, b"q", None).unwrap().0, 1);
}

#[test]
fn change_keyslot_swaps_atomically() {
    let (mut dev, mut h) = fresh();
    let mut j = h.json().clone();
    j["tokens"]["0"] = json!({"type": "t", "keyslots": ["0"]});
    put_json_text(&mut dev, &h, &serde_json::to_vec(&j).unwrap());
    h = Luks2Header::read(&mut dev).unwrap();
    let new = h
        .change_keyslot(&mut dev, b"pass0", b"new", None, None, &fast_kdf())
        .unwrap();
    assert_eq!(new, 1);
    let r = Luks2Header::read(&mut dev).unwrap();
    assert_eq!(r.keyslots().len(), 1);
    assert_eq!(r.json()["tokens"]["0"]["keyslots"], json!(["1"]));
    assert!(r.unlock(&mut dev, b"pass0", None).is_err());
    assert_eq!(r.unlock(&mut dev, b"new", None).unwrap().0, 1);
    // Same slot number kept when asked.
    let mut h = r;
    assert_eq!(
        h.change_keyslot(&mut dev, b"new", b"newer", Some(1), Some(1), &fast_kdf())
            .unwrap(),
        1
    );
    assert_eq!(h.unlock(&mut dev, b"newer", Some(1)).unwrap().0, 1);
    assert!(
        h.change_keyslot(&mut dev, b"bad", b"x", None, None, &fast_kdf())
            .is_err()
    );
}

#[test]
fn labels_flags_and_priorities() {
    let (mut dev, mut h) = fresh();
    h.set_label(&mut dev, Some("data")).unwrap();
    h.set_subsystem(&mut dev, Some("backup")).unwrap();
    h.set_config_flags(
        &mut dev,
        &["allow-discards", "no-read-workqueue", "allow-discards"],
    )
    .unwrap();
    let r = Luks2Header::read(&mut dev).unwrap();
    assert_eq!((r.label(), r.subsystem(), r.seqid()), ("data", "backup", 4));
    assert_eq!(r.config_flags(), ["allow-discards", "no-read-workqueue"]);
    assert!(h.set_label(&mut dev, Some(&"l".repeat(48))).is_err());
    assert_eq!(Luks2Header::read(&mut dev).unwrap().label(), "data");
    h.set_config_flags(&mut dev, &[]).unwrap();
    h.set_label(&mut dev, None).unwrap();
    let r = Luks2Header::read(&mut dev).unwrap();
    assert!(r.config_flags().is_empty() && r.json()["config"].get("flags").is_none());
    assert_eq!(r.label(), "");

    // Priorities: "ignore" slots are skipped unless named, "prefer" ones tried first.
    let mut h = r;
    h.add_keyslot(&mut dev, &vk(), b"pass0", None, &fast_kdf())
        .unwrap();
    let mut j = h.json().clone();
    j["keyslots"]["0"]["priority"] = 0.into();
    j["keyslots"]["1"]["priority"] = 2.into();
    put_json_text(&mut dev, &h, &serde_json::to_vec(&j).unwrap());
    let r = Luks2Header::read(&mut dev).unwrap();
    assert_eq!(r.keyslot_priority(0), Some(Priority::Ignore));
    assert_eq!(r.unlock(&mut dev, b"pass0", None).unwrap().0, 1);
    assert_eq!(r.unlock(&mut dev, b"pass0", Some(0)).unwrap().0, 0);
}

/// Records writes so that every crash point of an operation can be replayed.
#[derive(Default)]
struct Recorder {
    dev: MemStorage,
    writes: std::sync::Mutex<Vec<(u64, Vec<u8>)>>,
}

impl Storage for Recorder {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.dev.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let mut writes = self.writes.lock().unwrap();
        writes.push((offset, buf.to_vec()));
        self.dev.write_at(buf, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn size(&self) -> std::io::Result<u64> {
        self.dev.size()
    }
}

#[test]
fn every_crash_point_leaves_old_or_new_keyslots() {
    type Op = fn(&mut Luks2Header, &mut Recorder);
    let ops: [(Op, &[u32], &[u32]); 3] = [
        (
            |h, d| {
                h.add_keyslot(d, &vk(), b"pass1", None, &fast_kdf())
                    .unwrap();
            },
            &[0],
            &[0, 1],
        ),
        (|h, d| h.kill_keyslot(d, 0).unwrap(), &[0, 1], &[1]),
        (
            |h, d| {
                h.change_keyslot(d, b"pass0", b"pass2", Some(0), Some(0), &fast_kdf())
                    .unwrap();
            },
            &[0, 1],
            &[0, 1],
        ),
    ];
    for (i, (op, old, new)) in ops.into_iter().enumerate() {
        let (mut base, mut h) = fresh();
        if i > 0 {
            h.add_keyslot(&mut base, &vk(), b"pass1", None, &fast_kdf())
                .unwrap();
        }
        let mut rec = Recorder {
            dev: base.clone(),
            writes: Default::default(),
        };
        op(&mut h, &mut rec);
        let writes = rec.writes.into_inner().unwrap();
        let slots = |d: &mut MemStorage| {
            let r = Luks2Header::read(d).unwrap();
            // Every listed slot must still open with its passphrase.
            for k in r.keyslots() {
                let pass: &[u8] = match k.id {
                    1 => b"pass1",
                    _ if i == 2 && r.seqid() == h.seqid() => b"pass2",
                    _ => b"pass0",
                };
                assert!(
                    r.unlock(d, pass, Some(k.id)).is_ok(),
                    "op {i} slot {}",
                    k.id
                );
            }
            r.keyslots().iter().map(|k| k.id).collect::<Vec<u32>>()
        };
        for n in 0..=writes.len() {
            for torn in [false, true] {
                let mut d = base.clone();
                for (off, data) in &writes[..n] {
                    d.write_at(data, *off).unwrap();
                }
                if torn && let Some((off, data)) = writes.get(n) {
                    d.write_at(&data[..data.len() / 2], *off).unwrap();
                }
                let got = slots(&mut d);
                assert!(
                    got == old || got == new,
                    "op {i} after {n} writes (torn {torn}): {got:?}"
                );
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    #[test]
    fn mutated_json_never_panics(pos in 0usize..2000, byte in 0u8..128, cut in 0usize..2000) {
        let (mut dev, h) = fresh_cached();
        let mut text = serde_json::to_vec(h.json()).unwrap();
        let p = pos % text.len();
        text[p] = byte.max(1);
        text.truncate(text.len() - cut % 4);
        put_json_text(&mut dev, &h, &text);
        if let Ok(r) = Luks2Header::read(&mut dev) {
            let _ = r.unlock(&mut dev, b"pass0", None);
            let _ = r.keyslots();
        }
    }
}

fn fresh_cached() -> (MemStorage, Luks2Header) {
    use std::sync::OnceLock;
    static CELL: OnceLock<(MemStorage, Luks2Header)> = OnceLock::new();
    CELL.get_or_init(fresh).clone()
}

/// A data segment with dm-integrity (issue 38) loads with what the volume layer needs to
/// serve it; what it cannot serve (journal encryption, a MAC it has no code for) is refused
/// at load instead of decrypting garbage.
#[test]
fn integrity_segments_load_or_are_refused() {
    let with = |enc: &str, kind: &str, journal: &str| {
        with_json(|j| {
            j["segments"]["0"]["encryption"] = json!(enc);
            j["segments"]["0"]["integrity"] = json!({
                "type": kind,
                "journal_encryption": journal,
                "journal_integrity": "none"
            })
        })
    };
    let h = with("aes-xts-plain64", "hmac(sha256)", "none").unwrap();
    let i = h.integrity().expect("integrity");
    assert_eq!(
        (i.encryption.as_str(), i.kind.as_str()),
        ("aes-xts-plain64", "hmac(sha256)")
    );
    let mut dev = MemStorage::new(17 * MIB);
    assert!(h.convert_to_luks1(&mut dev).is_err());
    with("aes-gcm-random", "aead", "none").unwrap();
    for (enc, kind, journal) in [
        ("aes-xts-plain64", "hmac(sha256)", "cbc(aes)"),
        ("aes-xts-plain64", "hmac(md5)", "none"),
        ("aes-cbc-essiv:sha256", "aead", "none"),
    ] {
        let err = with(enc, kind, journal).unwrap_err();
        assert!(err.to_string().contains("integrity"), "{enc} {kind}: {err}");
    }
}

/// Regression (damaged-header suite): a readable primary header of an unknown version is
/// not bypassed by using the secondary copy (cryptsetup refuses such devices too).
#[test]
fn unknown_primary_version_is_not_bypassed() {
    let (mut dev, _) = fresh();
    dev.edit(|d| d[7] = 3);
    // The secondary copy is intact, and Luks2Header::read (used by repair) still finds it.
    assert!(Luks2Header::read(&mut dev).is_ok());
    let err = crate::load_header(&mut dev).unwrap_err();
    assert!(err.to_string().contains("version 3"), "{err}");
}

/// Whether clients may write into a step's rewritten pieces comes from how that step's
/// crash would be recovered, read from its own metadata: only checksums keep such
/// writes; a journal, a data shift, a data move and `none` hold them to the step's end.
#[test]
fn step_recovery_decides_client_writes_into_rewritten_pieces() {
    use super::reencrypt::StepRecovery;
    let req = |r: ResilienceRequest| ReencryptRequest {
        cipher: None,
        key_len: None,
        sector_size: None,
        resilience: r,
        kdf: fast_kdf(),
        keyslot_encryption: None,
    };
    let first_step = |dev: MemStorage, mut h: Luks2Header| {
        let size = dev.size().unwrap();
        let job = h
            .reencrypt_job(&mut dev.clone(), &dev, size, b"pass0", None, Some(MIB))
            .unwrap()
            .expect("a job to run");
        job.next_step(&h).unwrap().recovery
    };
    for (r, want) in [
        (
            ResilienceRequest::Checksum(HashAlg::Sha256),
            StepRecovery::Checksums,
        ),
        (ResilienceRequest::Journal, StepRecovery::Journal),
        (ResilienceRequest::None, StepRecovery::Nothing),
    ] {
        let (mut dev, mut h) = fresh();
        let size = dev.size().unwrap();
        h.reencrypt_init(&mut dev, size, b"pass0", None, &req(r))
            .unwrap();
        assert_eq!(first_step(dev, h), want, "{r:?}");
        assert_eq!(
            want.keeps_rewritten_writes(),
            want == StepRecovery::Checksums
        );
    }
    // A key change moving the data up, and a data move (header at the head).
    let (mut dev, mut h) = fresh();
    let size = dev.size().unwrap();
    let r = req(ResilienceRequest::Checksum(HashAlg::Sha256));
    h.reencrypt_shift_init(&mut dev, size, b"pass0", None, &r, MIB / 4)
        .unwrap();
    assert_eq!(first_step(dev, h), StepRecovery::Shift);
    let mut dev = MemStorage::new(16 * MIB);
    let h = Luks2Header::encrypt_shift_init(&mut dev, 4 * MIB, b"pass0", &r).unwrap();
    assert_eq!(first_step(dev, h), StepRecovery::Shift);
    assert!(!StepRecovery::Shift.keeps_rewritten_writes());
}

#[test]
fn json_area_rules_are_cryptsetups() {
    // The object starts at the area's first byte, and nothing but NULs follows it.
    let area_error = |text: &[u8], needle: &str| {
        let (mut dev, h) = fresh();
        put_json_text(&mut dev, &h, text);
        match luks2_err(Luks2Header::read(&mut dev)) {
            Luks2Error::NoValidCopy { primary, .. } => {
                assert!(primary.contains(needle), "{primary} (want {needle})")
            }
            e => panic!("unexpected {e:?}"),
        }
    };
    let (_, h) = fresh();
    let json = serde_json::to_vec(h.json()).unwrap();
    let mut leading = b" ".to_vec();
    leading.extend_from_slice(&json);
    area_error(&leading, "does not start with '{'");
    let mut after_nul = json.clone();
    after_nul.extend_from_slice(b"\0\0garbage");
    area_error(&after_nul, "other than NUL after the JSON");
    let mut after_object = json.clone();
    after_object.extend_from_slice(b" ");
    area_error(&after_object, "other than NUL after the JSON");
    // The same JSON followed by NULs only is fine.
    let (mut dev, h) = fresh();
    put_json_text(&mut dev, &h, &json);
    assert!(Luks2Header::read(&mut dev).is_ok());
}

#[test]
fn unbound_keys_have_their_own_digest_and_never_open_the_data() {
    let (mut dev, mut h) = fresh();
    let key = [0x42u8; 9];
    let slot = h
        .add_unbound_keyslot(&mut dev, &key, b"unbound", Some(3), &fast_kdf())
        .unwrap();
    assert_eq!(slot, 3);
    let r = Luks2Header::read(&mut dev).unwrap();
    assert_eq!(r.unbound_keyslots(), vec![3]);
    let d = &r.json()["digests"];
    assert_eq!(d.as_object().unwrap().len(), 2);
    assert_eq!(d["1"]["segments"], json!([]));
    assert_eq!(d["1"]["keyslots"], json!(["3"]));
    // Its passphrase gives its key, and not the volume.
    let (s, k) = r.open_unbound(&mut dev, b"unbound", None).unwrap();
    assert_eq!((s, &k[..]), (3, &key[..]));
    assert!(matches!(
        r.unlock(&mut dev, b"unbound", None),
        Err(Error::WrongPassphrase)
    ));
    assert!(r.open_unbound(&mut dev, b"pass0", None).is_err());
    assert!(r.open_unbound(&mut dev, b"unbound", Some(0)).is_err());
    // Changed, it stays unbound under the same digest; killed, its digest goes too.
    let mut r = r;
    let s = r
        .change_unbound_keyslot(&mut dev, b"unbound", b"other", 3, Some(3), &fast_kdf())
        .unwrap();
    assert_eq!(s, 3);
    assert_eq!(
        &r.open_unbound(&mut dev, b"other", Some(3)).unwrap().1[..],
        &key[..]
    );
    r.kill_keyslot(&mut dev, 3).unwrap();
    let r = Luks2Header::read(&mut dev).unwrap();
    assert!(r.unbound_keyslots().is_empty());
    assert_eq!(r.json()["digests"].as_object().unwrap().len(), 1);
}

#[test]
fn keyslot_encryption_and_opening_by_volume_key() {
    let (mut dev, mut h) = fresh();
    assert!(h.set_keyslot_encryption("aes-cbc-plain64", 7).is_err());
    h.set_keyslot_encryption("aes-cbc-plain64", 16).unwrap();
    let slot = h
        .add_keyslot(&mut dev, &vk(), b"second", None, &fast_kdf())
        .unwrap();
    let r = Luks2Header::read(&mut dev).unwrap();
    let area = &r.json()["keyslots"][slot.to_string()]["area"];
    assert_eq!(area["encryption"], json!("aes-cbc-plain64"));
    assert_eq!(area["key_size"], json!(16));
    assert_eq!(r.unlock(&mut dev, b"second", None).unwrap().0, slot);
    // The volume key alone lays out the data; another key is a wrong passphrase.
    let segs = r.segments_from_volume_key(&vk(), 32 * MIB).unwrap();
    assert_eq!(segs.len(), 1);
    assert_eq!(&segs[0].key[..], &vk()[..]);
    let mut other = vk();
    other[0] ^= 1;
    assert!(matches!(
        r.segments_from_volume_key(&other, 32 * MIB),
        Err(Error::WrongPassphrase)
    ));
}
