//! LUKS2: binary headers + JSON metadata, bit-compatible with cryptsetup.
//!
//! On disk: a primary copy at offset 0 and a secondary copy at `hdr_size`, each a 4096-byte
//! binary header followed by the JSON area; then the keyslots area (`keyslots_size` bytes
//! from `2 * hdr_size`), then (unless the header is detached) the data segment.
//!
//! The parsed JSON ([`Luks2Header::json`]) is the source of truth: every change edits a
//! copy of it surgically and writes it back, so tokens, unknown fields and unknown objects
//! survive. A typed, validated view (`model::Model`) is rebuilt from it after each change.
//!
//! Crash safety of metadata updates: the new JSON gets `seqid + 1` and is written to the
//! primary copy, synced, then to the secondary copy, synced. A torn write leaves a copy
//! with a bad checksum, which `read` ignores; of two good copies the higher seqid wins.
//! So after a crash anywhere the volume opens with exactly the old or the new metadata.
//! Key material is written and synced into a free area before the metadata that points at
//! it; an area is wiped only after the metadata no longer points at it.

mod binary;
mod convert;
mod digest;
mod error;
mod keyslot;
mod model;
mod reencrypt;
#[cfg(test)]
mod tests;
mod token;

use cryptblk_crypto::{CipherSpec, IvOptions, KdfRequest, SecretBytes, random_bytes};
use serde_json::{Map, Value, json};

pub use binary::HDR_SIZES;
pub use error::Luks2Error;
pub use model::{Priority, ReencryptDirection, ReencryptMode, Resilience};
pub use reencrypt::{
    MAX_REDUCE, REQUIREMENT_V2, REQUIREMENT_V3, ReencryptJob, ReencryptOutcome, ReencryptRequest,
    ReencryptStep, ResilienceRequest, StepHost, StepRecovery,
};
pub use token::KEYRING_TOKEN;

use crate::{Error, FormatOptions, KeyslotInfo, LuksHeader, Result, SegmentKey, Storage};
use binary::{BIN_HDR_LEN, BinHeader, LABEL_LEN, RawCopy, SALT_LEN};
use model::{MAX_KEYSLOTS_SIZE, MAX_OBJECTS, Model};

/// Magic of the secondary header copy (the primary uses LUKS1's `LUKS\xba\xbe`).
pub const SECONDARY_MAGIC: &[u8] = binary::SECONDARY_MAGIC;
/// cryptsetup's default size of one header copy (16 KiB).
pub const DEFAULT_HDR_SIZE: u64 = 0x4000;
/// Header copies plus keyslots area end here by default (16 MiB), which is also the
/// default data offset.
pub const DEFAULT_METADATA_END: u64 = 16 * 1024 * 1024;
/// Data offset alignment cryptsetup uses when it cannot read the device topology (1 MiB).
const DEFAULT_ALIGNMENT: u64 = 1024 * 1024;

/// What `read` found in each header copy: `None` if the copy is valid, else why not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyStatus {
    /// Why the primary copy (at offset 0) is unusable; `None` if it is valid.
    pub primary_error: Option<String>,
    /// Why the secondary copy is unusable, or "not found"; `None` if it is valid. It is
    /// read at the primary's `hdr_size`, or searched at every allowed offset when the
    /// primary is unusable.
    pub secondary_error: Option<String>,
}

impl CopyStatus {
    /// Both copies valid (they may still differ in seqid; see [`Luks2Header::copies_in_sync`]).
    pub fn both_valid(&self) -> bool {
        self.primary_error.is_none() && self.secondary_error.is_none()
    }
}

/// A LUKS2 header as read from (or written to) a device.
#[derive(Debug, Clone)]
pub struct Luks2Header {
    hdr_size: u64,
    seqid: u64,
    label: String,
    subsystem: String,
    uuid: String,
    checksum_alg: String,
    salt1: [u8; SALT_LEN],
    salt2: [u8; SALT_LEN],
    json: Value,
    model: Model,
    segment_id: u32,
    cipher: CipherSpec,
    key_len: usize,
    status: CopyStatus,
    in_sync: bool,
    /// Set when read with [`Luks2Header::read_ignoring_requirements`] despite requirements.
    unmet_requirements: bool,
    /// `--keyslot-cipher`/`--keyslot-key-size`: how the next keyslots' areas are
    /// encrypted; `None`: with the data cipher (cryptsetup's default).
    keyslot_encryption: Option<(String, usize)>,
    /// The type of a data segment that is neither `crypt` nor `linear`: the header loads
    /// (dump, backup) but nothing uses its data or keys.
    unsupported_segment: Option<String>,
}

/// Which digest a keyslot being stored belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyDigest {
    /// The data segment's digest: the volume key.
    DataSegment,
    /// This digest (an unbound key's): the key must match it.
    Existing(u32),
    /// A new digest, bound to no segment, made for the key (an unbound key).
    NewUnbound,
}

fn bad(msg: impl Into<String>) -> Error {
    Error::Luks2(Luks2Error::InvalidMetadata(msg.into()))
}

fn check_label(s: &str) -> Result<()> {
    if s.len() >= LABEL_LEN || s.contains('\0') {
        return Err(
            Luks2Error::InvalidLabel(format!("'{s}' (at most {} bytes)", LABEL_LEN - 1)).into(),
        );
    }
    Ok(())
}

/// A mutable section (`keyslots`, `digests`, ...) of the top-level JSON object.
fn section_mut<'a>(json: &'a mut Value, name: &str) -> Result<&'a mut Map<String, Value>> {
    json.get_mut(name)
        .and_then(Value::as_object_mut)
        .ok_or_else(|| bad(format!("no \"{name}\" object")))
}

/// Removes `id` from the `keyslots` arrays of every object in `section`.
fn unassign(json: &mut Value, section: &str, id: u32) -> Result<()> {
    let key = id.to_string();
    for obj in section_mut(json, section)?.values_mut() {
        if let Some(arr) = obj.get_mut("keyslots").and_then(Value::as_array_mut) {
            arr.retain(|v| v.as_str() != Some(key.as_str()));
        }
    }
    Ok(())
}

/// Removes keyslot `id` and every reference to it (digests, tokens), like cryptsetup's wipe.
fn remove_keyslot_json(json: &mut Value, id: u32) -> Result<()> {
    section_mut(json, "keyslots")?.shift_remove(&id.to_string());
    unassign(json, "digests", id)?;
    unassign(json, "tokens", id)
}

/// Where cryptsetup puts the keyslots area end and the data: returns
/// `(keyslots_size, data_offset)` (`LUKS2_generate_hdr` with default topology alignment).
pub(crate) fn compute_layout(
    hdr_size: u64,
    keyslots_size: Option<u64>,
    data_offset: Option<u64>,
    detached: bool,
) -> Result<(u64, u64)> {
    let min = 2 * hdr_size;
    let mut off = data_offset.unwrap_or(0);
    if off != 0 && off < min {
        return Err(Error::InvalidOption(format!(
            "requested data offset {off} is too small (header needs {min})"
        )));
    }
    let mut ks = keyslots_size.unwrap_or(0);
    if ks == 0 && off != 0 {
        ks = off - min;
    }
    ks -= ks % 4096;
    ks = ks.min(MAX_KEYSLOTS_SIZE);
    if ks == 0 {
        ks = DEFAULT_METADATA_END - min;
    }
    if off != 0 && ks + min > off {
        ks = (off - min) / 4096 * 4096;
    }
    // A detached header takes the data offset as given (default 0); otherwise the data
    // starts at the next 1 MiB boundary after the keyslots area.
    if off == 0 && !detached {
        off = (min + ks).div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
    }
    Ok((ks, off))
}

impl Luks2Header {
    /// Reads the header: the valid copy with the highest seqid (primary first on a tie).
    /// Looks for the secondary copy at every offset the format allows when the primary is
    /// unusable. Never writes. Refuses headers with mandatory requirements.
    pub fn read(dev: &mut dyn Storage) -> Result<Self> {
        let h = Self::read_ignoring_requirements(dev)?;
        if h.unmet_requirements {
            return Err(Luks2Error::UnmetRequirements(h.model.requirements.clone()).into());
        }
        Ok(h)
    }

