//! Starting a reencryption (`reencrypt --init-only`): a key change, an encryption in place
//! with a detached header, a decryption; the metadata cryptsetup writes for each, in one
//! commit, no data touched.

use super::json::{
    add_reencrypt_keyslot, copy_token_assignments, lowest_free, seal_reencryption, seg_json,
    start_segments,
};
use super::metadata::ResilienceRequest;
use crate::luks2::model::Segment;
use crate::luks2::{Luks2Error, Luks2Header, bad, digest, keyslot, section_mut};
use crate::{Error, FormatOptions, LuksHeader, MemStorage, Result, Storage};
use cryptblk_crypto::{CipherSpec, IvOptions, KdfRequest, SecretBytes, SectorCipher, random_bytes};
use serde_json::{Value, json};

/// What `reencrypt` changes, and how it protects itself.
#[derive(Debug, Clone)]
pub struct ReencryptRequest {
    /// New data cipher (`--cipher`); the current one if `None`.
    pub cipher: Option<CipherSpec>,
    /// New volume key length in bytes (`--key-size` / 8); the current one if `None`.
    pub key_len: Option<usize>,
    /// New encryption sector size (`--sector-size`); the current one if `None`.
    pub sector_size: Option<u32>,
    /// `--resilience`.
    pub resilience: ResilienceRequest,
    /// KDF of the new keyslot that holds the new key under the same passphrase.
    pub kdf: KdfRequest,
    /// `--keyslot-cipher` and `--keyslot-key-size` (bytes) of that keyslot's area; else the
    /// encryption of the keyslot the passphrase opened (cryptsetup's choice), or, for a new
    /// header, the data cipher.
    pub keyslot_encryption: Option<(String, usize)>,
}

/// Checksum blocks: 4096 bytes where the data allows (cryptsetup's block for image files),
/// never smaller than a sector of either layout, always dividing the data.
fn checksum_block(old: &Segment, new_sector: u32, data_size: u64) -> Result<u64> {
    let total = match old.size {
        Some(len) => len,
        None => data_size.checked_sub(old.offset).ok_or_else(|| {
            bad(format!(
                "data device ({data_size} bytes) ends before the data offset"
            ))
        })?,
    };
    let sectors = new_sector.max(old.sector_size) as u64;
    if total == 0 || !total.is_multiple_of(sectors) {
        return Err(Luks2Error::Unsupported(format!(
            "data size {total} is not a whole number of {sectors}-byte sectors"
        ))
        .into());
    }
    let mut block = 4096u64.max(sectors);
    while !total.is_multiple_of(block) {
        block /= 2;
    }
    Ok(block)
}

impl Luks2Header {
    /// The data segment a new job starts from: a header that can be changed, with no job
    /// in progress and one encrypted segment that runs to the end of the device.
    pub(super) fn startable_segment(&self) -> Result<(u32, Segment)> {
        self.check_usable()?;
        if self.in_reencryption() {
            return Err(Luks2Error::Unsupported(
                "a reencryption is already in progress; resume it (--resume-only)".into(),
            )
            .into());
        }
        let seg = self.segment().clone();
        if seg.integrity.is_some() {
            // As cryptsetup: the tags would have to be rewritten with the data.
            return Err(Luks2Error::Unsupported(
                "reencryption of a volume with integrity protection".into(),
            )
            .into());
        }
        let regular = self
            .model
            .segments
            .values()
            .filter(|s| !s.is_backup())
            .count();
        if seg.kind != "crypt" || regular != 1 || seg.size.is_some() {
            return Err(Luks2Error::Unsupported(
                "cryptblk starts jobs on volumes of one encrypted segment that runs to the \
                 end of the device"
                    .into(),
            )
            .into());
        }
        Ok((self.segment_id, seg))
    }

    /// Starts a reencryption (`reencrypt --init-only`): a new random volume key in a new
    /// keyslot under the same passphrase, the `reencrypt` keyslot, the backup segments, the
    /// verification digest and the `online-reencrypt-v2` requirement, in one commit. No
    /// data is touched (`data_size`: bytes of the data device). Returns the new keyslot.
    pub fn reencrypt_init(
        &mut self,
        dev: &mut dyn Storage,
        data_size: u64,
        passphrase: &[u8],
        slot: Option<u32>,
        req: &ReencryptRequest,
    ) -> Result<u32> {
        self.reencrypt_init_shifted(dev, data_size, passphrase, slot, req, None)
    }

