//! Crash recovery of a reencryption step cut off, as cryptsetup's
//! (`reencrypt_recover_segment`): the hot zone rewritten from its checksums, journal or
//! shifted copy, then the metadata after it (and the job finished if that was its last).

use super::metadata::{AfterRecovery, Protection, Reencryption, Side, StepRecovery, bad, matches};
use crate::luks2::Luks2Error;
use crate::luks2::model::{Model, ReencryptDirection, ReencryptMode, Resilience, Segment};
use zeroize::Zeroizing;

/// Bytes of the hot zone processed at once (bounded memory whatever the hot-zone size).
const RECOVERY_CHUNK: u64 = 1 << 20;

fn sector_cipher(
    seg: &Segment,
    key: Option<&[u8]>,
    iv_base: u64,
) -> Result<Option<cryptblk_crypto::SectorCipher>, crate::Error> {
    if seg.kind != "crypt" {
        return Ok(None);
    }
    let key = key.ok_or_else(|| bad("encrypted backup segment without its key"))?;
    let spec = cryptblk_crypto::CipherSpec::parse(&seg.encryption)
        .map_err(|_| Luks2Error::Unsupported(format!("data cipher '{}'", seg.encryption)))?;
    let iv = cryptblk_crypto::IvOptions {
        large_sectors: false,
        offset: iv_base,
    };
    Ok(Some(cryptblk_crypto::SectorCipher::new(
        spec,
        key,
        seg.sector_size,
        iv,
    )?))
}

/// Old bytes (raw, as on disk before the step) of a stretch `at` bytes into the hot zone,
/// to what the final layout stores there.
fn convert(
    old: &Option<cryptblk_crypto::SectorCipher>,
    new: &Option<cryptblk_crypto::SectorCipher>,
    at: u64,
    buf: &mut [u8],
) -> Result<(), crate::Error> {
    if let Some(c) = old {
        c.decrypt(at / c.sector_size() as u64, buf)?;
    }
    if let Some(c) = new {
        c.encrypt(at / c.sector_size() as u64, buf)?;
    }
    Ok(())
}

/// The position of segment `id` among the regular (non-backup) segments.
fn regular_index(model: &Model, id: u32) -> usize {
    model
        .segments
        .iter()
        .filter(|(_, s)| !s.is_backup())
        .position(|(i, _)| *i == id)
        .unwrap_or(0)
}