    /// [`Luks2Header::read`] for `repair`: a header with one damaged copy loads even when
    /// another signature is on the device (`repair` is how the user says the LUKS2
    /// header is the one to keep).
    pub fn read_for_repair(dev: &mut dyn Storage) -> Result<Self> {
        Self::read_copies(dev, false)
    }

    /// Like [`Luks2Header::read`], but loads headers with mandatory requirements we do not
    /// implement: such a header can be inspected, its passphrases checked and keyslots
    /// destroyed; it refuses to be mapped and every other change, as in cryptsetup.
    pub fn read_ignoring_requirements(dev: &mut dyn Storage) -> Result<Self> {
        Self::read_copies(dev, true)
    }

    /// Reads both copies and keeps the newest valid one. With one copy damaged and
    /// `probe`, another format's signature on the device refuses the header, as
    /// cryptsetup refuses to recover it then.
    fn read_copies(dev: &mut dyn Storage, probe: bool) -> Result<Self> {
        let check = |c: std::result::Result<RawCopy, binary::CopyFailure>| match c {
            Ok(c) => match Model::from_json(&c.json, c.bin.hdr_size)
                .and_then(|m| m.check_digest_assignment().map(|()| m))
            {
                Ok(m) => Ok((c, m)),
                Err(e) => Err((true, e.to_string())),
            },
            Err(f) => Err((f.magic, f.reason)),
        };
        let primary = check(binary::read_copy(dev, 0));
        let secondary = match &primary {
            Ok((c, _)) => check(binary::read_copy(dev, c.bin.hdr_size)),
            Err(_) => {
                let mut found = Err((false, "not found".to_string()));
                for off in HDR_SIZES {
                    match check(binary::read_copy(dev, off)) {
                        Ok(c) => {
                            found = Ok(c);
                            break;
                        }
                        Err((true, reason)) if found.is_err() => {
                            found = Err((true, format!("at offset {off}: {reason}")))
                        }
                        Err(_) => {}
                    }
                }
                found
            }
        };
        let status = CopyStatus {
            primary_error: primary.as_ref().err().map(|e| e.1.clone()),
            secondary_error: secondary.as_ref().err().map(|e| e.1.clone()),
        };
        let salts = (
            primary.as_ref().ok().map(|(c, _)| c.bin.salt),
            secondary.as_ref().ok().map(|(c, _)| c.bin.salt),
        );
        let in_sync = match (&primary, &secondary) {
            (Ok((p, _)), Ok((s, _))) => p.bin.seqid == s.bin.seqid,
            _ => false,
        };
        let (copy, model) = match (primary, secondary) {
            (Ok(p), Ok(s)) => {
                if s.0.bin.seqid > p.0.bin.seqid {
                    s
                } else {
                    p
                }
            }
            (Ok(c), Err(_)) | (Err(_), Ok(c)) => {
                if probe && let Some(other) = crate::signatures::foreign_signature(dev) {
                    return Err(Luks2Error::AmbiguousSignatures(other.to_string()).into());
                }
                c
            }
            (Err((false, _)), Err((false, _))) => return Err(Error::NotLuks),
            (Err((_, p)), Err((_, s))) => {
                return Err(Luks2Error::NoValidCopy {
                    primary: p,
                    secondary: s,
                }
                .into());
            }
        };
        let need = 2 * copy.bin.hdr_size + model.keyslots_size;
        let have = dev.size()?;
        if have < need {
            return Err(Error::Truncated { need, have });
        }
        let salt1 = salts.0.unwrap_or(copy.bin.salt);
        let salt2 = salts.1.unwrap_or(copy.bin.salt);
        let mut h = Self::from_parts(copy.bin, salt1, salt2, copy.json, model)?;
        h.status = status;
        h.in_sync = in_sync;
        Ok(h)
    }

    fn from_parts(
        bin: BinHeader,
        salt1: [u8; SALT_LEN],
        salt2: [u8; SALT_LEN],
        json: Value,
        model: Model,
    ) -> Result<Self> {
        binary::checksum_hash(&bin.checksum_alg).map_err(Luks2Error::Unsupported)?;
        let mut h = Luks2Header {
            hdr_size: bin.hdr_size,
            seqid: bin.seqid,
            label: bin.label,
            subsystem: bin.subsystem,
            uuid: bin.uuid,
            checksum_alg: bin.checksum_alg,
            salt1,
            salt2,
            json,
            model,
            segment_id: 0,
            cipher: CipherSpec::parse("aes-xts-plain64")?,
            key_len: 0,
            status: CopyStatus::default(),
            in_sync: true,
            unmet_requirements: false,
            keyslot_encryption: None,
            unsupported_segment: None,
        };
        h.refresh(h.model.clone())?;
        Ok(h)
    }

    /// Recomputes the cached segment and key facts from a freshly validated model.
    fn refresh(&mut self, model: Model) -> Result<()> {
        // Mid-reencryption the volume's cipher and key are those of the final layout (or of
        // the previous one when decrypting to plaintext), as cryptsetup reports them.
        let reenc_segment = match model.reencryption()? {
            Some(r) if r.final_.1.kind == "crypt" => Some(r.final_),
            Some(r) => Some(r.previous),
            None => None,
        };
        let (seg_id, seg) = reenc_segment
            .or_else(|| model.default_segment())
            .ok_or_else(|| Luks2Error::Unsupported("header without a data segment".into()))?;
        // "linear": what a finished decryption leaves (plaintext behind a vestigial
        // header); it loads, and unlocking it says so. A type nobody knows loads too (its
        // metadata is valid, as cryptsetup's validation says; dump shows it) and refuses
        // every use of the data or the keys.
        self.unsupported_segment =
            (seg.kind != "crypt" && seg.kind != "linear").then(|| seg.kind.clone());
        if let Some(i) = &seg.integrity {
            // The data lives on a dm-integrity device with interleaved tags, each sector
            // sealed on its own: the volume layer serves it (`cipher` then only gives the
            // sector size). What it cannot serve is refused here, before any use.
            if i.journal_encryption != "none" || i.journal_integrity != "none" {
                return Err(Luks2Error::Unsupported(format!(
                    "integrity journal encryption '{}' / integrity '{}' (cryptsetup writes none)",
                    i.journal_encryption, i.journal_integrity
                ))
                .into());
            }
            cryptblk_crypto::AeadSectorCipher::tag_size_of(&i.encryption, &i.kind).map_err(
                |e| Luks2Error::Unsupported(format!("data segment with integrity: {e}")),
            )?;
        }
        let cipher = if seg.kind != "crypt" || seg.integrity.is_some() {
            CipherSpec::parse("cipher_null-ecb")?
        } else {
            CipherSpec::parse(&seg.encryption)
                .map_err(|_| Luks2Error::Unsupported(format!("data cipher '{}'", seg.encryption)))?
        };
        let key_len = model
            .segment_digest(seg_id)
            .and_then(|(_, d)| d.keyslots.iter().find_map(|k| model.keyslots.get(k)))
            .map(|k| k.key_size as usize);
        self.segment_id = seg_id;
        self.cipher = cipher;
        // With every keyslot gone the size is unknown on disk; keep what we knew.
        if let Some(k) = key_len {
            self.key_len = k;
        }
        self.unmet_requirements = model
            .requirements
            .iter()
            .any(|r| !reencrypt::is_known_requirement(r));
        self.model = model;
        Ok(())
    }

    /// Where the header and keyslot areas [`Luks2Header::format`] writes with `opts` end
    /// (the data offset, or the areas' end with a detached header): the least a store
    /// that cannot grow must hold.
    pub fn header_end(opts: &FormatOptions) -> Result<u64> {
        let hdr_size = opts.luks2_metadata_size.unwrap_or(16 << 10);
        let (keyslots_size, data_offset) = compute_layout(
            hdr_size,
            opts.luks2_keyslots_size,
            opts.data_offset,
            opts.detached_header,
        )?;
        let areas_end = 2 * hdr_size + keyslots_size;
        Ok(if opts.detached_header {
            areas_end
        } else {
            data_offset.max(areas_end)
        })
    }

