//! Encryption in place with the header at the head of the device (`reencrypt --encrypt
//! --reduce-device-size R`), in cryptsetup's layout (lib/luks2/luks2_reencrypt.c, "data
//! move"): the header takes the first `S = R/2` bytes, so the data's first `S` bytes are
//! first copied to the last `S` bytes of the device (the `backup-moved-segment`), then the
//! header is written; the steps run from the end to the start, each reading `S` bytes of
//! plaintext at virtual offset `v` and writing them encrypted at `S + v` (resilience
//! `datashift`: the source is never overwritten before it is converted); the last step
//! reads the moved copy. Finishing wipes the copy. The volume ends `S` bytes smaller than
//! the device (`R` smaller until the copy's space is handed back when the job finishes,
//! as cryptsetup leaves it). Also the source of a key change that moves the data up.

use super::json::{lowest_free, seal_reencryption, with_segments};
use super::metadata::Reencryption;
use crate::luks2::model::{Model, ReencryptDirection, ReencryptMode, Resilience};
use crate::luks2::{Luks2Error, Luks2Header, bad, keyslot, section_mut};
use crate::{Error, MemStorage, Result, Storage};
use serde_json::{Value, json};
use zeroize::Zeroizing;

/// cryptsetup's cap on `--reduce-device-size`.
pub const MAX_REDUCE: u64 = 1 << 30;

/// Where the old bytes of a job that moves the data are read from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShiftSource {
    /// The shift (`S`): also the step length (and a data move's copy's size).
    pub size: u64,
    /// A data move: where the copy of the data's first `size` bytes lies.
    pub moved_offset: Option<u64>,
    /// Where the old layout's data lies (the `backup-previous` offset).
    pub previous_offset: u64,
}

impl ShiftSource {
    /// The job's shift, if `r` moves the data in a way cryptblk runs: cryptsetup's data
    /// move (`--encrypt --reduce-device-size` without `--header`), or its backward
    /// `datashift` (`reencrypt --reduce-device-size`: the new layout `S` bytes up).
    pub(crate) fn of(r: &Reencryption<'_>) -> Option<ShiftSource> {
        let Resilience::Datashift { shift_size } = r.params.resilience else {
            return None;
        };
        if r.params.direction != ReencryptDirection::Backward {
            return None;
        }
        let previous_offset = r.previous.1.offset;
        match r.moved {
            Some((_, moved)) => (r.params.mode == ReencryptMode::Encrypt
                && r.previous.1.kind == "linear"
                && moved.kind == "linear")
                .then_some(ShiftSource {
                    size: shift_size,
                    moved_offset: Some(moved.offset),
                    previous_offset,
                }),
            None => (previous_offset.checked_add(shift_size) == Some(r.final_.1.offset)).then_some(
                ShiftSource {
                    size: shift_size,
                    moved_offset: None,
                    previous_offset,
                },
            ),
        }
    }

    /// Where the old bytes of data byte `pos` (counted from the start of the data) are
    /// read from.
    pub(crate) fn source(&self, pos: u64) -> u64 {
        match self.moved_offset {
            Some(m) if pos < self.size => m + pos,
            _ => self.previous_offset + pos,
        }
    }

    /// The next step `(offset, len)` from the plaintext still left (`linear`: the sum of
    /// the regular linear segments, the moved one included), as cryptsetup chooses it
    /// (`reencrypt_offset_backward_moved`): `S` bytes from the end of what is left; a
    /// remainder shorter than `S` after the moved part; the moved part last.
    pub(crate) fn next_step(&self, linear: u64) -> Result<(u64, u64)> {
        let s = self.size;
        let rest = linear
            .checked_sub(s)
            .ok_or_else(|| bad("less plaintext left than the moved segment"))?;
        Ok(match rest {
            0 => (0, s),
            r if r < s => (s, r),
            r => (r, s),
        })
    }
}

impl Luks2Header {
    /// Starts encrypting the device `dev` in place with its header at its head
    /// (`reencrypt --encrypt --reduce-device-size R`, cryptsetup's layout): a new header
    /// with data offset `S = R/2`, the data's first `S` bytes copied to the device's last
    /// `S` bytes (synced), then the header written (keyslots area, secondary copy, primary
    /// copy, each synced: from the moment the secondary copy is on the disk the device
    /// opens). The data that stays (`R` bytes less than the device; the filesystem on it
    /// must have been shrunk first) is plaintext until the job converts it.
    pub fn encrypt_shift_init(
        dev: &mut dyn Storage,
        reduce: u64,
        passphrase: &[u8],
        req: &crate::luks2::ReencryptRequest,
    ) -> Result<Luks2Header> {
        let dev_size = dev.size()?;
        let shift = reduce / 2;
        let opts = Self::encrypt_options(req, Some(shift));
        let ss = opts.sector_size as u64;
        if reduce == 0 || reduce > MAX_REDUCE || !shift.is_multiple_of(ss.max(4096)) {
            return Err(Error::InvalidOption(format!(
                "--reduce-device-size {reduce}: it must be a multiple of {} bytes and at \
                 most 1 GiB",
                2 * ss.max(4096)
            )));
        }
        // The header (S), the data left (L), and room for the moved copy (S); every step
        // but the last converts S bytes, so L must hold at least one of them.
        let data = dev_size.checked_sub(2 * shift).filter(|&l| l >= shift);
        let Some(data) = data.filter(|l| l.is_multiple_of(ss)) else {
            return Err(Error::InvalidOption(format!(
                "not enough space for --reduce-device-size {reduce}: the device has \
                 {dev_size} bytes and needs the {shift}-byte header, a {shift}-byte copy of \
                 the data's start and at least {shift} bytes of data in whole {ss}-byte \
                 sectors (nothing was written)"
            )));
        };
        let mut key = cryptblk_crypto::SecretBytes::zeroed(opts.key_len);
        cryptblk_crypto::random_bytes(&mut key)?;
        let mut mem = MemStorage::new(shift);
        let mut hdr = Luks2Header::format(&mut mem, &opts, &key, passphrase)?;
        let json = hdr.encrypt_shift_metadata(dev_size, data, &key, req)?;
        hdr.commit(&mut mem, json)?;
        move_first_segment(dev, shift, dev_size - shift)?;
        write_header_last_copy_first(dev, &mem, hdr.hdr_size)?;
        Ok(hdr)
    }

