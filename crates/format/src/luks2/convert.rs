//! `convert --type luks1|luks2`: the same volume key, keyslots and data under the other
//! header version, as cryptsetup converts them (lib/luks2/luks2_luks1_convert.c): a LUKS1
//! keyslot becomes a `luks2` keyslot with PBKDF2 and the LUKS1 anti-forensic split, its
//! material moved from 4 KiB to 32 KiB (behind LUKS2's two 16 KiB header copies); the
//! other way only a header LUKS1 can express converts. The material is moved in one
//! write and the new header written over the old one, as cryptsetup does: a power cut in
//! between loses the keyslots (take a `header-backup` first).

use super::binary::{BinHeader, SALT_LEN};
use super::model::Model;
use super::{Luks2Error, Luks2Header, keyslot};
use crate::luks1::{Luks1Header, Luks1Keyslot, NUM_KEYSLOTS, Phdr, STRIPES};
use crate::{Error, LuksHeader, Result, Storage};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Map, Value, json};
use zeroize::Zeroizing;

/// LUKS1 keyslot material starts at 4 KiB; LUKS2's at 32 KiB (two 16 KiB header copies).
const LUKS1_AREAS: u64 = 4096;
const LUKS2_AREAS: u64 = 2 * HDR_16K;
const HDR_16K: u64 = 16384;
/// Bytes the keyslot material moves up (LUKS1 to LUKS2) or down.
const SHIFT: u64 = LUKS2_AREAS - LUKS1_AREAS;

fn refuse(why: impl Into<String>) -> Error {
    Luks2Error::Unsupported(why.into()).into()
}

/// Moves `len` bytes of keyslot material from `from` to `to` (one read, one write,
/// synced), as cryptsetup's `move_keyslot_areas`.
fn move_areas(dev: &mut dyn Storage, from: u64, to: u64, len: u64) -> Result<()> {
    let mut buf = Zeroizing::new(vec![0u8; len as usize]);
    dev.read_at(&mut buf, from)?;
    dev.write_at(&buf, to)?;
    dev.sync()?;
    Ok(())
}

fn cipher_of(p: &Phdr) -> String {
    if p.cipher_mode.is_empty() {
        p.cipher_name.clone()
    } else {
        format!("{}-{}", p.cipher_name, p.cipher_mode)
    }
}

/// The LUKS2 metadata of a LUKS1 header whose keyslots area will be `keyslots_size`.
fn luks1_metadata(p: &Phdr, keyslots_size: u64) -> Value {
    let cipher = cipher_of(p);
    let mut keyslots = Map::new();
    let mut active = Vec::new();
    for (i, s) in p.slots.iter().enumerate().filter(|(_, s)| s.active) {
        let area = crate::luks1::af_sectors(p.key_bytes as usize, s.stripes) * 512;
        keyslots.insert(
            i.to_string(),
            json!({
                "type": "luks2",
                "key_size": p.key_bytes,
                "kdf": {"type": "pbkdf2", "hash": p.hash_spec, "iterations": s.iterations,
                        "salt": B64.encode(s.salt)},
                "af": {"type": "luks1", "hash": p.hash_spec, "stripes": STRIPES},
                "area": {"type": "raw", "encryption": cipher, "key_size": p.key_bytes,
                         "offset": (u64::from(s.key_material_offset) * 512 + SHIFT).to_string(),
                         "size": area.next_multiple_of(4096).to_string()},
            }),
        );
        active.push(json!(i.to_string()));
    }
    json!({
        "keyslots": keyslots,
        "tokens": {},
        "segments": {"0": {"type": "crypt",
                           "offset": (u64::from(p.payload_offset) * 512).to_string(),
                           "iv_tweak": "0", "size": "dynamic", "encryption": cipher,
                           "sector_size": 512}},
        "digests": {"0": {"type": "pbkdf2", "keyslots": active, "segments": ["0"],
                          "hash": p.hash_spec, "salt": B64.encode(p.mk_digest_salt),
                          "digest": B64.encode(p.mk_digest),
                          "iterations": p.mk_digest_iterations}},
        "config": {"json_size": (HDR_16K - 4096).to_string(),
                   "keyslots_size": (keyslots_size - keyslots_size % 4096).to_string()},
    })
}