    /// Creates a new LUKS2 volume header with `volume_key` in one keyslot, as
    /// `cryptsetup luksFormat --type luks2` does (layout, digest, keyslot parameters).
    pub fn format(
        dev: &mut dyn Storage,
        opts: &FormatOptions,
        volume_key: &[u8],
        passphrase: &[u8],
    ) -> Result<Self> {
        let key_len = opts.key_len;
        let hdr_size = check_format_options(opts, volume_key)?;
        let (keyslots_size, data_offset) = compute_layout(
            hdr_size,
            opts.luks2_keyslots_size,
            opts.data_offset,
            opts.detached_header,
        )?;
        let label = opts.label.clone().unwrap_or_default();
        let subsystem = opts.subsystem.clone().unwrap_or_default();
        check_label(&label)?;
        check_label(&subsystem)?;
        let uuid = match &opts.uuid {
            Some(u) => uuid::Uuid::parse_str(u).map_err(|_| Luks2Error::InvalidUuid(u.clone()))?,
            None => uuid::Uuid::new_v4(),
        }
        .hyphenated()
        .to_string();
        let slot = opts.keyslot.unwrap_or(0);
        let area_offset = 2 * hdr_size;
        let area_size = keyslot::area_size_for(key_len);
        if area_size > keyslots_size {
            return Err(Luks2Error::NoKeyslotSpace.into());
        }
        // A store smaller than the header: an image file grows to hold it (cryptsetup
        // formats such a file and warns that no data fits); a block device fails on the
        // first write past its end (callers check that first: `header_end`).

        let mut req = opts.kdf.clone();
        req.hash = opts.hash;
        let kdf = req.resolve(key_len)?;
        let iterations =
            digest::iterations(opts.hash, key_len, opts.kdf.forced_iterations.is_some())?;
        let (area_cipher, area_key_size) = match &opts.keyslot_encryption {
            Some((c, bytes)) => {
                check_keyslot_encryption(c, *bytes)?;
                (c.clone(), *bytes)
            }
            // As cryptsetup: an authenticated data cipher is no keyslot cipher.
            None if opts.integrity.is_some() => ("aes-xts-plain64".into(), 64),
            None => keyslot_cipher(&opts.cipher, key_len),
        };

        wipe_for_format(
            dev,
            hdr_size,
            keyslots_size,
            data_offset,
            opts.detached_header,
        )?;

        let ks_json = keyslot::create(
            dev,
            &keyslot::NewKeyslot {
                kdf,
                af_hash: opts.hash,
                area_cipher: &area_cipher,
                area_key_size,
                area_offset,
                area_size,
            },
            volume_key,
            passphrase,
        )?;
        dev.sync()?;
        let digest = digest::create(volume_key, opts.hash, iterations, &[slot], &[0])?;
        let mut keyslots = Map::new();
        keyslots.insert(slot.to_string(), ks_json);
        let json = initial_metadata(opts, keyslots, digest, data_offset, hdr_size, keyslots_size);
        let model = Model::from_json(&json, hdr_size)?;
        let mut salt1 = [0u8; SALT_LEN];
        let mut salt2 = [0u8; SALT_LEN];
        random_bytes(&mut salt1)?;
        random_bytes(&mut salt2)?;
        let bin = BinHeader {
            secondary: false,
            hdr_size,
            seqid: 0,
            label,
            checksum_alg: "sha256".into(),
            salt: salt1,
            uuid,
            subsystem,
            hdr_offset: 0,
        };
        let mut h = Self::from_parts(bin, salt1, salt2, json, model)?;
        h.key_len = key_len;
        let json = h.json.clone();
        h.commit(dev, json)?;
        Ok(h)
    }

    /// Refuses to touch headers with mandatory requirements we do not implement.
    fn check_usable(&self) -> Result<()> {
        if self.unmet_requirements {
            return Err(Luks2Error::UnmetRequirements(self.model.requirements.clone()).into());
        }
        self.check_segment_supported()
    }

    /// Refuses a data segment of a type we do not implement.
    fn check_segment_supported(&self) -> Result<()> {
        if let Some(kind) = &self.unsupported_segment {
            return Err(Luks2Error::Unsupported(format!("data segment of type '{kind}'")).into());
        }
        Ok(())
    }

    /// Metadata changes other than the reencryption's own wait until it is finished, as in
    /// cryptsetup (a new keyslot would not know which of the two keys to hold).
    fn check_changeable(&self) -> Result<()> {
        self.check_usable()?;
        if self.in_reencryption() {
            return Err(Luks2Error::InReencryption.into());
        }
        Ok(())
    }

    /// Opens a keyslot of digest `digest_id` with `passphrase`: `slot` only, if given, else
    /// every slot of the digest, "prefer" first, "ignore" never.
    fn open_digest(
        &self,
        dev: &mut dyn Storage,
        digest_id: u32,
        passphrase: &[u8],
        slot: Option<u32>,
    ) -> Result<(u32, SecretBytes)> {
        let digest = &self.model.digests[&digest_id];
        let candidates: Vec<u32> = match slot {
            Some(s) => {
                if !self.model.keyslots.contains_key(&s) {
                    return Err(Error::Keyslot(format!("keyslot {s} is not active")));
                }
                if !digest.keyslots.contains(&s) {
                    return Err(Error::Keyslot(format!(
                        "keyslot {s} is not bound to the data segment"
                    )));
                }
                vec![s]
            }
            None => {
                let mut c: Vec<(model::Priority, u32)> = digest
                    .keyslots
                    .iter()
                    .filter_map(|id| self.model.keyslots.get(id).map(|k| (k.priority, *id)))
                    .filter(|(p, _)| *p != Priority::Ignore)
                    .collect();
                c.sort_by_key(|&(p, id)| (std::cmp::Reverse(p), id));
                c.dedup();
                c.into_iter().map(|(_, id)| id).collect()
            }
        };
        let mut unsupported = None;
        for id in candidates {
            let k = &self.model.keyslots[&id];
            let p = match &k.params {
                Ok(p) => p,
                Err(e) => {
                    unsupported = Some(format!("keyslot {id}: {e}"));
                    continue;
                }
            };
            let key = keyslot::open(dev, p, k.key_size as usize, k.area_offset, passphrase)?;
            if digest::verify(digest, &key)? {
                return Ok((id, key));
            }
        }
        match (slot, unsupported) {
            (Some(_), Some(u)) => Err(Luks2Error::Unsupported(u).into()),
            _ => Err(Error::WrongPassphrase),
        }
    }

    /// Finishes a reencryption whose data is all done: overwrites the stale copies it
    /// left (synced), then one commit drops the old key, the backups and the reencryption
    /// metadata; the freed keyslot areas are wiped after.
    /// `wipe_stale`: only where the verification digest was checked (the offsets come
    /// from the metadata).
    pub(crate) fn finish_reencryption(
        &mut self,
        dev: &mut dyn Storage,
        data: &dyn Storage,
        data_size: u64,
        wipe_stale: bool,
    ) -> Result<()> {
        let model = self.model.clone();
        let r = model
            .reencryption()?
            .ok_or_else(|| bad("no reencryption to finish"))?;
        if wipe_stale {
            for (off, len) in r.stale_copies(data_size) {
                reencrypt::wipe_random(data, off, len)?;
            }
            data.sync()?;
        }
        let fin = r.finished(&model, &self.json)?;
        self.commit(dev, fin.json)?;
        for (off, len) in fin.wipe_header {
            keyslot::wipe_area(dev, off, len)?;
        }
        dev.sync()?;
        Ok(())
    }