impl Reencryption<'_> {
    /// The regular segment index and logical stretch of the interrupted step.
    fn hot_zone(&self, model: &Model) -> Result<(usize, u64, u64), Luks2Error> {
        let hot = self.hot.ok_or_else(|| bad("no step to recover"))?;
        let seg = &model.segments[&hot];
        let index = regular_index(model, hot);
        let off = seg
            .offset
            .checked_sub(self.final_.1.offset)
            .ok_or_else(|| bad("hot zone before the final data offset"))?;
        let len = seg.size.ok_or_else(|| bad("hot zone of dynamic size"))?;
        Ok((index, off, len))
    }

    /// Where the old bytes of the hot zone at `off` (regular segment `index`) are found
    /// again: the area's checksums or journal, or the shifted copy (the moved segment's
    /// copy for the last step of a move), as cryptsetup chooses (§ "secondary" protection
    /// of the datashift-* types for the moved step).
    fn protection(
        &self,
        index: usize,
        off: u64,
        iv_base: u64,
    ) -> Result<Protection<'_>, Luks2Error> {
        let d_new = self.final_.1.offset;
        let moved_step = off == 0 && self.moved.is_some();
        let shift_source = |shift: u64| -> Result<Protection<'_>, Luks2Error> {
            if index == 0
                && let Some((_, m)) = self.moved
            {
                return Ok(Protection::Shift {
                    source: m.offset,
                    iv_base: 0,
                });
            }
            let dst = d_new + off;
            let source = match self.params.direction {
                ReencryptDirection::Forward => dst.checked_add(shift),
                ReencryptDirection::Backward => dst.checked_sub(shift),
            }
            .ok_or_else(|| bad("data shift outside the device"))?;
            Ok(Protection::Shift { source, iv_base })
        };
        let prot = match &self.params.resilience {
            Resilience::Checksum { hash, sector_size } => Protection::Checksum {
                hash,
                bs: *sector_size as u64,
            },
            Resilience::DatashiftChecksum {
                hash, sector_size, ..
            } if moved_step => Protection::Checksum {
                hash,
                bs: *sector_size as u64,
            },
            Resilience::Journal => Protection::Journal,
            Resilience::DatashiftJournal { .. } if moved_step => Protection::Journal,
            Resilience::Datashift { shift_size }
            | Resilience::DatashiftChecksum { shift_size, .. }
            | Resilience::DatashiftJournal { shift_size } => shift_source(*shift_size)?,
            Resilience::None => {
                return Err(Luks2Error::Unsupported(
                    "an interrupted step without resilience data cannot be recovered".into(),
                ));
            }
        };
        Ok(prot)
    }

    /// How a crash in the step that the metadata `model` describes as running (its hot
    /// zone) would be recovered: the one place that says so, for the recovery itself
    /// and for the drivers' write policy ([`StepRecovery::keeps_rewritten_writes`]).
    pub(crate) fn step_recovery(&self, model: &Model) -> Result<StepRecovery, Luks2Error> {
        if self.params.resilience == Resilience::None {
            return Ok(StepRecovery::Nothing);
        }
        let (index, off, _) = self.hot_zone(model)?;
        Ok(match self.protection(index, off, 0)? {
            Protection::Checksum { .. } => StepRecovery::Checksums,
            Protection::Journal => StepRecovery::Journal,
            Protection::Shift { .. } => StepRecovery::Shift,
        })
    }

    /// Rewrites the hot zone of the interrupted step the way cryptsetup's crash recovery
    /// does (lib/luks2/luks2_reencrypt.c, `reencrypt_recover_segment`): what still holds
    /// old bytes is converted to the final layout, what was already converted is left.
    /// Safe to repeat if it is itself interrupted.
    pub(crate) fn rewrite_hot_zone(
        &self,
        model: &Model,
        keyslot_area: &dyn crate::Storage,
        data: &dyn crate::Storage,
        old_key: Option<&[u8]>,
        new_key: Option<&[u8]>,
    ) -> Result<(), crate::Error> {
        let (index, off, len) = self.hot_zone(model)?;
        let d_new = self.final_.1.offset;
        let hot = &model.segments[&self.hot.unwrap_or_default()];
        let iv_base = if self.params.mode == ReencryptMode::Decrypt {
            off / 512
        } else {
            hot.iv_tweak
        };
        let prot = self.protection(index, off, iv_base)?;
        let src_iv = match prot {
            Protection::Shift { iv_base, .. } => iv_base,
            _ => iv_base,
        };
        let old = sector_cipher(self.previous.1, old_key, src_iv)?;
        let new = sector_cipher(self.final_.1, new_key, iv_base)?;
        let dst = d_new + off;
        if let Protection::Checksum { bs, .. } = prot
            && (bs == 0 || !len.is_multiple_of(bs) || !RECOVERY_CHUNK.is_multiple_of(bs))
        {
            return Err(bad(format!(
                "hot zone of {len} bytes in {bs}-byte checksum blocks"
            ))
            .into());
        }
        let (area_off, area_size) = (self.keyslot.area_offset, self.keyslot.area_size);
        let stored = match prot {
            Protection::Checksum { hash, bs } => {
                let h = cryptblk_crypto::HashAlg::from_name(hash)
                    .map_err(|_| Luks2Error::Unsupported(format!("checksum hash '{hash}'")))?;
                let need = len / bs * h.output_len() as u64;
                if need > area_size {
                    return Err(bad("checksums do not fit the reencrypt keyslot area").into());
                }
                let mut sums = vec![0u8; need as usize];
                keyslot_area.read_at(&mut sums, area_off)?;
                Some((h, sums))
            }
            Protection::Journal if len > area_size => {
                return Err(bad("hot zone larger than the journal").into());
            }
            _ => None,
        };
        let mut buf = Zeroizing::new(vec![0u8; RECOVERY_CHUNK.min(len) as usize]);
        let mut at = 0u64;
        while at < len {
            let n = (len - at).min(RECOVERY_CHUNK);
            let b = &mut buf[..n as usize];
            match prot {
                Protection::Checksum { bs, .. } => {
                    let (h, sums) = stored.as_ref().expect("checksums were read");
                    data.read_at(b, dst + at)?;
                    let hl = h.output_len();
                    for (i, block) in b.chunks_mut(bs as usize).enumerate() {
                        let pos = at + i as u64 * bs;
                        let k = (pos / bs) as usize;
                        // Only blocks still holding their old bytes are converted.
                        if h.digest(block) == sums[k * hl..(k + 1) * hl] {
                            convert(&old, &new, pos, block)?;
                            data.write_at(block, dst + pos)?;
                        }
                    }
                }
                Protection::Journal => {
                    keyslot_area.read_at(b, area_off + at)?;
                    convert(&old, &new, at, b)?;
                    data.write_at(b, dst + at)?;
                }
                Protection::Shift { source, .. } => {
                    data.read_at(b, source + at)?;
                    convert(&old, &new, at, b)?;
                    data.write_at(b, dst + at)?;
                }
            }
            at += n;
        }
        Ok(())
    }

    /// Whether every regular segment already holds the final layout: the last step is done
    /// but the job was not finished (cryptsetup commits the last step before it removes
    /// the old key and the reencryption metadata).
    pub(crate) fn all_done(&self, model: &Model) -> bool {
        model
            .segments
            .iter()
            .filter(|(_, s)| !s.is_backup())
            .all(|(id, s)| self.side(model, *id, s) == Side::New)
    }

    /// The metadata that finishes a job whose data is all done ([`Self::all_done`]): one
    /// final segment, the old key, the backups and the reencryption metadata gone. The
    /// stale copies ([`Self::stale_copies`]) must be wiped before it is committed.
    pub(crate) fn finished(
        &self,
        model: &Model,
        json: &serde_json::Value,
    ) -> Result<AfterRecovery, crate::Error> {
        let mut out = json.clone();
        let (first_id, first) = model
            .segments
            .iter()
            .find(|(_, s)| !s.is_backup())
            .ok_or_else(|| bad("no data segment"))?;
        let mut j = json["segments"][first_id.to_string()].clone();
        if let Some(o) = j.as_object_mut() {
            o.insert("size".into(), serde_json::json!("dynamic"));
            o.remove("flags");
        }
        out["segments"] = serde_json::json!({ "0": j });
        let digest_id = |s: u32| model.segment_digest(s).map(|(d, _)| d);
        let (old_d, new_d) = (digest_id(self.previous.0), digest_id(self.final_.0));
        let wipe_header = self.finish(model, &mut out, old_d, new_d)?;
        if let Some(digests) = out["digests"].as_object_mut() {
            for (id, d) in digests.iter_mut() {
                let mine = new_d.is_some_and(|n| n.to_string() == *id) && first.kind == "crypt";
                d["segments"] = if mine {
                    serde_json::json!(["0"])
                } else {
                    serde_json::json!([])
                };
            }
        }
        Ok(AfterRecovery {
            json: out,
            wipe_header,
            finish_after_wipe: false,
        })
    }

    /// The side a regular segment holds: by its key where the two keys differ, else by
    /// which layout its cipher and sector size match; plaintext is old when encrypting
    /// and new when decrypting.
    fn side(&self, model: &Model, id: u32, s: &Segment) -> Side {
        if s.in_reencryption() {
            return Side::New;
        }
        if s.kind != "crypt" {
            return if self.final_.1.kind == "crypt" {
                Side::Old
            } else {
                Side::New
            };
        }
        let digest_of = |seg: u32| model.segment_digest(seg).map(|(d, _)| d);
        let (old_d, new_d) = (digest_of(self.previous.0), digest_of(self.final_.0));
        match digest_of(id) {
            Some(d) if old_d != new_d && Some(d) == new_d => Side::New,
            Some(d) if old_d != new_d && Some(d) == old_d => Side::Old,
            _ if matches(s, self.final_.1) && !matches(s, self.previous.1) => Side::New,
            _ => Side::Old,
        }
    }

    /// The regular segments once the hot one has joined its finished neighbours (JSON,
    /// parsed, side), and the index of the one it ended up in.
    #[allow(clippy::type_complexity)]
    fn post_segments(
        &self,
        model: &Model,
        json: &serde_json::Value,
    ) -> Result<
        (
            Vec<(serde_json::Map<String, serde_json::Value>, Segment, Side)>,
            usize,
        ),
        Luks2Error,
    > {
        use serde_json::{Map, Value};
        let hot = self.hot.ok_or_else(|| bad("no step to recover"))?;
        let seg_json = |id: u32| -> Result<Map<String, Value>, Luks2Error> {
            json["segments"][id.to_string()]
                .as_object()
                .cloned()
                .ok_or_else(|| bad(format!("segment {id} missing")))
        };
        // (json, parsed, side) of each regular segment, the hot one unflagged.
        let mut regular: Vec<(Map<String, Value>, Segment, Side)> = Vec::new();
        for (id, s) in model.segments.iter().filter(|(_, s)| !s.is_backup()) {
            let mut j = seg_json(*id)?;
            let mut s = s.clone();
            let side = self.side(model, *id, &s);
            if *id == hot {
                j.remove("flags");
                s.flags.clear();
            }
            regular.push((j, s, side));
        }
        let hot_index = regular_index(model, hot);
        // Joins b into a when both are the same side, contiguous on the device and in the
        // volume, and (encrypted) with continuous IVs.
        let joinable = |a: &Segment, b: &Segment| {
            let Some(alen) = a.size else { return false };
            matches(a, b)
                && a.offset.checked_add(alen) == Some(b.offset)
                && (a.kind != "crypt" || a.iv_tweak.checked_add(alen / 512) == Some(b.iv_tweak))
        };
        let mut merged_index = hot_index;
        if hot_index + 1 < regular.len()
            && regular[hot_index + 1].2 == Side::New
            && joinable(&regular[hot_index].1, &regular[hot_index + 1].1)
        {
            let next = regular.remove(hot_index + 1);
            let cur = &mut regular[hot_index];
            cur.1.size = match (cur.1.size, next.1.size) {
                (Some(a), Some(b)) => Some(
                    a.checked_add(b)
                        .ok_or_else(|| bad("segment sizes overflow"))?,
                ),
                _ => None,
            };
        }
        if hot_index > 0
            && regular[hot_index - 1].2 == Side::New
            && joinable(&regular[hot_index - 1].1, &regular[hot_index].1)
        {
            let cur = regular.remove(hot_index);
            let prev = &mut regular[hot_index - 1];
            prev.1.size = match (prev.1.size, cur.1.size) {
                (Some(a), Some(b)) => Some(
                    a.checked_add(b)
                        .ok_or_else(|| bad("segment sizes overflow"))?,
                ),
                _ => None,
            };
            merged_index = hot_index - 1;
        }
        Ok((regular, merged_index))
    }

    /// The finishing edits of the metadata (old keyslots, the reencrypt keyslot, its
    /// digest, the old digest, the requirement go) and what to wipe after the commit:
    /// their keyslot areas, and the stale copies of data the operation leaves.
    #[allow(clippy::type_complexity)]
    fn finish(
        &self,
        model: &Model,
        out: &mut serde_json::Value,
        old_d: Option<u32>,
        new_d: Option<u32>,
    ) -> Result<Vec<(u64, u64)>, crate::Error> {
        let reenc_digest = model
            .digests
            .iter()
            .find(|(_, d)| d.keyslots.contains(&self.keyslot_id))
            .map(|(id, _)| *id);
        let mut wipe_header = Vec::new();
        let mut drop_slots = vec![self.keyslot_id];
        if old_d != new_d
            && let Some(d) = old_d.and_then(|d| model.digests.get(&d))
        {
            drop_slots.extend(d.keyslots.iter().copied());
        }
        for id in drop_slots {
            // Out of the keyslots, the digests and the tokens that name it.
            crate::luks2::remove_keyslot_json(out, id)?;
            if let Some(k) = model.keyslots.get(&id) {
                wipe_header.push((k.area_offset, k.area_size));
            }
        }
        let digests = out["digests"]
            .as_object_mut()
            .ok_or_else(|| bad("digests missing"))?;
        for d in [reenc_digest, old_d.filter(|d| Some(*d) != new_d)]
            .into_iter()
            .flatten()
        {
            digests.remove(&d.to_string());
        }
        let config = out["config"]
            .as_object_mut()
            .ok_or_else(|| bad("config missing"))?;
        if let Some(req) = config
            .get_mut("requirements")
            .and_then(|r| r.as_object_mut())
        {
            if let Some(m) = req.get_mut("mandatory").and_then(|m| m.as_array_mut()) {
                m.retain(|r| {
                    r.as_str()
                        .is_none_or(|r| !r.starts_with("online-reencrypt"))
                });
                if m.is_empty() {
                    req.remove("mandatory");
                }
            }
            if req.is_empty() {
                config.remove("requirements");
            }
        }
        Ok(wipe_header)
    }

    /// The stale copies of data a finished job leaves on the data device: the moved
    /// plaintext of an encryption, the tail a forward data shift leaves behind.
    pub(crate) fn stale_copies(&self, data_size: u64) -> Vec<(u64, u64)> {
        let mut v = Vec::new();
        if let Some((_, m)) = self.moved
            && self.params.mode == ReencryptMode::Encrypt
        {
            v.push((m.offset, m.size.unwrap_or(0)));
        }
        let shift = self.params.resilience.shift_size();
        if shift > 0 && self.params.direction == ReencryptDirection::Forward {
            v.push((data_size.saturating_sub(shift), shift));
        }
        v
    }

    /// The metadata once the interrupted step is rewritten: the hot segment joins the
    /// finished stretch next to it (cryptsetup's "post" layout), digests are reassigned,
    /// backups follow the regular segments; if nothing old is left, the reencryption is
    /// finished in the same commit (old keyslots, backups, the reencrypt keyslot, its
    /// digest and the requirement go; their areas are wiped after the commit).
    pub(crate) fn after_recovery(
        &self,
        model: &Model,
        json: &serde_json::Value,
        data_size: u64,
    ) -> Result<AfterRecovery, crate::Error> {
        use serde_json::{Map, Value, json};
        let seg_json = |id: u32| -> Result<Map<String, Value>, Luks2Error> {
            json["segments"][id.to_string()]
                .as_object()
                .cloned()
                .ok_or_else(|| bad(format!("segment {id} missing")))
        };
        let (mut regular, merged_index) = self.post_segments(model, json)?;
        let all_new = regular.iter().all(|r| r.2 == Side::New);
        // Finished in this commit, unless stale copies must be wiped first (in between,
        // the metadata still records them).
        let finish_after_wipe = all_new && !self.stale_copies(data_size).is_empty();
        let finished = all_new && !finish_after_wipe;
        let last = merged_index + 1 == regular.len();
        // A finished volume, a data move's last step (the copy not yet wiped), and a
        // decryption's plaintext that runs to the end, are sized "dynamic" as cryptsetup
        // leaves them; otherwise the sizes stay as they were.
        if finished
            || (all_new && self.moved.is_some())
            || (last && self.params.mode == ReencryptMode::Decrypt && self.moved.is_some())
        {
            regular[merged_index].1.size = None;
        }
        let size_value = |s: Option<u64>| match s {
            None => Value::String("dynamic".into()),
            Some(n) => Value::String(n.to_string()),
        };
        let mut out = json.clone();
        let mut segments = Map::new();
        for (i, (mut j, s, _)) in regular.iter().cloned().enumerate() {
            j.insert("size".into(), size_value(s.size));
            segments.insert(i.to_string(), Value::Object(j));
        }
        let digest_id = |seg: u32| model.segment_digest(seg).map(|(d, _)| d);
        let (old_d, new_d) = (digest_id(self.previous.0), digest_id(self.final_.0));
        let mut wipe_header = Vec::new();
        // Digest id -> segment ids it covers, rebuilt from scratch.
        let mut assign: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
        for (i, (_, s, side)) in regular.iter().enumerate() {
            if s.kind == "crypt" {
                let d = match side {
                    Side::New => new_d,
                    Side::Old => old_d,
                };
                let d = d.ok_or_else(|| bad("encrypted segment without a key"))?;
                assign.entry(d).or_default().push(i as u32);
            }
        }
        if finished {
            wipe_header = self.finish(model, &mut out, old_d, new_d)?;
        } else {
            for (flag_seg, d) in [
                (Some(self.previous), old_d),
                (Some(self.final_), new_d),
                (self.moved, old_d),
            ] {
                let Some((id, s)) = flag_seg else { continue };
                let n = segments.len() as u32;
                segments.insert(n.to_string(), Value::Object(seg_json(id)?));
                if s.kind == "crypt" {
                    let d = d.ok_or_else(|| bad("encrypted backup segment without a key"))?;
                    assign.entry(d).or_default().push(n);
                }
            }
        }
        out["segments"] = Value::Object(segments);
        let digests = out["digests"]
            .as_object_mut()
            .ok_or_else(|| bad("digests missing"))?;
        for (id, d) in digests.iter_mut() {
            let segs: Vec<Value> = id
                .parse::<u32>()
                .ok()
                .and_then(|id| assign.get(&id))
                .map(|v| v.iter().map(|s| json!(s.to_string())).collect())
                .unwrap_or_default();
            d["segments"] = Value::Array(segs);
        }
        Ok(AfterRecovery {
            json: out,
            wipe_header,
            finish_after_wipe,
        })
    }
}

/// Overwrites `len` bytes at `off` with random bytes (stale copies of data).
pub(crate) fn wipe_random(
    dev: &dyn crate::Storage,
    off: u64,
    len: u64,
) -> Result<(), crate::Error> {
    let mut buf = vec![0u8; RECOVERY_CHUNK.min(len) as usize];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(RECOVERY_CHUNK) as usize;
        cryptblk_crypto::random_bytes(&mut buf[..n])?;
        dev.write_at(&buf[..n], off + at)?;
        at += n as u64;
    }
    Ok(())
}
