//! Decryption of a volume whose header is on the device (`reencrypt --decrypt --header
//! NEWFILE DEVICE`, cryptsetup 2.6's `decrypt_luks2_datashift_init`): the plaintext ends
//! at the head of the device, where the header was, so the header goes to a file first.
//!
//! cryptsetup's layout (lib/luks2/luks2_reencrypt.c, "decryption with datashift"), with
//! `S` the old data offset, `D` the data's length and `M` the moved segment's
//! (`min(S, 20 MiB, D)`, or `--hotzone-size`): the header is copied to the file, its
//! signatures wiped on the device, the data's first `M` bytes of ciphertext copied to the
//! device's head (the `backup-moved-segment`), then the file's metadata says so
//! (`online-reencrypt-v3`). Steps then run forward from `M`: up to `S` bytes of
//! ciphertext read at `S + v` are written decrypted at `v`, into the room the header and
//! the moved copy's source left (resilience `datashift`: the source is never overwritten
//! before its step is committed); the moved segment is decrypted in place last, its old
//! bytes protected by checksums (`datashift-checksum`). Finishing wipes the `S` bytes the
//! data no longer reaches at the device's end, every keyslot and the old key.

use super::json::{lowest_free, seal_reencryption, seg_json, with_segments};
use super::metadata::Reencryption;
use super::shift::copy;
use crate::luks2::model::{Model, ReencryptDirection, ReencryptMode, Resilience, Segment};
use crate::luks2::{Luks2Error, Luks2Header, bad, keyslot, section_mut};
use crate::{Error, Result, Storage};
use serde_json::{Value, json};

/// cryptsetup's default moved segment (`LUKS2_DEFAULT_NONE_REENCRYPTION_LENGTH`).
const DEFAULT_MOVED: u64 = 20 << 20;

/// Checksum block of the moved segment's protection (cryptsetup: 4 KiB, or the sector).
const CHECKSUM_BLOCK: u64 = 4096;

/// A decryption that moves the data to the device's head, as its metadata records it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DecryptShift {
    /// The old data offset (`S`), which is also the shift and the forward steps' length.
    pub shift: u64,
    /// The moved first segment (`M` bytes, at the device's head).
    pub moved_len: u64,
}

impl DecryptShift {
    /// The job's geometry, if `r` is such a decryption.
    pub(crate) fn of(r: &Reencryption<'_>) -> Option<DecryptShift> {
        let shift = match r.params.resilience {
            Resilience::DatashiftChecksum { shift_size, .. }
            | Resilience::DatashiftJournal { shift_size } => shift_size,
            _ => return None,
        };
        let (_, moved) = r.moved?;
        (r.params.mode == ReencryptMode::Decrypt
            && r.params.direction == ReencryptDirection::Forward
            && r.final_.1.kind == "linear"
            && r.final_.1.offset == 0
            && r.previous.1.kind == "crypt"
            && r.previous.1.offset == shift
            && moved.kind == "crypt"
            && moved.offset == 0)
            .then_some(DecryptShift {
                shift,
                moved_len: moved.size?,
            })
    }

    /// Where the ciphertext of data byte `pos` is read from.
    pub(crate) fn source(&self, pos: u64) -> u64 {
        if pos < self.moved_len {
            pos
        } else {
            self.shift + pos
        }
    }

    /// The next step `(offset, len)` of `total` data bytes from the layout now: the
    /// encrypted rest at its old place first (`S` bytes a step), the moved segment last.
    pub(crate) fn next_step(&self, model: &Model, total: u64) -> Result<(u64, u64)> {
        let regular: Vec<&Segment> = model.segments.values().filter(|s| !s.is_backup()).collect();
        if let Some(rest) = regular
            .iter()
            .find(|s| s.kind == "crypt" && s.offset >= self.shift)
        {
            let v = rest.offset - self.shift;
            let left = total
                .checked_sub(v)
                .filter(|&l| l > 0)
                .ok_or_else(|| bad("the data ends before the decryption's progress"))?;
            return Ok((v, self.shift.min(left)));
        }
        match regular.first() {
            Some(s) if s.kind == "crypt" && s.offset == 0 => Ok((0, self.moved_len)),
            _ => Err(bad("nothing left to decrypt")),
        }
    }