    /// Mid-reencryption: opens the old and the new key (each where that side is encrypted)
    /// with one passphrase and checks the verification digest over both keys and the
    /// reencryption metadata. Returns the keyslot that opened the new key (else the old),
    /// and the keys by digest id.
    fn open_reencryption_keys(
        &self,
        r: &reencrypt::Reencryption<'_>,
        dev: &mut dyn Storage,
        passphrase: &[u8],
        slot: Option<u32>,
    ) -> Result<(u32, Vec<(u32, SecretBytes)>)> {
        let digest_of = |seg: &(u32, &model::Segment)| -> Result<Option<u32>> {
            if seg.1.kind != "crypt" {
                return Ok(None);
            }
            self.model
                .segment_digest(seg.0)
                .map(|(id, _)| Some(id))
                .ok_or_else(|| {
                    Luks2Error::InvalidMetadata("backup segment without a digest".into()).into()
                })
        };
        let old = digest_of(&r.previous)?;
        let new = digest_of(&r.final_)?.filter(|d| Some(*d) != old);
        let mut keys: Vec<(u32, SecretBytes)> = Vec::new();
        let mut opened_by = None;
        for d in [old, new].into_iter().flatten() {
            // A named slot opens its own digest's key; the other key is tried in every slot.
            let this_slot = slot.filter(|s| self.model.digests[&d].keyslots.contains(s));
            let (id, key) = self.open_digest(dev, d, passphrase, this_slot)?;
            opened_by = Some(id);
            keys.push((d, key));
        }
        if let Some(s) = slot
            && !keys
                .iter()
                .any(|(d, _)| self.model.digests[d].keyslots.contains(&s))
        {
            return Err(Error::Keyslot(format!(
                "keyslot {s} holds neither key of the reencryption"
            )));
        }
        let key_of = |d: Option<u32>| {
            d.and_then(|d| keys.iter().find(|(k, _)| *k == d))
                .map(|(_, k)| k.as_ref())
        };
        let data = r.verification_data(key_of(old), key_of(new))?;
        let (_, vd) = self
            .model
            .digests
            .iter()
            .find(|(_, d)| d.keyslots.contains(&r.keyslot_id))
            .ok_or(Luks2Error::ReencryptionDigest("missing"))?;
        if !digest::verify(vd, &data)? {
            return Err(Luks2Error::ReencryptionDigest("does not match").into());
        }
        let slot = opened_by.ok_or(Error::WrongPassphrase)?;
        Ok((slot, keys))
    }

    /// Writes `json` (and the current label/subsystem) as the next seqid to both copies:
    /// primary, sync, secondary, sync. Validates before writing anything.
    /// What [`Self::commit`] checks before writing: the metadata is valid and fits the
    /// JSON area. Returns the parsed model and the JSON text.
    fn check_committable(&self, json: &Value) -> Result<(Model, Vec<u8>)> {
        let model = Model::from_json(json, self.hdr_size)?;
        model.check_digest_assignment()?;
        let text = serde_json::to_vec(json).map_err(|e| bad(e.to_string()))?;
        let have = self.hdr_size - BIN_HDR_LEN as u64;
        if text.len() as u64 >= have {
            return Err(Luks2Error::JsonTooLarge {
                need: text.len() as u64 + 1,
                have,
            }
            .into());
        }
        Ok((model, text))
    }

    /// Every header write goes through here, and none to a header with mandatory
    /// requirements we do not implement, except the few cryptsetup allows on one
    /// ([`Self::commit_despite_requirements`]).
    fn commit(&mut self, dev: &mut dyn Storage, json: Value) -> Result<()> {
        if self.unmet_requirements {
            return Err(Luks2Error::UnmetRequirements(self.model.requirements.clone()).into());
        }
        self.commit_despite_requirements(dev, json)
    }

    /// [`Self::commit`] for what cryptsetup allows on a header with unknown mandatory
    /// requirements (the requirements themselves are written back untouched): destroying
    /// keyslots (`luksKillSlot`, `luksErase`) and `repair`.
    fn commit_despite_requirements(&mut self, dev: &mut dyn Storage, json: Value) -> Result<()> {
        let (model, text) = self.check_committable(&json)?;
        let seqid = self
            .seqid
            .checked_add(1)
            .ok_or_else(|| bad("seqid overflow"))?;
        let mut bin = BinHeader {
            secondary: false,
            hdr_size: self.hdr_size,
            seqid,
            label: self.label.clone(),
            checksum_alg: self.checksum_alg.clone(),
            salt: self.salt1,
            uuid: self.uuid.clone(),
            subsystem: self.subsystem.clone(),
            hdr_offset: 0,
        };
        let primary = binary::encode_copy(&bin, &text).map_err(bad)?;
        bin.secondary = true;
        bin.hdr_offset = self.hdr_size;
        bin.salt = self.salt2;
        let secondary = binary::encode_copy(&bin, &text).map_err(bad)?;
        // Checked before any write, so a failure leaves the device as it was.
        let mut next = self.clone();
        next.refresh(model)?;
        next.json = json;
        next.seqid = seqid;

        dev.write_at(&primary, 0)?;
        dev.sync()?;
        dev.write_at(&secondary, self.hdr_size)?;
        dev.sync()?;
        next.status = CopyStatus::default();
        next.in_sync = true;
        *self = next;
        Ok(())
    }

    /// The segment digest's id, and the digest.
    fn segment_digest(&self) -> Result<(u32, &model::Digest)> {
        self.model.segment_digest(self.segment_id).ok_or_else(|| {
            Luks2Error::Unsupported("data segment without a key digest".into()).into()
        })
    }

    /// Writes a new keyslot `slot` (or the first free one) for `volume_key` into a free area,
    /// and in the same metadata update removes keyslot `replace` (whose area is wiped after).
    /// The key is the data's, an unbound key's (checked against its digest), or a new
    /// unbound key (a digest is made for it): `target`.
    #[allow(clippy::too_many_arguments)]
    fn store_keyslot(
        &mut self,
        dev: &mut dyn Storage,
        volume_key: &[u8],
        passphrase: &[u8],
        slot: Option<u32>,
        kdf_req: &KdfRequest,
        replace: Option<u32>,
        target: KeyDigest,
    ) -> Result<u32> {
        self.check_changeable()?;
        let existing = match target {
            KeyDigest::DataSegment => Some(self.segment_digest()?.0),
            KeyDigest::Existing(d) => Some(d),
            KeyDigest::NewUnbound => None,
        };
        let digest_id = match existing {
            Some(d) => {
                let digest = self
                    .model
                    .digests
                    .get(&d)
                    .ok_or_else(|| bad(format!("digest {d} is missing")))?;
                if !digest::verify(digest, volume_key)? {
                    return Err(Luks2Error::VolumeKeyMismatch.into());
                }
                d
            }
            None => (0..MAX_OBJECTS)
                .find(|i| !self.model.digests.contains_key(i))
                .ok_or_else(|| bad("no free digest id"))?,
        };
        let free = |id: &u32| !self.model.keyslots.contains_key(id) || Some(*id) == replace;
        let id = match slot {
            Some(s) if s >= MAX_OBJECTS => {
                return Err(Error::Keyslot(format!(
                    "keyslot {s} out of range (0..{MAX_OBJECTS})"
                )));
            }
            Some(s) if !free(&s) => return Err(Error::Keyslot(format!("keyslot {s} is in use"))),
            Some(s) => s,
            None => (0..MAX_OBJECTS)
                .find(|i| !self.model.keyslots.contains_key(i))
                .or(replace)
                .ok_or(Error::NoFreeKeyslot)?,
        };
        let area_size = keyslot::area_size_for(volume_key.len());
        let (id, area_offset, in_place) =
            match keyslot::find_area_gap(&self.model, self.hdr_size, area_size) {
                Some(off) => (id, off, false),
                // No free area: a replaced keyslot is rewritten in its own area, as
                // cryptsetup does (a crash in between loses that keyslot's passphrase:
                // cryptsetup's window too, taken only when the keyslots area is full).
                None => match replace.and_then(|r| Some((r, self.model.keyslots.get(&r)?))) {
                    Some((r, k))
                        if k.area_size >= area_size && (slot.is_none() || slot == Some(r)) =>
                    {
                        (r, k.area_offset, true)
                    }
                    _ => return Err(Luks2Error::NoKeyslotSpace.into()),
                },
            };
        let kdf = kdf_req.resolve(volume_key.len())?;
        // cryptsetup's AF hash is its PBKDF hash setting (`--hash`), whatever the KDF.
        let af_hash = kdf_req.hash;
        // The area takes the data cipher and key size (cryptsetup's default, for an
        // unbound key of any size too); the key itself when the volume's size is unknown.
        let area_key_len = if self.key_len > 0 {
            self.key_len
        } else {
            volume_key.len()
        };
        let (area_cipher, area_key_size) = self
            .keyslot_encryption
            .clone()
            .unwrap_or_else(|| keyslot_cipher(&self.cipher, area_key_len));
        let (material, ks_json) = keyslot::prepare(
            &keyslot::NewKeyslot {
                kdf,
                af_hash,
                area_cipher: &area_cipher,
                area_key_size,
                area_offset,
                area_size,
            },
            volume_key,
            passphrase,
        )?;
        if !in_place {
            // A free area: the material goes first (unreferenced until the commit).
            dev.write_at(&material, area_offset)?;
            dev.sync()?;
        }

        let mut json = self.json.clone();
        let old_area = replace
            .filter(|_| !in_place)
            .and_then(|r| self.model.keyslots.get(&r))
            .map(|k| (k.area_offset, k.area_size));
        if let Some(old) = replace {
            // The new slot inherits the old one's token assignments (as luksChangeKey does).
            let old_key = old.to_string();
            let inherit: Vec<String> = section_mut(&mut json, "tokens")?
                .iter()
                .filter(|(_, t)| {
                    t.get("keyslots")
                        .and_then(Value::as_array)
                        .is_some_and(|a| a.iter().any(|v| v.as_str() == Some(old_key.as_str())))
                })
                .map(|(k, _)| k.clone())
                .collect();
            remove_keyslot_json(&mut json, old)?;
            let tokens = section_mut(&mut json, "tokens")?;
            for t in inherit {
                if let Some(arr) = tokens
                    .get_mut(&t)
                    .and_then(|t| t.get_mut("keyslots"))
                    .and_then(Value::as_array_mut)
                {
                    arr.push(Value::String(id.to_string()));
                }
            }
        }
        section_mut(&mut json, "keyslots")?.insert(id.to_string(), ks_json);
        if target == KeyDigest::NewUnbound {
            // Its own digest, bound to no segment (cryptsetup's unbound key).
            let iterations = digest::iterations(
                kdf_req.hash,
                volume_key.len(),
                kdf_req.forced_iterations.is_some(),
            )?;
            let d = digest::create(volume_key, kdf_req.hash, iterations, &[], &[])?;
            section_mut(&mut json, "digests")?.insert(digest_id.to_string(), d);
        }
        let digests = section_mut(&mut json, "digests")?;
        let arr = digests
            .get_mut(&digest_id.to_string())
            .and_then(|d| d.get_mut("keyslots"))
            .and_then(Value::as_array_mut)
            .ok_or_else(|| bad("digest without keyslots array"))?;
        arr.push(Value::String(id.to_string()));
        if in_place {
            // The old material is overwritten only once the new metadata is known to be
            // committable (valid, and fitting the JSON area): from here only an I/O error
            // or a crash before the commit loses this keyslot (cryptsetup's window).
            self.check_committable(&json)?;
            dev.write_at(&material, area_offset)?;
            dev.sync()?;
        }
        self.commit(dev, json)?;
        if let Some((off, len)) = old_area {
            keyslot::wipe_area(dev, off, len)?;
            dev.sync()?;
        }
        Ok(id)
    }