impl Luks2Header {
    /// Converts the LUKS1 volume on `dev` (header `v1`) to LUKS2 in place (`cryptsetup
    /// convert --type luks2`): same UUID, volume key, passphrases and data; the keyslot
    /// material moves from 4 KiB to 32 KiB, which must still end before the data (or, for a
    /// detached header, inside the header device).
    pub fn convert_from_luks1(dev: &mut dyn Storage, v1: &Luks1Header) -> Result<Luks2Header> {
        let p = v1.phdr();
        let first = p.slots.iter().map(|s| s.key_material_offset).min();
        if first != Some((LUKS1_AREAS / 512) as u32) {
            return Err(refuse(
                "the LUKS1 keyslot material does not start at 4 KiB (cryptsetup converts only \
                 that layout)",
            ));
        }
        let luks1_size = (p.end_sectors() * 512).next_multiple_of(4096);
        let mut max = u64::from(p.payload_offset) * 512;
        if max == 0 {
            max = dev.size()?;
        }
        let mut magic = [0u8; 8];
        if dev.size()? >= luks1_size + 8 {
            dev.read_at(&mut magic, luks1_size)?;
            if &magic == b"LUKSMETA" {
                return Err(refuse(
                    "Unable to convert header with LUKSMETA additional metadata.",
                ));
            }
        }
        if p.payload_offset == 0 && max < luks1_size + SHIFT {
            // A detached header grows to hold the moved keyslots, as cryptsetup's
            // fallocate does; a device that cannot grow (a block device) refuses this
            // write before anything else is touched.
            dev.write_at(&[0], luks1_size + SHIFT - 1).map_err(|e| {
                Error::InvalidOption(format!(
                    "Unable to move keyslot area. Not enough space: the detached header \
                     needs {} bytes and cannot grow: {e}",
                    luks1_size + SHIFT
                ))
            })?;
            max = dev.size()?;
        }
        if max < luks1_size + SHIFT {
            return Err(Error::InvalidOption(format!(
                "Unable to move keyslot area. Not enough space: the keyslots need {} bytes \
                 before the data at {max}",
                luks1_size + SHIFT
            )));
        }
        let json = luks1_metadata(p, max - LUKS2_AREAS);
        let model = Model::from_json(&json, HDR_16K)?;
        let mut salt1 = [0u8; SALT_LEN];
        let mut salt2 = [0u8; SALT_LEN];
        cryptblk_crypto::random_bytes(&mut salt1)?;
        cryptblk_crypto::random_bytes(&mut salt2)?;
        let bin = BinHeader {
            secondary: false,
            hdr_size: HDR_16K,
            seqid: 1,
            label: String::new(),
            checksum_alg: "sha256".into(),
            salt: salt1,
            uuid: p.uuid.clone(),
            subsystem: String::new(),
            hdr_offset: 0,
        };
        let mut h = Self::from_parts(bin, salt1, salt2, json.clone(), model)?;
        h.key_len = p.key_bytes as usize;
        move_areas(dev, LUKS1_AREAS, LUKS2_AREAS, luks1_size - LUKS1_AREAS)?;
        h.commit(dev, json)?;
        dev.sync()?;
        Ok(h)
    }

    /// Why this header cannot be LUKS1, if it cannot (cryptsetup's checks, its messages).
    fn luks1_incompatibility(&self) -> Option<String> {
        let j = &self.json;
        let no = |why: &str| Some(format!("Cannot convert to LUKS1 format - {why}."));
        if self.in_reencryption() || !self.model.requirements.is_empty() {
            return no("the header has requirements (a reencryption in progress)");
        }
        let seg = self.segment();
        if seg.integrity.is_some() {
            return no("the data segment has integrity protection");
        }
        if seg.sector_size != 512 {
            return no("default segment encryption sector size is not 512 bytes");
        }
        let digests = j["digests"].as_object().map_or(0, Map::len);
        let digest = &j["digests"]["0"];
        if digests != 1 || digest["type"] != "pbkdf2" {
            return no("key slot digests are not LUKS1 compatible");
        }
        if self.model.segments.len() != 1 {
            return no("device uses more segments");
        }
        let tokens = j["tokens"].as_object().map_or(0, Map::len);
        if tokens > 0 {
            return no(&format!("LUKS2 header contains {tokens} token(s)"));
        }
        let hash = digest["hash"].as_str().unwrap_or_default();
        let area = crate::luks1::af_sectors(self.key_len, STRIPES) * 512;
        for (id, k) in j["keyslots"].as_object()?.iter() {
            let i: usize = id.parse().unwrap_or(usize::MAX);
            if i >= NUM_KEYSLOTS {
                return no(&format!("slot {id} (over maximum slots) is still active"));
            }
            let compatible = k["type"] == "luks2"
                && k["kdf"]["type"] == "pbkdf2"
                && k["kdf"]["hash"] == hash
                && k["af"]["stripes"] == STRIPES
                && k["af"]["hash"] == hash
                && k["area"]["encryption"] == seg.encryption.as_str()
                && k["area"]["key_size"] == self.key_len
                && k["area"]["size"]
                    .as_str()
                    .and_then(|s| s.parse::<u64>().ok())
                    == Some(area.next_multiple_of(4096));
            if !compatible {
                return no(&format!("keyslot {id} is not LUKS1 compatible"));
            }
        }
        None
    }