    /// The metadata while the step `[off, off+len)` runs (cryptsetup's hot layout for
    /// it): the segment holding the zone split into the plaintext hot zone (flagged) and
    /// what follows it; the backups after (previous, final, moved); the old key bound to
    /// every encrypted segment.
    pub(crate) fn hot_layout(
        &self,
        r: &Reencryption<'_>,
        json: &Value,
        model: &Model,
        off: u64,
        len: u64,
        total: u64,
    ) -> Result<Value> {
        let fin = r.final_.1;
        let mut segs: Vec<Value> = Vec::new();
        for (id, s) in model.segments.iter().filter(|(_, s)| !s.is_backup()) {
            let holds_zone = s.kind == "crypt" && self.source(off) == s.offset;
            if !holds_zone {
                segs.push(json["segments"][id.to_string()].clone());
                continue;
            }
            segs.push(seg_json(fin, off, 0, Some(len), Some("in-reencryption")));
            if off == 0 {
                // The moved segment: what follows is already plaintext.
                continue;
            }
            if off + len < total {
                let rest = off + len;
                segs.push(seg_json(
                    s,
                    self.shift + rest,
                    r.previous.1.iv_tweak + rest / 512,
                    None,
                    None,
                ));
            }
        }
        let old_digest = model
            .segment_digest(r.previous.0)
            .map(|(d, _)| d)
            .ok_or_else(|| bad("no old key digest"))?;
        finish_layout(r, json, old_digest, segs)
    }
}

/// `segs` (the regular segments) followed by the backups (previous, final, moved), the
/// old key's digest bound to every encrypted one.
fn finish_layout(
    r: &Reencryption<'_>,
    json: &Value,
    old_digest: u32,
    mut segs: Vec<Value>,
) -> Result<Value> {
    for (id, _) in [Some(r.previous), Some(r.final_), r.moved]
        .into_iter()
        .flatten()
    {
        segs.push(json["segments"][id.to_string()].clone());
    }
    with_segments(json, segs, old_digest, |_, s| s["type"] == "crypt")
}

impl Luks2Header {
    /// Starts decrypting `data` (`data_size` bytes), whose header this is, with the header
    /// moved to `new_header` (an empty file, which grows to the header's size): the
    /// header copied there (synced), its signatures wiped on `data`, the data's first
    /// `M` bytes of ciphertext copied to the head of `data` (synced), then the metadata
    /// committed to `new_header` only. Until that commit, `new_header` is a copy of the
    /// untouched header and the data at its old place is unchanged: the volume opens with
    /// `--header new_header`. Returns the header as it is in `new_header`.
    #[allow(clippy::too_many_arguments)]
    pub fn decrypt_shift_init(
        &self,
        data: &mut dyn Storage,
        data_size: u64,
        new_header: &mut dyn Storage,
        passphrase: &[u8],
        slot: Option<u32>,
        moved: Option<u64>,
        req: &crate::luks2::ReencryptRequest,
    ) -> Result<Luks2Header> {
        let (seg_id, seg) = self.startable_segment()?;
        let shift = seg.offset;
        let ss = (seg.sector_size as u64).max(CHECKSUM_BLOCK);
        if shift == 0 || seg.kind != "crypt" {
            return Err(Error::InvalidOption(
                "the data starts at the head of the device: decrypt it with its detached \
                 --header as it is"
                    .into(),
            ));
        }
        let total = data_size
            .checked_sub(shift)
            .filter(|&d| d > 0 && d.is_multiple_of(seg.sector_size as u64))
            .ok_or_else(|| {
                Error::InvalidOption(format!(
                    "the device ({data_size} bytes) holds no whole sectors of data after \
                     its {shift}-byte header"
                ))
            })?;
        if moved.is_some_and(|m| m > shift) {
            return Err(Error::InvalidOption(
                "Moved segment size can not be greater than data shift value.".into(),
            ));
        }
        let moved_len = moved.unwrap_or(shift.min(DEFAULT_MOVED)).min(total);
        if moved_len == 0 || !moved_len.is_multiple_of(ss.min(total)) {
            return Err(Error::InvalidOption(format!(
                "--hotzone-size {moved_len}: the moved segment must be whole {ss}-byte blocks"
            )));
        }
        let (old_digest, _) = self.segment_digest()?;
        let (_, old_key) = self.open_digest(data, old_digest, passphrase, slot)?;
        let json = self.decrypt_shift_metadata(seg_id, &seg, moved_len, total, &old_key, req)?;
        // The header, as a backup is made (both copies and the keyslots area).
        let hdr_total = 2 * self.hdr_size + self.model.keyslots_size;
        copy(&*data, 0, new_header, 0, hdr_total)?;
        new_header.sync()?;
        let mut copy_hdr = Luks2Header::read(new_header)?;
        // The old signatures, then the moved copy over them.
        let zeros = [0u8; 4096];
        data.write_at(&zeros, 0)?;
        data.write_at(&zeros, self.hdr_size)?;
        data.sync()?;
        copy(&*data, shift, &*data, 0, moved_len)?;
        data.sync()?;
        copy_hdr.commit(new_header, json)?;
        Ok(copy_hdr)
    }