    /// LUKS2 keyslots holding an unbound key (their digest is bound to no segment), in
    /// id order.
    pub fn unbound_keyslots(&self) -> Vec<u32> {
        self.model
            .keyslots
            .keys()
            .copied()
            .filter(|id| self.unbound_digest(*id).is_some())
            .collect()
    }

    /// The digest of keyslot `slot` when it holds an unbound key.
    fn unbound_digest(&self, slot: u32) -> Option<u32> {
        self.model
            .digests
            .iter()
            .find(|(_, d)| d.keyslots.contains(&slot) && d.segments.is_empty())
            .map(|(id, _)| *id)
    }

    /// Opens an unbound key: keyslot `slot`, else any unbound keyslot the passphrase
    /// opens (`open --unbound --test-passphrase`, `luksDump --unbound`).
    pub fn open_unbound(
        &self,
        dev: &mut dyn Storage,
        passphrase: &[u8],
        slot: Option<u32>,
    ) -> Result<(u32, SecretBytes)> {
        self.check_usable()?;
        let candidates = match slot {
            Some(s) if self.unbound_digest(s).is_some() => vec![s],
            Some(s) => {
                return Err(Error::Keyslot(format!(
                    "keyslot {s} does not contain an unbound key"
                )));
            }
            None => self.unbound_keyslots(),
        };
        for s in candidates {
            let d = self.unbound_digest(s).expect("an unbound keyslot");
            match self.open_digest(dev, d, passphrase, Some(s)) {
                Err(Error::WrongPassphrase) => {}
                r => return r,
            }
        }
        Err(Error::WrongPassphrase)
    }

    /// Adds a keyslot for an unbound key (`luksAddKey --unbound`): a key of its own,
    /// under its own digest, not used for the data.
    pub fn add_unbound_keyslot(
        &mut self,
        dev: &mut dyn Storage,
        key: &[u8],
        passphrase: &[u8],
        slot: Option<u32>,
        kdf: &KdfRequest,
    ) -> Result<u32> {
        if key.is_empty() {
            return Err(Error::InvalidOption(
                "an unbound key needs a key size".into(),
            ));
        }
        self.store_keyslot(dev, key, passphrase, slot, kdf, None, KeyDigest::NewUnbound)
    }

    /// Replaces keyslot `old` with `new_passphrase` for the same key, bound or unbound
    /// (`luksChangeKey`/`luksConvertKey` on an unbound keyslot keep it unbound).
    pub fn change_unbound_keyslot(
        &mut self,
        dev: &mut dyn Storage,
        old_passphrase: &[u8],
        new_passphrase: &[u8],
        old_slot: u32,
        new_slot: Option<u32>,
        kdf: &KdfRequest,
    ) -> Result<u32> {
        let (old, key) = self.open_unbound(dev, old_passphrase, Some(old_slot))?;
        let d = self.unbound_digest(old).expect("an unbound keyslot");
        self.store_keyslot(
            dev,
            &key,
            new_passphrase,
            new_slot,
            kdf,
            Some(old),
            KeyDigest::Existing(d),
        )
    }

    /// `luksChangeKey`: stores the volume key under `new_passphrase` and removes the old slot
    /// in one metadata update. The new slot is `new_slot`, else the first free slot, else the
    /// old slot's number; its material goes to a free area first, so a crash leaves either
    /// the old or the new passphrase working. Only with the keyslots area full is the
    /// keyslot rewritten in its own area (as cryptsetup does), once the new metadata is
    /// known to be committable: a crash in that write loses this keyslot's passphrase.
    /// Returns the new slot.
    pub fn change_keyslot(
        &mut self,
        dev: &mut dyn Storage,
        old_passphrase: &[u8],
        new_passphrase: &[u8],
        old_slot: Option<u32>,
        new_slot: Option<u32>,
        kdf: &KdfRequest,
    ) -> Result<u32> {
        self.check_changeable()?;
        let (old, key) = self.unlock(dev, old_passphrase, old_slot)?;
        self.store_keyslot(
            dev,
            &key,
            new_passphrase,
            new_slot,
            kdf,
            Some(old),
            KeyDigest::DataSegment,
        )
    }

    /// Rewrites both header copies from the metadata `read` chose (`cryptsetup repair`).
    pub fn repair(&mut self, dev: &mut dyn Storage) -> Result<()> {
        if self.in_reencryption() {
            return Err(Luks2Error::InReencryption.into());
        }
        let json = self.json.clone();
        self.commit_despite_requirements(dev, json)
    }

    /// Sets the label (`None` or "" clears it) and writes the header.
    pub fn set_label(&mut self, dev: &mut dyn Storage, label: Option<&str>) -> Result<()> {
        self.set_labels(dev, label.unwrap_or(""), &self.subsystem.clone())
    }

    /// Sets the subsystem (`None` or "" clears it) and writes the header.
    pub fn set_subsystem(&mut self, dev: &mut dyn Storage, subsystem: Option<&str>) -> Result<()> {
        self.set_labels(dev, &self.label.clone(), subsystem.unwrap_or(""))
    }

    /// Sets both the label and the subsystem ("" clears one) in one header write
    /// (cryptsetup's `crypt_set_label`).
    pub fn set_labels(
        &mut self,
        dev: &mut dyn Storage,
        label: &str,
        subsystem: &str,
    ) -> Result<()> {
        self.check_changeable()?;
        check_label(label)?;
        check_label(subsystem)?;
        let (old_l, old_s) = (
            std::mem::replace(&mut self.label, label.into()),
            std::mem::replace(&mut self.subsystem, subsystem.into()),
        );
        let json = self.json.clone();
        if let Err(e) = self.commit(dev, json) {
            self.label = old_l;
            self.subsystem = old_s;
            return Err(e);
        }
        Ok(())
    }