    /// Converts this LUKS2 volume to LUKS1 in place (`cryptsetup convert --type luks1`):
    /// only a header LUKS1 can express (PBKDF2 keyslots 0-7 with LUKS1's split and the data
    /// cipher, 512-byte sectors, no tokens, nothing in progress); the keyslot material
    /// moves from 32 KiB to 4 KiB, free LUKS1 slots get the free areas cryptsetup gives them.
    pub fn convert_to_luks1(&self, dev: &mut dyn Storage) -> Result<Luks1Header> {
        self.check_usable()?;
        if let Some(why) = self.luks1_incompatibility() {
            return Err(refuse(why));
        }
        let j = &self.json;
        let digest = &j["digests"]["0"];
        let b64 = |v: &Value| -> Result<Vec<u8>> {
            B64.decode(v.as_str().unwrap_or_default())
                .map_err(|_| refuse("bad base64 in the digest or a keyslot"))
        };
        let hash = digest["hash"].as_str().unwrap_or_default().to_string();
        let (mk_digest, mk_salt) = (b64(&digest["digest"])?, b64(&digest["salt"])?);
        if mk_digest.len() < 20 || mk_salt.len() != 32 {
            return Err(refuse(
                "Cannot convert to LUKS1 format - key slot digests are not LUKS1 compatible.",
            ));
        }
        // Free slots get the free areas in order, each taken before the next is found.
        let mut model = self.model.clone();
        let area = keyslot::area_size_for(self.key_len);
        let mut slots: Vec<Luks1Keyslot> = Vec::new();
        for i in 0..NUM_KEYSLOTS {
            let k = &j["keyslots"][i.to_string()];
            let offset = match k["area"]["offset"].as_str() {
                Some(o) => o.parse::<u64>().map_err(|_| refuse("bad keyslot offset"))?,
                None => {
                    let o = keyslot::find_area_gap(&model, self.hdr_size, area)
                        .ok_or_else(|| refuse("no room for the free LUKS1 keyslots"))?;
                    model.keyslots.insert(100 + i as u32, placeholder(o, area));
                    o
                }
            };
            let sectors = u32::try_from(offset / 512 - SHIFT / 512)
                .map_err(|_| refuse("keyslot offset out of LUKS1's range"))?;
            let mut s = Luks1Keyslot::disabled(sectors);
            if !k.is_null() {
                s.active = true;
                s.iterations = k["kdf"]["iterations"].as_u64().unwrap_or(0) as u32;
                s.salt.copy_from_slice(
                    b64(&k["kdf"]["salt"])?
                        .get(..32)
                        .ok_or_else(|| refuse(format!("keyslot {i}: salt is not 32 bytes")))?,
                );
            }
            slots.push(s);
        }
        let spec = cryptblk_crypto::CipherSpec::parse(&self.segment().encryption)?;
        let phdr = Phdr {
            cipher_name: spec.cipher_name().to_string(),
            cipher_mode: spec.cipher_mode(),
            hash_spec: hash,
            payload_offset: u32::try_from(self.segment().offset / 512)
                .map_err(|_| refuse("data offset out of LUKS1's range"))?,
            key_bytes: self.key_len as u32,
            mk_digest: mk_digest[..20].try_into().expect("20 bytes"),
            mk_digest_salt: mk_salt.try_into().expect("32 bytes"),
            mk_digest_iterations: digest["iterations"].as_u64().unwrap_or(0) as u32,
            uuid: self.uuid.clone(),
            slots: slots.try_into().expect("8 slots"),
        };
        let v1 = Luks1Header::from_phdr(phdr)?;
        move_areas(dev, LUKS2_AREAS, LUKS1_AREAS, self.model.keyslots_size)?;
        dev.write_at(&[0u8; LUKS1_AREAS as usize], 0)?;
        v1.write(dev)?;
        dev.sync()?;
        Ok(v1)
    }
}

/// A keyslot that only holds an area (a free LUKS1 slot's, while the next is placed).
fn placeholder(offset: u64, size: u64) -> super::model::KeyslotEntry {
    super::model::KeyslotEntry {
        kind: "placeholder".into(),
        key_size: 0,
        area_offset: offset,
        area_size: size,
        priority: super::Priority::Normal,
        params: Err("placeholder".into()),
        reencrypt: None,
    }
}