    /// The metadata of a data-move encryption from a freshly formatted header (data
    /// offset `S`): the moved copy and the plaintext in place as the data now, then the
    /// backups in cryptsetup's order (moved, previous, final), the `datashift` reencrypt
    /// keyslot (a 4 KiB area), the verification digest over the new key.
    fn encrypt_shift_metadata(
        &self,
        dev_size: u64,
        data: u64,
        key: &[u8],
        req: &crate::luks2::ReencryptRequest,
    ) -> Result<Value> {
        let shift = self.segment().offset;
        let json = &self.json;
        let mut final_seg = json["segments"][self.segment_id.to_string()].clone();
        final_seg["flags"] = json!(["backup-final"]);
        let linear = |offset: u64, size: u64, flag: Option<&str>| {
            let mut l = json!({"type": "linear", "offset": offset.to_string(),
                               "size": size.to_string()});
            if let Some(f) = flag {
                l["flags"] = json!([f]);
            }
            l
        };
        let moved_at = dev_size - shift;
        let mut segs = vec![linear(moved_at, shift, None)];
        if data > shift {
            segs.push(linear(shift, data - shift, None));
        }
        segs.push(linear(moved_at, shift, Some("backup-moved-segment")));
        segs.push(linear(0, data, Some("backup-previous")));
        segs.push(final_seg);
        let final_id = segs.len() - 1;
        let (digest_id, _) = self.segment_digest()?;
        let mut json = with_segments(json, segs, digest_id, |i, _| i == final_id)?;
        let model = Model::from_json(&json, self.hdr_size)?;
        let slot = lowest_free(&model.keyslots)?;
        let (gap_off, _) = keyslot::largest_area_gap(&model, self.hdr_size)
            .filter(|g| g.1 >= 4096)
            .ok_or(Luks2Error::NoKeyslotSpace)?;
        section_mut(&mut json, "keyslots")?.insert(
            slot.to_string(),
            json!({"type": "reencrypt", "key_size": 1, "mode": "encrypt",
                   "direction": "backward", "priority": 0,
                   "area": {"offset": gap_off.to_string(), "size": "4096",
                            "type": "datashift", "shift_size": shift.to_string()}}),
        );
        seal_reencryption(&mut json, self.hdr_size, slot, None, Some(key), &req.kdf)?;
        Ok(json)
    }
}

/// Copies the data's first `len` bytes to `to` (cryptsetup's `reencrypt_move_data`), synced.
fn move_first_segment(dev: &mut dyn Storage, len: u64, to: u64) -> Result<()> {
    copy(&*dev, 0, &*dev, to, len)?;
    dev.sync()?;
    Ok(())
}

/// Copies `len` bytes from `from` at `src` to `to` at `dst`, 1 MiB at a time, front to
/// back (within one device, the ranges must not overlap with the source behind).
pub(super) fn copy(
    from: &dyn Storage,
    src: u64,
    to: &dyn Storage,
    dst: u64,
    len: u64,
) -> Result<()> {
    const CHUNK: u64 = 1 << 20;
    let mut buf = Zeroizing::new(vec![0u8; CHUNK.min(len) as usize]);
    let mut at = 0;
    while at < len {
        let n = (len - at).min(CHUNK) as usize;
        from.read_at(&mut buf[..n], src + at)?;
        to.write_at(&buf[..n], dst + at)?;
        at += n as u64;
    }
    Ok(())
}

/// Writes the header built in `mem` to the head of `dev`: the keyslots area, then the
/// secondary copy, then the primary, each synced, so that the device opens (from the
/// secondary copy) before the first bytes of the old data are overwritten.
fn write_header_last_copy_first(
    dev: &mut dyn Storage,
    mem: &MemStorage,
    hdr_size: u64,
) -> Result<()> {
    let total = mem.size()?;
    for (off, end) in [
        (2 * hdr_size, total),
        (hdr_size, 2 * hdr_size),
        (0, hdr_size),
    ] {
        let mut part = vec![0u8; (end - off) as usize];
        mem.read_at(&mut part, off)?;
        dev.write_at(&part, off)?;
        dev.sync()?;
    }
    Ok(())
}