    /// Sets a keyslot's priority (`cryptsetup config --priority`): "normal" removes the
    /// field, as cryptsetup writes it.
    pub fn set_keyslot_priority(
        &mut self,
        dev: &mut dyn Storage,
        slot: u32,
        priority: Priority,
    ) -> Result<()> {
        self.check_changeable()?;
        if !self.model.keyslots.contains_key(&slot) {
            return Err(Error::Keyslot(format!("keyslot {slot} is not active")));
        }
        let mut json = self.json.clone();
        let ks = section_mut(&mut json, "keyslots")?
            .get_mut(&slot.to_string())
            .and_then(Value::as_object_mut)
            .ok_or_else(|| bad("keyslot is not an object"))?;
        match priority {
            Priority::Normal => {
                ks.shift_remove("priority");
            }
            p => {
                ks.insert("priority".into(), json!(p as u8));
            }
        }
        self.commit(dev, json)
    }

    /// Persistent activation flags (`config.flags`, e.g. "allow-discards", "no-read-workqueue").
    pub fn config_flags(&self) -> &[String] {
        &self.model.flags
    }

    /// Replaces the persistent activation flags and writes the header; an empty list removes
    /// the `flags` array.
    pub fn set_config_flags(&mut self, dev: &mut dyn Storage, flags: &[&str]) -> Result<()> {
        self.check_changeable()?;
        if let Some(f) = flags.iter().find(|f| f.is_empty()) {
            return Err(Error::InvalidOption(format!("invalid flag '{f}'")));
        }
        let mut json = self.json.clone();
        let config = section_mut(&mut json, "config")?;
        if flags.is_empty() {
            config.shift_remove("flags");
        } else {
            let mut uniq: Vec<&str> = Vec::new();
            for f in flags {
                if !uniq.contains(f) {
                    uniq.push(f);
                }
            }
            config.insert("flags".into(), uniq.into());
        }
        self.commit(dev, json)
    }

    /// The mandatory requirements when some are not implemented here (a header loaded
    /// with [`Luks2Header::read_ignoring_requirements`]), else `None`.
    pub fn unmet_requirements(&self) -> Option<&[String]> {
        self.unmet_requirements
            .then_some(&self.model.requirements[..])
    }

    /// Mandatory requirements (`config.requirements.mandatory`); non-empty only for headers
    /// loaded with [`Luks2Header::read_ignoring_requirements`].
    pub fn requirements(&self) -> &[String] {
        &self.model.requirements
    }

    /// The whole JSON metadata (for `luksDump --dump-json-metadata`).
    pub fn json(&self) -> &Value {
        &self.json
    }

    /// Tokens by id (read-only).
    pub fn tokens(&self) -> Vec<(u32, &Value)> {
        let Some(t) = self.json.get("tokens").and_then(Value::as_object) else {
            return Vec::new();
        };
        let mut v: Vec<(u32, &Value)> = t
            .iter()
            .filter_map(|(k, v)| model::parse_id(k, "token").ok().map(|id| (id, v)))
            .collect();
        v.sort_by_key(|(id, _)| *id);
        v
    }

    /// Priority of an existing keyslot.
    pub fn keyslot_priority(&self, slot: u32) -> Option<Priority> {
        self.model.keyslots.get(&slot).map(|k| k.priority)
    }

    /// The binary header `label` (`--label`, luksDump "Label"); "" when unset.
    pub fn label(&self) -> &str {
        &self.label
    }
    /// The binary header `subsystem` (`--subsystem`); "" when unset.
    pub fn subsystem(&self) -> &str {
        &self.subsystem
    }
    /// The sequence id ("Epoch" in luksDump).
    pub fn seqid(&self) -> u64 {
        self.seqid
    }
    /// Size of one header copy (binary header + JSON area).
    pub fn hdr_size(&self) -> u64 {
        self.hdr_size
    }
    /// Size of the JSON area.
    pub fn json_size(&self) -> u64 {
        self.model.json_size
    }
    /// Size in bytes of the keyslots area that follows the two header copies
    /// (JSON `config.keyslots_size`).
    pub fn keyslots_size(&self) -> u64 {
        self.model.keyslots_size
    }
    /// Which copies `read` found valid.
    pub fn copy_status(&self) -> &CopyStatus {
        &self.status
    }
    /// Both copies valid and with the same seqid (otherwise `repair` would rewrite one).
    pub fn copies_in_sync(&self) -> bool {
        self.in_sync
    }
}

/// A keyslot area cipher the user chose: one cryptblk can run, with a key size it takes.
pub(crate) fn check_keyslot_encryption(cipher: &str, key_bytes: usize) -> Result<()> {
    let spec = CipherSpec::parse(cipher)
        .map_err(|e| Error::InvalidOption(format!("keyslot cipher {cipher}: {e}")))?;
    if key_bytes == 0 || !spec.valid_key_len(key_bytes) {
        return Err(Error::InvalidOption(format!(
            "keyslot cipher {cipher} takes no {}-bit key",
            key_bytes * 8
        )));
    }
    Ok(())
}

/// Keyslot area encryption as cryptsetup picks it (`crypt_keyslot_get_encryption`): the
/// data segment's cipher with the volume key size, unless that cipher cannot protect a
/// keyslot (cipher_null), then aes-xts-plain64 with a 512-bit key.
fn keyslot_cipher(cipher: &CipherSpec, key_len: usize) -> (String, usize) {
    if cipher.cipher == cryptblk_crypto::BlockCipherAlg::Null {
        ("aes-xts-plain64".into(), 64)
    } else {
        (cipher.to_string(), key_len)
    }
}

