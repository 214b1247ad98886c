//! Keyslot key material: derive, split, encrypt into the area (and back), area allocation,
//! and the JSON object of a new keyslot.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use cryptblk_crypto::{
    CipherSpec, HashAlg, IvOptions, Kdf, SecretBytes, SectorCipher, af_merge, af_split,
    random_bytes,
};
use serde_json::{Value, json};

use super::model::{Luks2Keyslot, Model, STRIPES};
use crate::{Result, Storage};

/// Salt length of keyslot KDFs and digests (cryptsetup's `LUKS_SALTSIZE`).
pub(super) const SALT_LEN: usize = 32;

/// Bytes of AF material for a key: `key_len * stripes`, in whole 512-byte sectors.
pub(super) fn material_len(key_len: usize, stripes: u32) -> usize {
    (key_len * stripes as usize).div_ceil(512) * 512
}

/// Size cryptsetup reserves for a keyslot area: the material rounded up to 4 KiB.
pub(super) fn area_size_for(key_len: usize) -> u64 {
    ((key_len as u64) * STRIPES as u64).div_ceil(4096) * 4096
}

/// First gap (lowest offset) in the keyslots area that holds `len` bytes, as cryptsetup
/// searches it: start after the two header copies, skip past each used area in order.
pub(super) fn find_area_gap(model: &Model, hdr_size: u64, len: u64) -> Option<u64> {
    let end = 2 * hdr_size + model.keyslots_size;
    let mut off = 2 * hdr_size;
    for (a_off, a_len) in used_areas(model) {
        if off < a_off && off + len <= a_off {
            break;
        }
        off = off.max(a_off + a_len);
    }
    (off + len <= end).then_some(off)
}

/// The keyslots' areas, `(offset, size)` in offset order.
fn used_areas(model: &Model) -> Vec<(u64, u64)> {
    let mut used: Vec<(u64, u64)> = model
        .keyslots
        .values()
        .map(|k| (k.area_offset, k.area_size))
        .collect();
    used.sort();
    used
}

/// The largest free stretch of the keyslots area, `(offset, size)` (where cryptsetup puts
/// the reencrypt keyslot's checksums or journal).
pub(super) fn largest_area_gap(model: &Model, hdr_size: u64) -> Option<(u64, u64)> {
    let end = 2 * hdr_size + model.keyslots_size;
    let mut best: Option<(u64, u64)> = None;
    let mut off = 2 * hdr_size;
    for (a_off, a_len) in used_areas(model).into_iter().chain([(end, 0)]) {
        if a_off > off && best.is_none_or(|b| a_off - off > b.1) {
            best = Some((off, a_off - off));
        }
        off = off.max(a_off + a_len);
    }
    best
}

/// The cipher that encrypts the keyslot area, on 512-byte sectors numbered from the area start.
fn area_cipher(spec: CipherSpec, key: &[u8]) -> Result<SectorCipher> {
    Ok(SectorCipher::new(spec, key, 512, IvOptions::default())?)
}

/// Recovers the key stored in a slot with `passphrase` (not yet checked against a digest).
pub(super) fn open(
    dev: &mut dyn Storage,
    ks: &Luks2Keyslot,
    key_size: usize,
    area_offset: u64,
    passphrase: &[u8],
) -> Result<SecretBytes> {
    let mut derived = SecretBytes::zeroed(ks.area_key_size);
    ks.kdf.derive(passphrase, &ks.salt, &mut derived)?;
    let mut material = SecretBytes::zeroed(material_len(key_size, ks.stripes));
    dev.read_at(&mut material, area_offset)?;
    area_cipher(ks.area_cipher, &derived)?.decrypt(0, &mut material)?;
    Ok(af_merge(&material, key_size, ks.stripes, ks.af_hash)?)
}

/// Everything a new keyslot needs besides the passphrase and key.
pub(super) struct NewKeyslot<'a> {
    pub kdf: Kdf,
    pub af_hash: HashAlg,
    pub area_cipher: &'a str,
    pub area_key_size: usize,
    pub area_offset: u64,
    pub area_size: u64,
}

/// Writes the encrypted, split key into the area (not synced) and returns the slot's JSON,
/// with fields in cryptsetup's order.
pub(super) fn create(
    dev: &mut dyn Storage,
    p: &NewKeyslot<'_>,
    volume_key: &[u8],
    passphrase: &[u8],
) -> Result<Value> {
    let (material, json) = prepare(p, volume_key, passphrase)?;
    dev.write_at(&material, p.area_offset)?;
    Ok(json)
}

/// What [`create`] writes (the encrypted key material, for `p.area_offset`) and the
/// keyslot's JSON, nothing written: for a keyslot rewritten in its own area, whose
/// metadata must be checked before its old material is overwritten.
pub(super) fn prepare(
    p: &NewKeyslot<'_>,
    volume_key: &[u8],
    passphrase: &[u8],
) -> Result<(SecretBytes, Value)> {
    let spec = CipherSpec::parse(p.area_cipher)?;
    let mut salt = [0u8; SALT_LEN];
    random_bytes(&mut salt)?;
    let mut derived = SecretBytes::zeroed(p.area_key_size);
    p.kdf.derive(passphrase, &salt, &mut derived)?;
    let split = af_split(volume_key, STRIPES, p.af_hash)?;
    let mut material = SecretBytes::zeroed(material_len(volume_key.len(), STRIPES));
    material[..split.len()].copy_from_slice(&split);
    area_cipher(spec, &derived)?.encrypt(0, &mut material)?;
    debug_assert!(material.len() as u64 <= p.area_size);

    let mut kdf = serde_json::Map::new();
    kdf.insert("type".into(), p.kdf.type_name().into());
    match p.kdf {
        Kdf::Pbkdf2 { hash, iterations } => {
            kdf.insert("hash".into(), hash.name().into());
            kdf.insert("iterations".into(), iterations.into());
        }
        Kdf::Argon2 {
            time,
            memory_kib,
            parallel,
            ..
        } => {
            kdf.insert("time".into(), time.into());
            kdf.insert("memory".into(), memory_kib.into());
            kdf.insert("cpus".into(), parallel.into());
        }
    }
    kdf.insert("salt".into(), B64.encode(salt).into());
    let json = json!({
        "type": "luks2",
        "key_size": volume_key.len(),
        "af": { "type": "luks1", "stripes": STRIPES, "hash": p.af_hash.name() },
        "area": {
            "type": "raw",
            "offset": p.area_offset.to_string(),
            "size": p.area_size.to_string(),
            "encryption": p.area_cipher,
            "key_size": p.area_key_size,
        },
        "kdf": Value::Object(kdf),
    });
    Ok((material, json))
}

/// Overwrites a keyslot area with random bytes (not synced).
pub(super) fn wipe_area(dev: &mut dyn Storage, offset: u64, len: u64) -> Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        random_bytes(&mut buf[..n])?;
        dev.write_at(&buf[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}