    /// The metadata after the init: the moved copy and the rest at its old place, the
    /// backups (moved, previous, final), a `datashift-checksum` reencrypt keyslot over the
    /// largest free keyslot area, the verification digest over the old key.
    fn decrypt_shift_metadata(
        &self,
        seg_id: u32,
        seg: &Segment,
        moved_len: u64,
        total: u64,
        old_key: &[u8],
        req: &crate::luks2::ReencryptRequest,
    ) -> Result<Value> {
        let shift = seg.offset;
        let json = &self.json;
        let previous_json = {
            let mut p = json["segments"][seg_id.to_string()].clone();
            p["flags"] = json!(["backup-previous"]);
            p
        };
        let mut segs = vec![seg_json(seg, 0, seg.iv_tweak, Some(moved_len), None)];
        if total > moved_len {
            segs.push(seg_json(
                seg,
                shift + moved_len,
                seg.iv_tweak + moved_len / 512,
                None,
                None,
            ));
        }
        segs.push(seg_json(
            seg,
            0,
            seg.iv_tweak,
            Some(moved_len),
            Some("backup-moved-segment"),
        ));
        segs.push(previous_json);
        segs.push(json!({"type": "linear", "offset": "0", "size": "dynamic",
                         "flags": ["backup-final"]}));
        let (digest_id, _) = self.segment_digest()?;
        let mut json = with_segments(json, segs, digest_id, |_, s| s["type"] == "crypt")?;
        let model = Model::from_json(&json, self.hdr_size)?;
        let slot = lowest_free(&model.keyslots)?;
        let (gap_off, gap_len) = keyslot::largest_area_gap(&model, self.hdr_size)
            .filter(|g| g.1 >= 4096)
            .ok_or(Luks2Error::NoKeyslotSpace)?;
        let block = (seg.sector_size as u64).max(CHECKSUM_BLOCK);
        let area_len = gap_len / 4096 * 4096;
        if moved_len / block * 32 > area_len {
            return Err(Error::InvalidOption(format!(
                "Moved segment too large. Requested size {moved_len}, available space for: {}.",
                area_len / 32 * block
            )));
        }
        section_mut(&mut json, "keyslots")?.insert(
            slot.to_string(),
            json!({"type": "reencrypt", "key_size": 1, "mode": "decrypt",
                   "direction": "forward", "priority": 0,
                   "area": {"offset": gap_off.to_string(), "size": area_len.to_string(),
                            "type": "datashift-checksum", "hash": "sha256",
                            "sector_size": block, "shift_size": shift.to_string()}}),
        );
        seal_reencryption(
            &mut json,
            self.hdr_size,
            slot,
            Some(old_key),
            None,
            &req.kdf,
        )?;
        Ok(json)
    }
}