fn wipe_zero(dev: &mut dyn Storage, offset: u64, len: u64) -> Result<()> {
    let buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        dev.write_at(&buf[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

impl LuksHeader for Luks2Header {
    fn version(&self) -> u8 {
        2
    }
    fn segments_from_volume_key(
        &self,
        volume_key: &[u8],
        data_size: u64,
    ) -> Result<Vec<SegmentKey>> {
        self.check_usable()?;
        if self.segment().kind == "linear" {
            return Err(Luks2Error::PlainData(self.segment().offset).into());
        }
        if self.in_reencryption() || self.interrupted_step() {
            return Err(Error::InvalidOption(
                "a volume in the middle of a reencryption opens with its passphrase only".into(),
            ));
        }
        let (_, digest) = self.segment_digest()?;
        // With every keyslot gone (erase) the key size is unknown: the digest decides.
        let wrong_len = self.key_len != 0 && volume_key.len() != self.key_len;
        if wrong_len || !digest::verify(digest, volume_key)? {
            return Err(Error::WrongPassphrase);
        }
        crate::single_segment_with_key(self, volume_key, data_size)
    }
    fn tokens(&self) -> Vec<(u32, Value)> {
        self.json["tokens"]
            .as_object()
            .map(|t| {
                t.iter()
                    .filter_map(|(id, v)| Some((id.parse().ok()?, v.clone())))
                    .collect()
            })
            .unwrap_or_default()
    }
    fn set_keyslot_encryption(&mut self, cipher: &str, key_bytes: usize) -> Result<()> {
        check_keyslot_encryption(cipher, key_bytes)?;
        self.keyslot_encryption = Some((cipher.to_string(), key_bytes));
        Ok(())
    }
    fn uuid(&self) -> &str {
        &self.uuid
    }
    fn cipher(&self) -> CipherSpec {
        self.cipher
    }
    fn integrity(&self) -> Option<crate::SegmentIntegrity> {
        self.segment().integrity.clone()
    }
    fn key_len(&self) -> usize {
        self.key_len
    }
    fn sector_size(&self) -> u32 {
        self.segment().sector_size
    }
    /// cryptsetup never sets dm-crypt's `iv_large_sectors` for LUKS2 (only BITLK and plain
    /// `--iv-large-sectors` do; see lib/libdevmapper.c and lib/luks2/luks2_json_metadata.c:
    /// the LUKS2 table gets `sector_size:N` but not the IV flag), so IVs count 512-byte
    /// sectors even with 4096-byte encryption sectors. `iv_tweak` is dm-crypt's `iv_offset`,
    /// also in 512-byte sectors.
    fn iv_options(&self) -> IvOptions {
        IvOptions {
            large_sectors: false,
            offset: self.segment().iv_tweak,
        }
    }
    fn data_offset(&self) -> u64 {
        self.segment().offset
    }
    fn data_length(&self) -> Option<u64> {
        self.segment().size
    }
    fn header_size(&self) -> u64 {
        2 * self.hdr_size + self.model.keyslots_size
    }
    /// Only the keyslots present in the JSON (all `active`), in id order.
    fn keyslots(&self) -> Vec<KeyslotInfo> {
        self.model
            .keyslots
            .iter()
            .map(|(id, k)| {
                let p = k.params.as_ref().ok();
                KeyslotInfo {
                    id: *id,
                    active: true,
                    kdf: p.map(|p| p.kdf.clone()),
                    salt: p.map(|p| p.salt.clone()).unwrap_or_default(),
                    area_offset: k.area_offset,
                    area_size: k.area_size,
                    stripes: p.map_or(0, |p| p.stripes),
                    af_hash: p.map_or(cryptblk_crypto::HashAlg::Sha256, |p| p.af_hash),
                }
            })
            .collect()
    }
    fn max_keyslots(&self) -> u32 {
        MAX_OBJECTS
    }
    /// Tries `slot`, or every keyslot bound to the data segment: "prefer" slots first, then
    /// "normal" ones; "ignore" slots only when named.
    fn unlock(
        &self,
        dev: &mut dyn Storage,
        passphrase: &[u8],
        slot: Option<u32>,
    ) -> Result<(u32, SecretBytes)> {
        // A passphrase may be checked and the volume key read on a header with unknown
        // requirements (cryptsetup: `--test-passphrase`, `luksDump --dump-volume-key`);
        // mapping it is refused (`unlock_segments`), and so is any change (`commit`).
        self.check_segment_supported()?;
        if self.segment().kind == "linear" && !self.in_reencryption() {
            return Err(Luks2Error::PlainData(self.segment().offset).into());
        }
        let (digest_id, _) = self.segment_digest()?;
        if let Some(r) = self.model.reencryption()? {
            // Both keys and the verification digest: a passphrase that opens only one side,
            // or forged metadata, does not open the volume.
            let (slot, mut keys) = self.open_reencryption_keys(&r, dev, passphrase, slot)?;
            let i = keys
                .iter()
                .position(|(d, _)| *d == digest_id)
                .ok_or(Error::WrongPassphrase)?;
            return Ok((slot, keys.swap_remove(i).1));
        }
        // No keyslot to try at all (an erased header): cryptsetup's own words, exit 1.
        if slot.is_none()
            && !self.model.digests[&digest_id].keyslots.iter().any(|id| {
                self.model
                    .keyslots
                    .get(id)
                    .is_some_and(|k| k.priority != model::Priority::Ignore)
            })
        {
            return Err(Error::NoUsableKeyslot);
        }
        self.open_digest(dev, digest_id, passphrase, slot)
    }
    /// Mid-reencryption: every regular segment with its own key, cipher and place, laid
    /// out as cryptsetup maps them. A step cut off by a crash (a segment flagged
    /// `in-reencryption`) must be recovered first; that is refused here.
    fn unlock_segments(
        &self,
        dev: &mut dyn Storage,
        passphrase: &[u8],
        slot: Option<u32>,
        data_size: u64,
    ) -> Result<(u32, Vec<SegmentKey>)> {
        self.check_usable()?;
        let Some(r) = self.model.reencryption()? else {
            return crate::single_segment(self, dev, passphrase, slot, data_size);
        };
        if let Some(hot) = r.hot {
            return Err(Luks2Error::ReencryptionCrashed(hot).into());
        }
        let layout = r.layout(&self.model, data_size)?;
        let (slot, keys) = self.open_reencryption_keys(&r, dev, passphrase, slot)?;
        let out = keyed_segments(&self.model, layout, &keys)?;
        Ok((slot, out))
    }
    fn recover_interrupted_step(
        &mut self,
        dev: &mut dyn Storage,
        data: &dyn Storage,
        passphrase: &[u8],
        slot: Option<u32>,
        data_size: u64,
    ) -> Result<bool> {
        self.check_usable()?;
        let model = self.model.clone();
        let Some(r) = model.reencryption()? else {
            return Ok(false);
        };
        if r.hot.is_none() {
            return Ok(false);
        }
        let (_, keys) = self.open_reencryption_keys(&r, dev, passphrase, slot)?;
        let key_of = |seg: (u32, &model::Segment)| {
            let d = model.segment_digest(seg.0).map(|(d, _)| d)?;
            keys.iter().find(|(k, _)| *k == d).map(|(_, k)| k.as_ref())
        };
        let (old, new) = (key_of(r.previous), key_of(r.final_));
        // Data first, synced; then the metadata that says it is done.
        r.rewrite_hot_zone(&model, &*dev, data, old, new)?;
        data.sync()?;
        let after = r.after_recovery(&model, &self.json, data_size)?;
        self.commit(dev, after.json)?;
        for (off, len) in after.wipe_header {
            keyslot::wipe_area(dev, off, len)?;
        }
        dev.sync()?;
        if after.finish_after_wipe {
            self.finish_reencryption(dev, data, data_size, true)?;
        }
        Ok(true)
    }
    /// Every passphrase keyslot goes in one commit, their areas wiped after; allowed in
    /// the middle of a reencryption (its own keyslot stays: the metadata needs it, and it
    /// holds no key).
    fn erase(&mut self, dev: &mut dyn Storage) -> Result<()> {
        self.check_segment_supported()?;
        let mut json = self.json.clone();
        let mut areas = Vec::new();
        for (id, k) in &self.model.keyslots {
            if k.reencrypt.is_none() {
                remove_keyslot_json(&mut json, *id)?;
                areas.push((k.area_offset, k.area_size));
            }
        }
        self.commit_despite_requirements(dev, json)?;
        for (off, len) in areas {
            keyslot::wipe_area(dev, off, len)?;
        }
        dev.sync()?;
        Ok(())
    }
    fn in_reencryption(&self) -> bool {
        self.model
            .requirements
            .iter()
            .any(|r| reencrypt::is_known_requirement(r))
    }
    fn interrupted_step(&self) -> bool {
        self.model
            .segments
            .values()
            .any(|s| !s.is_backup() && s.in_reencryption())
    }
    fn set_uuid(&mut self, dev: &mut dyn Storage, uuid: &str) -> Result<()> {
        self.check_changeable()?;
        let parsed = uuid::Uuid::try_parse(uuid)
            .ok()
            .filter(|_| uuid.len() == 36)
            .ok_or_else(|| Luks2Error::InvalidUuid(uuid.into()))?;
        let old = std::mem::replace(&mut self.uuid, parsed.hyphenated().to_string());
        let json = self.json.clone();
        if let Err(e) = self.commit(dev, json) {
            self.uuid = old;
            return Err(e);
        }
        Ok(())
    }
    fn verify_volume_key(&self, key: &[u8]) -> Result<bool> {
        let (_, digest) = self.segment_digest()?;
        digest::verify(digest, key)
    }
    fn add_keyslot(
        &mut self,
        dev: &mut dyn Storage,
        volume_key: &[u8],
        passphrase: &[u8],
        slot: Option<u32>,
        kdf: &KdfRequest,
    ) -> Result<u32> {
        self.store_keyslot(
            dev,
            volume_key,
            passphrase,
            slot,
            kdf,
            None,
            KeyDigest::DataSegment,
        )
    }
    /// Removes the slot from the metadata (and from digests and tokens), commits, then
    /// wipes its area: a crash in between leaves unreferenced material, never a listed
    /// slot whose material is gone.
    /// [`Luks2Header::change_keyslot`] for a caller that already unlocked `old_slot` and
    /// holds the volume key: the new slot and the removal of the old one in one metadata
    /// update, so a crash leaves exactly the old or exactly the new passphrase.
    fn replace_keyslot(
        &mut self,
        dev: &mut dyn Storage,
        old_slot: u32,
        volume_key: &[u8],
        new_passphrase: &[u8],
        new_slot: Option<u32>,
        kdf: &KdfRequest,
    ) -> Result<u32> {
        if !self.model.keyslots.contains_key(&old_slot) {
            return Err(Error::Keyslot(format!("keyslot {old_slot} is not active")));
        }
        self.store_keyslot(
            dev,
            volume_key,
            new_passphrase,
            new_slot,
            kdf,
            Some(old_slot),
            KeyDigest::DataSegment,
        )
    }

    fn kill_keyslot(&mut self, dev: &mut dyn Storage, slot: u32) -> Result<()> {
        // Allowed on a header with unknown requirements, as in cryptsetup: it only
        // takes away.
        self.check_segment_supported()?;
        if self.in_reencryption() {
            return Err(Luks2Error::InReencryption.into());
        }
        let k = self
            .model
            .keyslots
            .get(&slot)
            .ok_or_else(|| Error::Keyslot(format!("keyslot {slot} is not active")))?;
        let (off, len) = (k.area_offset, k.area_size);
        let mut json = self.json.clone();
        remove_keyslot_json(&mut json, slot)?;
        // An unbound key's digest goes with its last keyslot (it serves nothing else).
        let empty = |d: &Value, k: &str| {
            d.get(k)
                .and_then(Value::as_array)
                .is_some_and(|a| a.is_empty())
        };
        section_mut(&mut json, "digests")?
            .retain(|_, d| !(empty(d, "keyslots") && empty(d, "segments")));
        self.commit_despite_requirements(dev, json)?;
        keyslot::wipe_area(dev, off, len)?;
        dev.sync()?;
        Ok(())
    }
}

impl Luks2Header {
    /// The resilience of the reencryption in progress (`checksum`, `journal`, ...).
    pub fn reencryption_resilience(&self) -> Option<String> {
        let r = self.model.reencryption().ok().flatten()?;
        Some(r.params.resilience.name().to_string())
    }

    pub(crate) fn segment(&self) -> &model::Segment {
        // refresh() guarantees the default segment exists.
        &self.model.segments[&self.segment_id]
    }
}

/// The options LUKS2 cannot hold, checked before anything is written; returns the
/// metadata (binary header + JSON) size.
fn check_format_options(opts: &FormatOptions, volume_key: &[u8]) -> Result<u64> {
    let key_len = opts.key_len;
    if let Some(i) = &opts.integrity {
        if i.journal_encryption != "none" || i.journal_integrity != "none" {
            return Err(Error::InvalidOption(
                "journal encryption or integrity (cryptsetup refuses them for LUKS2)".into(),
            ));
        }
        cryptblk_crypto::AeadSectorCipher::new(
            &i.encryption,
            &i.kind,
            volume_key,
            opts.sector_size,
            0,
        )
        .map_err(|e| Error::InvalidOption(format!("--integrity {}: {e}", i.kind)))?;
    } else if volume_key.len() != key_len || !opts.cipher.valid_key_len(key_len) {
        return Err(Error::InvalidOption(format!(
            "{}-bit key for {} (volume key has {} bytes)",
            key_len * 8,
            opts.cipher,
            volume_key.len()
        )));
    }
    if !matches!(opts.sector_size, 512 | 1024 | 2048 | 4096) {
        return Err(Error::InvalidOption(format!(
            "sector size {}",
            opts.sector_size
        )));
    }
    let hdr_size = opts.luks2_metadata_size.unwrap_or(DEFAULT_HDR_SIZE);
    if !HDR_SIZES.contains(&hdr_size) {
        return Err(Error::InvalidOption(format!(
            "unsupported LUKS2 metadata size {hdr_size}"
        )));
    }
    if let Some(ks) = opts.luks2_keyslots_size
        && (ks % 4096 != 0 || ks > MAX_KEYSLOTS_SIZE)
    {
        return Err(Error::InvalidOption(format!(
            "unsupported LUKS2 keyslots size {ks}"
        )));
    }
    if let Some(off) = opts.data_offset
        && off % (opts.sector_size as u64).max(512) != 0
    {
        return Err(Error::InvalidOption(format!(
            "data offset {off} is not aligned to the {}-byte sector size",
            opts.sector_size
        )));
    }
    if let Some(slot) = opts.keyslot
        && slot >= MAX_OBJECTS
    {
        return Err(Error::Keyslot(format!(
            "keyslot {slot} out of range (0..{MAX_OBJECTS})"
        )));
    }
    Ok(hdr_size)
}

/// Zeros over both header copies (and on up to the data, unless detached), random data
/// over the keyslots area, as `luksFormat` leaves a device.
fn wipe_for_format(
    dev: &mut dyn Storage,
    hdr_size: u64,
    keyslots_size: u64,
    data_offset: u64,
    detached: bool,
) -> Result<()> {
    let meta_end = 2 * hdr_size + keyslots_size;
    let zero_end = if detached {
        meta_end
    } else {
        data_offset.max(meta_end)
    };
    wipe_zero(dev, 0, zero_end)?;
    keyslot::wipe_area(dev, 2 * hdr_size, keyslots_size)?;
    Ok(())
}

/// The JSON metadata of a new volume: one keyslot, one digest, one crypt segment.
fn initial_metadata(
    opts: &FormatOptions,
    keyslots: Map<String, Value>,
    digest: Value,
    data_offset: u64,
    hdr_size: u64,
    keyslots_size: u64,
) -> Value {
    let mut segment = json!({
        "type": "crypt",
        "offset": data_offset.to_string(),
        "size": "dynamic",
        "iv_tweak": "0",
        "encryption": opts.cipher.to_string(),
        "sector_size": opts.sector_size,
    });
    if let Some(i) = &opts.integrity {
        segment["encryption"] = json!(i.encryption);
        segment["integrity"] = json!({
            "type": i.kind,
            "journal_encryption": i.journal_encryption,
            "journal_integrity": i.journal_integrity,
        });
    }
    json!({
        "keyslots": keyslots,
        "tokens": {},
        "segments": { "0": segment },
        "digests": { "0": digest },
        "config": {
            "json_size": (hdr_size - BIN_HDR_LEN as u64).to_string(),
            "keyslots_size": keyslots_size.to_string(),
        },
    })
}

/// The stretches of a layout mid-reencryption, each with its cipher and the key (of
/// `keys`, by digest id) its segment is bound to; a `linear` stretch is plaintext.
pub(super) fn keyed_segments(
    model: &Model,
    layout: Vec<reencrypt::Stretch>,
    keys: &[(u32, SecretBytes)],
) -> Result<Vec<SegmentKey>> {
    let mut out = Vec::with_capacity(layout.len());
    for st in layout {
        let seg = &model.segments[&st.segment];
        let (cipher, sector_size, iv_offset, key) = if seg.kind == "linear" {
            (
                CipherSpec::parse("cipher_null-ecb")?,
                512,
                0,
                SecretBytes::zeroed(0),
            )
        } else if seg.kind == "crypt" {
            let cipher = CipherSpec::parse(&seg.encryption).map_err(|_| {
                Luks2Error::Unsupported(format!("data cipher '{}'", seg.encryption))
            })?;
            let key = keys
                .iter()
                .find(|(d, _)| model.digests[d].segments.contains(&st.segment))
                .ok_or_else(|| {
                    Luks2Error::InvalidMetadata(format!(
                        "segment {} is bound to neither key of the reencryption",
                        st.segment
                    ))
                })?;
            (cipher, seg.sector_size, seg.iv_tweak, key.1.clone())
        } else {
            return Err(
                Luks2Error::Unsupported(format!("data segment of type '{}'", seg.kind)).into(),
            );
        };
        if seg.integrity.is_some() {
            return Err(Luks2Error::Unsupported(
                "reencryption of a data segment with integrity protection (dm-integrity)".into(),
            )
            .into());
        }
        out.push(SegmentKey {
            start: st.start,
            len: st.len,
            storage_offset: seg.offset,
            cipher,
            sector_size,
            iv: IvOptions {
                large_sectors: false,
                offset: iv_offset,
            },
            key,
            integrity: None,
        });
    }
    Ok(out)
}