    /// [`Self::reencrypt_init`] with the data moving `shift` bytes up as it is reencrypted
    /// (`reencrypt --reduce-device-size`, cryptsetup's backward `datashift`): the new
    /// layout starts `shift` bytes later and the volume ends that much smaller.
    pub fn reencrypt_shift_init(
        &mut self,
        dev: &mut dyn Storage,
        data_size: u64,
        passphrase: &[u8],
        slot: Option<u32>,
        req: &ReencryptRequest,
        shift: u64,
    ) -> Result<u32> {
        let seg = self.segment();
        let ss = u64::from(
            req.sector_size
                .unwrap_or(seg.sector_size)
                .max(seg.sector_size),
        );
        let left = data_size.saturating_sub(seg.offset + shift);
        if shift == 0 || shift > crate::luks2::MAX_REDUCE || !shift.is_multiple_of(ss) {
            return Err(Error::InvalidOption(format!(
                "--reduce-device-size {shift}: a multiple of the {ss}-byte sector size, at \
                 most 1 GiB"
            )));
        }
        if left < ss || !left.is_multiple_of(ss) {
            return Err(Error::InvalidOption(format!(
                "not enough space for --reduce-device-size {shift}: the data would start at \
                 {} of a {data_size}-byte device (nothing was written)",
                seg.offset + shift
            )));
        }
        self.reencrypt_init_shifted(dev, data_size, passphrase, slot, req, Some(shift))
    }

    fn reencrypt_init_shifted(
        &mut self,
        dev: &mut dyn Storage,
        data_size: u64,
        passphrase: &[u8],
        slot: Option<u32>,
        req: &ReencryptRequest,
        shift: Option<u64>,
    ) -> Result<u32> {
        let (seg_id, old_seg) = self.startable_segment()?;
        let (old_digest, digest) = self.segment_digest()?;
        // The new key gets a keyslot under this passphrase only; the other keyslots of the
        // old key go when the job finishes. As in cryptsetup, that needs them named.
        let slots = digest.keyslots.len();
        if slot.is_none() && slots > 1 {
            return Err(Luks2Error::Unsupported(format!(
                "{slots} keyslots hold the volume key: name the one to keep with --key-slot \
                 (the others are removed when the reencryption finishes)"
            ))
            .into());
        }
        let (old_slot, old_key) = self.open_digest(dev, old_digest, passphrase, slot)?;
        let cipher = req.cipher.unwrap_or(self.cipher);
        let key_len = req.key_len.unwrap_or(old_key.len());
        let sector_size = req.sector_size.unwrap_or(old_seg.sector_size);
        let mut new_key = SecretBytes::zeroed(key_len);
        random_bytes(&mut new_key)?;
        // Refuses what the new layout cannot be (cipher, key length, sector size) before
        // anything is written.
        SectorCipher::new(cipher, &new_key, sector_size, IvOptions::default())?;
        let hash = req.kdf.hash;

        // The new keyslot's material first (synced; unreferenced until the commit).
        // cryptsetup gives the new keyslot the area encryption of the one it opened
        // (`set_keyslot_params`; cipher_null's becomes the default), whatever the new data
        // cipher; `--keyslot-cipher` overrides it here (cryptsetup 2.6 ignores it).
        let area = match &req.keyslot_encryption {
            Some((c, bytes)) => {
                crate::luks2::check_keyslot_encryption(c, *bytes)?;
                (c.clone(), *bytes)
            }
            None => match &self.model.keyslots[&old_slot].params {
                Ok(k) if k.area_cipher.cipher != cryptblk_crypto::BlockCipherAlg::Null => {
                    (k.area_cipher.to_string(), k.area_key_size)
                }
                _ => ("aes-xts-plain64".to_string(), 64),
            },
        };
        let (new_slot, ks_json) =
            self.new_keyslot_material(dev, &new_key, &area, passphrase, &req.kdf)?;
        let mut json = self.json.clone();
        section_mut(&mut json, "keyslots")?.insert(new_slot.to_string(), ks_json);
        // Tokens that unlock the old keyslot unlock the new one too (cryptsetup's
        // assign_tokens), so they still work once the old one is gone.
        copy_token_assignments(&mut json, old_slot, new_slot)?;
        let block = checksum_block(&old_seg, sector_size, data_size)?;
        let reenc_slot = add_reencrypt_keyslot(
            &mut json,
            self.hdr_size,
            "reencrypt",
            "forward",
            req.resilience,
            block,
        )?;
        if let Some(shift) = shift {
            // cryptsetup's backward data shift: a 4 KiB area, the shift instead of hashes.
            let ks = &mut json["keyslots"][reenc_slot.to_string()];
            ks["direction"] = json!("backward");
            let offset = ks["area"]["offset"].clone();
            ks["area"] = json!({"offset": offset, "size": "4096", "type": "datashift",
                                "shift_size": shift.to_string()});
        }
        let mut final_seg = old_seg.clone();
        final_seg.encryption = cipher.to_string();
        final_seg.sector_size = sector_size;
        let final_at = old_seg.offset + shift.unwrap_or(0);
        let final_json = seg_json(&final_seg, final_at, 0, None, Some("backup-final"));
        start_segments(&mut json, seg_id, final_json);
        let iterations = digest::iterations(hash, key_len, req.kdf.forced_iterations.is_some())?;
        // Digest ids: inserting a keyslot changed none.
        let new_digest = lowest_free(&self.model.digests)?;
        let digests = section_mut(&mut json, "digests")?;
        digests
            .get_mut(&old_digest.to_string())
            .ok_or_else(|| bad("digest missing"))?["segments"] = json!(["0", "1"]);
        digests.insert(
            new_digest.to_string(),
            digest::create(&new_key, hash, iterations, &[new_slot], &[2])?,
        );
        seal_reencryption(
            &mut json,
            self.hdr_size,
            reenc_slot,
            Some(&old_key),
            Some(&new_key),
            &req.kdf,
        )?;
        self.commit(dev, json)?;
        Ok(new_slot)
    }

    /// Starts encrypting a device that holds plaintext, in place, with a detached header
    /// (`reencrypt --encrypt --header FILE`): a new LUKS2 header for `dev` (the header
    /// file) whose metadata says the whole data device (`data_size` bytes) is plaintext
    /// to be encrypted under a new random key (`req`: cipher, key size, sector size;
    /// defaults aes-xts-plain64, 512 bits, 512-byte sectors), with cryptsetup's
    /// reencryption metadata. The header is built in memory and written in one go, so
    /// that no crash leaves a header that claims the plaintext is encrypted.
    pub fn encrypt_init(
        dev: &mut dyn Storage,
        data_size: u64,
        passphrase: &[u8],
        req: &ReencryptRequest,
    ) -> Result<Luks2Header> {
        let opts = Self::encrypt_options(req, None);
        let ss = opts.sector_size as u64;
        if data_size == 0 || !data_size.is_multiple_of(ss) {
            return Err(Luks2Error::Unsupported(format!(
                "a data device of {data_size} bytes is not a whole number of {ss}-byte sectors"
            ))
            .into());
        }
        let mut key = SecretBytes::zeroed(opts.key_len);
        random_bytes(&mut key)?;
        let mut mem = MemStorage::new(dev.size()?);
        let mut hdr = Luks2Header::format(&mut mem, &opts, &key, passphrase)?;
        let json = hdr.encrypt_metadata(data_size, &key, req)?;
        hdr.commit(&mut mem, json)?;
        // The whole header area in one write, then synced.
        let mut image = vec![0u8; mem.size()? as usize];
        mem.read_at(&mut image, 0)?;
        dev.write_at(&image, 0)?;
        dev.sync()?;
        Ok(hdr)
    }

    /// The format options of a new encryption: the request's cipher, key size and sector
    /// size (defaults aes-xts-plain64, 512 bits, 512-byte sectors); the header detached
    /// (data offset 0) unless `data_offset` puts it at the head of the device.
    pub(super) fn encrypt_options(
        req: &ReencryptRequest,
        data_offset: Option<u64>,
    ) -> FormatOptions {
        let mut opts = FormatOptions::new(req.kdf.clone());
        if let Some(c) = req.cipher {
            opts.cipher = c;
            opts.key_len = c.default_key_len();
        }
        opts.key_len = req.key_len.unwrap_or(opts.key_len);
        opts.sector_size = req.sector_size.unwrap_or(512);
        opts.hash = req.kdf.hash;
        opts.detached_header = data_offset.is_none();
        opts.data_offset = Some(data_offset.unwrap_or(0));
        opts.keyslot_encryption = req.keyslot_encryption.clone();
        opts
    }

    /// The metadata of an encryption in place from a freshly formatted detached header:
    /// the data plaintext (linear) now, the formatted segment as the final layout, the
    /// reencrypt keyslot, the verification digest over the new key.
    fn encrypt_metadata(
        &self,
        data_size: u64,
        key: &[u8],
        req: &ReencryptRequest,
    ) -> Result<Value> {
        let mut json = self.json.clone();
        let mut final_seg = json["segments"][self.segment_id.to_string()].clone();
        final_seg["flags"] = json!(["backup-final"]);
        let linear = |flag: Option<&str>| {
            let mut l = json!({"type": "linear", "offset": "0", "size": "dynamic"});
            if let Some(f) = flag {
                l["flags"] = json!([f]);
            }
            l
        };
        json["segments"] =
            json!({"0": linear(None), "1": linear(Some("backup-previous")), "2": final_seg});
        let (digest_id, _) = self.segment_digest()?;
        section_mut(&mut json, "digests")?
            .get_mut(&digest_id.to_string())
            .ok_or_else(|| bad("digest missing"))?["segments"] = json!(["2"]);
        let mut block = 4096u64.max(self.segment().sector_size as u64);
        while !data_size.is_multiple_of(block) {
            block /= 2;
        }
        let reenc_slot = add_reencrypt_keyslot(
            &mut json,
            self.hdr_size,
            "encrypt",
            "forward",
            req.resilience,
            block,
        )?;
        seal_reencryption(
            &mut json,
            self.hdr_size,
            reenc_slot,
            None,
            Some(key),
            &req.kdf,
        )?;
        Ok(json)
    }

    /// Starts decrypting the volume in place (`reencrypt --decrypt`; the header should be
    /// detached, else the plaintext ends up behind it): the data under the current key
    /// now, plaintext (`linear`) as the final layout, steps from the end to the start as
    /// cryptsetup runs decryption, the verification digest over the old key. Every
    /// keyslot goes when the job finishes.
    pub fn decrypt_init(
        &mut self,
        dev: &mut dyn Storage,
        data_size: u64,
        passphrase: &[u8],
        slot: Option<u32>,
        req: &ReencryptRequest,
    ) -> Result<()> {
        let (seg_id, old_seg) = self.startable_segment()?;
        let (old_digest, _) = self.segment_digest()?;
        let (_, old_key) = self.open_digest(dev, old_digest, passphrase, slot)?;
        let mut json = self.json.clone();
        let block = checksum_block(&old_seg, 512, data_size)?;
        let reenc_slot = add_reencrypt_keyslot(
            &mut json,
            self.hdr_size,
            "decrypt",
            "backward",
            req.resilience,
            block,
        )?;
        let plain = json!({"type": "linear", "offset": old_seg.offset.to_string(),
                           "size": "dynamic", "flags": ["backup-final"]});
        start_segments(&mut json, seg_id, plain);
        section_mut(&mut json, "digests")?
            .get_mut(&old_digest.to_string())
            .ok_or_else(|| bad("digest missing"))?["segments"] = json!(["0", "1"]);
        seal_reencryption(
            &mut json,
            self.hdr_size,
            reenc_slot,
            Some(&old_key),
            None,
            &req.kdf,
        )?;
        self.commit(dev, json)
    }

    /// Writes (and syncs) a keyslot's material for `key` into a free area; returns the
    /// slot id and its JSON, which nothing references yet.
    fn new_keyslot_material(
        &self,
        dev: &mut dyn Storage,
        key: &[u8],
        area: &(String, usize),
        passphrase: &[u8],
        kdf: &KdfRequest,
    ) -> Result<(u32, Value)> {
        let slot = lowest_free(&self.model.keyslots)?;
        let area_size = keyslot::area_size_for(key.len());
        let area_offset = keyslot::find_area_gap(&self.model, self.hdr_size, area_size)
            .ok_or(Luks2Error::NoKeyslotSpace)?;
        let (area_cipher, area_key_size) = area.clone();
        let ks_json = keyslot::create(
            dev,
            &keyslot::NewKeyslot {
                kdf: kdf.resolve(key.len())?,
                af_hash: kdf.hash,
                area_cipher: &area_cipher,
                area_key_size,
                area_offset,
                area_size,
            },
            key,
            passphrase,
        )?;
        dev.sync()?;
        Ok((slot, ks_json))
    }
}
