//! `cryptblk reencrypt`: a new volume key (and optionally cipher, key size, sector size) for
//! a LUKS2 volume, in cryptsetup's on-disk format, so either tool can resume the other's
//! job or recover its crash.
//!
//! One step: the hot zone's old bytes are protected (checksums or a journal copy in the
//! `reencrypt` keyslot's area, synced), the metadata says the zone is `in-reencryption`
//! (commit), the zone is rewritten under the new key and synced, then the metadata says
//! the step is done (commit; the last one also removes the old key). A crash at any write
//! leaves either the previous state or one [`Luks2Header::recover_interrupted_step`] (and
//! cryptsetup) recovers. One driver ([`Luks2Header::run_steps`]) runs the steps offline and
//! online; whoever holds the data is a [`StepHost`].

use super::decrypt_shift::DecryptShift;
use super::json::{hot_layout, hot_layout_shift};
use super::metadata::{Reencryption, StepRecovery};
use super::shift::ShiftSource;
use crate::luks2::model::{Model, ReencryptDirection, Resilience, Segment};
use crate::luks2::{Luks2Error, Luks2Header, bad, keyslot};
use crate::{Error, LuksHeader, Result, SegmentKey, Storage};
use cryptblk_crypto::{CipherSpec, HashAlg, IvOptions, SecretBytes, SectorCipher};
use serde_json::Value;
use zeroize::Zeroizing;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReencryptOutcome {
    /// Every byte is under the new key; the old key and the reencryption metadata are gone.
    Finished,
    /// Stopped between steps when asked; either tool can resume.
    Stopped,
}

/// cryptsetup's cap on one step (1 GiB) and the default for `none` (20 MiB).
const MAX_HOTZONE: u64 = 1 << 30;

const DEFAULT_NONE_HOTZONE: u64 = 20 << 20;

/// Bytes converted at once.
const CHUNK: u64 = 1 << 20;

/// The sector cipher of a layout: `cipher_null` for plaintext (`linear`) ones.
fn cipher_of(seg: &Segment, key: &[u8]) -> Result<SectorCipher> {
    if seg.kind == "linear" {
        let null = CipherSpec::parse("cipher_null-ecb")?;
        return Ok(SectorCipher::new(null, &[], 512, IvOptions::default())?);
    }
    let spec = CipherSpec::parse(&seg.encryption)
        .map_err(|_| Luks2Error::Unsupported(format!("data cipher '{}'", seg.encryption)))?;
    let iv = IvOptions {
        large_sectors: false,
        offset: seg.iv_tweak,
    };
    Ok(SectorCipher::new(spec, key, seg.sector_size, iv)?)
}

impl Luks2Header {
    /// Runs a reencryption (`reencrypt`, `--resume-only`) offline, step by step, until it
    /// is done or `stop()` says to stop between steps. An interrupted step is recovered
    /// first. `progress(done, total)` is called after every step. `data` is the data
    /// device (`data_size` bytes; the same file as `dev` unless the header is detached).
    #[allow(clippy::too_many_arguments)]
    pub fn reencrypt_run(
        &mut self,
        dev: &mut dyn Storage,
        data: &dyn Storage,
        data_size: u64,
        passphrase: &[u8],
        slot: Option<u32>,
        hotzone: Option<u64>,
        stop: &dyn Fn() -> bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<ReencryptOutcome> {
        let Some(job) = self.reencrypt_job(dev, data, data_size, passphrase, slot, hotzone)? else {
            return Ok(ReencryptOutcome::Finished);
        };
        let host = Offline {
            data,
            data_offset: job.data_offset(),
        };
        self.run_steps(job, dev, data, &host, stop, progress)
    }

    /// Runs `job`'s steps until it is done or `stop()` says to stop between steps, the data
    /// held by `host` (nobody else offline; a serving volume online). The one driver of
    /// the step API, so the write policy of a step ([`StepRecovery::keeps_rewritten_writes`],
    /// handed to [`StepHost::begin_step`]) is decided in one place whoever holds the data.
    /// `progress(done, total)` after every step; a failed step is abandoned (the progress
    /// of earlier ones kept) and its error returned.
    pub fn run_steps(
        &mut self,
        mut job: ReencryptJob,
        dev: &mut dyn Storage,
        data: &dyn Storage,
        host: &dyn StepHost,
        stop: &dyn Fn() -> bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<ReencryptOutcome> {
        host.set_layout(job.segments(self)?)?;
        loop {
            let step = job.next_step(self)?;
            host.begin_step(
                job.hot_segment(self, &step)?,
                step.recovery.keeps_rewritten_writes(),
            )?;
            // Whatever fails from here on, the step ends (failed): writers wait on it.
            let stepped = self.run_step(&mut job, dev, data, host, &step, stop);
            let end = match stepped {
                Ok(end) => end,
                Err(e) => {
                    host.step_failed();
                    // Keep what earlier steps did: a resume must not convert it twice.
                    let _ = job.abandon(self, dev, data);
                    return Err(e);
                }
            };
            let (done, total) = job.progress();
            progress(done, total);
            if let Some(outcome) = end {
                return Ok(outcome);
            }
        }
    }

    /// One step, its zone closed to client writes by the host: what reached the zone
    /// before it closed is synced first (its protection must match the disk), then
    /// protect, rewrite, commit, and the host switched to the layout after it.
    fn run_step(
        &mut self,
        job: &mut ReencryptJob,
        dev: &mut dyn Storage,
        data: &dyn Storage,
        host: &dyn StepHost,
        step: &ReencryptStep,
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<ReencryptOutcome>> {
        data.sync()?;
        job.protect(self, dev, data, step)?;
        job.rewrite(data, step, &|pos, b| host.store(pos, b))?;
        let end = job.complete(self, dev, data, step, stop)?;
        host.set_layout(job.segments(self)?)?;
        Ok(end)
    }

    /// Gets a reencryption ready to run step by step ([`ReencryptJob`]): recovers an
    /// interrupted step, finishes a job whose data is all done (then `None`), else unlocks
    /// both keys and fixes the geometry.
    pub fn reencrypt_job(
        &mut self,
        dev: &mut dyn Storage,
        data: &dyn Storage,
        data_size: u64,
        passphrase: &[u8],
        slot: Option<u32>,
        hotzone: Option<u64>,
    ) -> Result<Option<ReencryptJob>> {
        self.check_usable()?;
        if !self.in_reencryption() {
            return Err(Luks2Error::Unsupported("no reencryption in progress".into()).into());
        }
        self.recover_interrupted_step(dev, data, passphrase, slot, data_size)?;
        if !self.in_reencryption() {
            return Ok(None);
        }
        // Every byte already converted (cryptsetup stopped after its last step's commit and
        // before its finishing ones): finish, never start over.
        let model = self.model.clone();
        let r = model
            .reencryption()?
            .ok_or_else(|| bad("no reencryption"))?;
        if r.all_done(&model) {
            // Both keys and the verification digest, where the old key still opens: then
            // the stale copies the metadata names are overwritten too. cryptsetup may have
            // wiped the old keyslots' material before it was stopped (it then can resume
            // nothing); the new key alone, which every byte is under, still lets the
            // metadata be finished, the metadata-named copies left alone.
            let verified = match self.open_reencryption_keys(&r, dev, passphrase, slot) {
                Ok(_) => true,
                Err(Error::WrongPassphrase) => {
                    let new = model
                        .segment_digest(r.final_.0)
                        .map(|(d, _)| d)
                        .ok_or(Error::WrongPassphrase)?;
                    self.open_digest(dev, new, passphrase, None)?;
                    false
                }
                Err(e) => return Err(e),
            };
            self.finish_reencryption(dev, data, data_size, verified)?;
            return Ok(None);
        }
        self.prepare_job(dev, data_size, passphrase, slot, hotzone)
            .map(Some)
    }

    /// Checks that this job is one cryptblk runs (a forward key change in place) and
    /// unlocks both keys into the two layouts' ciphers.
    fn prepare_job(
        &self,
        dev: &mut dyn Storage,
        data_size: u64,
        passphrase: &[u8],
        slot: Option<u32>,
        hotzone: Option<u64>,
    ) -> Result<ReencryptJob> {
        let model = self.model.clone();
        let r = model
            .reencryption()?
            .ok_or_else(|| bad("no reencryption"))?;
        let shift = ShiftSource::of(&r);
        let decrypt_shift = DecryptShift::of(&r);
        if shift.is_none()
            && decrypt_shift.is_none()
            && (r.params.resilience.shift_size() != 0
                || r.moved.is_some()
                || r.previous.1.offset != r.final_.1.offset)
        {
            return Err(Luks2Error::Unsupported(format!(
                "resuming a {:?} {:?} reencryption with {} resilience (cryptblk resumes \
                 jobs without a data shift; cryptsetup can resume this one)",
                r.params.mode,
                r.params.direction,
                r.params.resilience.name()
            ))
            .into());
        }
        let (_, keys) = self.open_reencryption_keys(&r, dev, passphrase, slot)?;
        // A plaintext (linear) side has no key.
        let none = SecretBytes::zeroed(0);
        let key_of = |seg: u32| -> Result<&SecretBytes> {
            if model.segments[&seg].kind == "linear" {
                return Ok(&none);
            }
            let d = model
                .segment_digest(seg)
                .map(|(d, _)| d)
                .ok_or_else(|| bad("backup segment without a key"))?;
            keys.iter()
                .find(|(k, _)| *k == d)
                .map(|(_, k)| k)
                .ok_or_else(|| bad("key missing"))
        };
        let d_new = r.final_.1.offset;
        let total = match shift {
            // Decrypting to the device's head: the data behind the old header.
            _ if decrypt_shift.is_some() => data_size
                .checked_sub(r.previous.1.offset)
                .ok_or_else(|| bad("data device smaller than the old data offset"))?,
            // A data move: the data that stays, the previous layout's (fixed) size.
            Some(sh) if sh.moved_offset.is_some() => r
                .previous
                .1
                .size
                .ok_or_else(|| bad("data move with a dynamic previous layout"))?,
            _ => data_size
                .checked_sub(d_new)
                .ok_or_else(|| bad("data device smaller than the data offset"))?,
        };
        // A job limited to part of the device (cryptsetup --device-size) records the
        // limit in its backup layouts.
        if shift.is_none()
            && decrypt_shift.is_none()
            && (r.previous.1.size.is_some() || r.final_.1.size.is_some())
        {
            return Err(Luks2Error::Unsupported(
                "a fixed-length reencryption (cryptsetup --device-size); cryptsetup can \
                 resume it"
                    .into(),
            )
            .into());
        }
        let mut align = r.previous.1.sector_size.max(r.final_.1.sector_size) as u64;
        if let Resilience::Checksum { sector_size, .. } = &r.params.resilience {
            align = align.max(*sector_size as u64);
        }
        if !total.is_multiple_of(align) {
            return Err(Luks2Error::Unsupported(format!(
                "data size {total} is not a multiple of the {align}-byte sector size"
            ))
            .into());
        }
        let new_key = key_of(r.final_.0)?.clone();
        Ok(ReencryptJob {
            old: cipher_of(r.previous.1, key_of(r.previous.0)?)?,
            new: cipher_of(r.final_.1, &new_key)?,
            new_key,
            keys: keys.clone(),
            d_new,
            total,
            data_size,
            step_len: match decrypt_shift {
                Some(ds) => ds.shift,
                None => job_step_length(shift, &r, hotzone, align)?,
            },
            shift,
            decrypt_shift,
            none: r.params.resilience == Resilience::None,
            backward: r.params.direction == ReencryptDirection::Backward,
            pending: None,
            done: 0,
            worker_hook: None,
        })
    }
}

/// A reencryption ready to run ([`Luks2Header::reencrypt_job`]): both keys unlocked, the
/// geometry fixed. One step is [`next_step`](Self::next_step), [`protect`](Self::protect),
/// [`rewrite`](Self::rewrite), [`complete`](Self::complete).
/// [`Luks2Header::reencrypt_run`] runs the steps offline; the volume crate runs them
/// while the volume serves, each step's zone closed to writes while it is rewritten.
pub struct ReencryptJob {
    old: SectorCipher,
    new: SectorCipher,
    new_key: SecretBytes,
    /// Both keys by digest id, to key a layout's segments.
    keys: Vec<(u32, SecretBytes)>,
    /// Where the data starts under the new layout (also under the old one, except in a
    /// data move, whose plaintext is read through `shift`).
    d_new: u64,
    /// Bytes of data.
    total: u64,
    data_size: u64,
    step_len: u64,
    /// Resilience `none`: no metadata commit per step.
    none: bool,
    /// Steps run from the end of the data to its start (cryptsetup's decryption).
    backward: bool,
    /// A data-move encryption (header at the head of the device): where the plaintext
    /// is read from.
    shift: Option<ShiftSource>,
    /// A decryption to the device's head (header moved to a file): where the ciphertext
    /// is read from, and the order of the steps.
    decrypt_shift: Option<DecryptShift>,
    /// With resilience `none`, the layout the steps reached, committed when the job stops
    /// or ends (cryptsetup's behaviour: no metadata write per step).
    pending: Option<Value>,
    /// Bytes of data under the new key.
    done: u64,
    /// Run at the start of every worker thread; with it, the caller's thread only waits.
    worker_hook: Option<fn()>,
}

/// One step of a [`ReencryptJob`]: the zone it rewrites and the metadata while it runs.
pub struct ReencryptStep {
    /// First byte of the zone, counted from the start of the data.
    pub offset: u64,
    /// Bytes in the zone.
    pub len: u64,
    /// How a crash during this step is recovered (from its own metadata).
    pub recovery: StepRecovery,
    hot_json: Value,
}

/// Who holds the data while [`Luks2Header::run_steps`] runs a job: nobody else
/// (offline: pieces go straight to the data device) or a volume serving clients
/// (online, the volume crate: it closes each step's zone to writes, lets them into
/// rewritten pieces only where the step's recovery keeps them, and reads each piece under
/// the key it is under). Called from the rewriting threads too, hence `Sync`.
pub trait StepHost: Sync {
    /// The data's layout, each stretch keyed: before the first step and after each.
    fn set_layout(&self, segments: Vec<SegmentKey>) -> Result<()>;
    /// A step starts over `hot` (its zone under the new key). `client_writes`: whether
    /// writes may go into the part already rewritten before the step is committed.
    fn begin_step(&self, hot: SegmentKey, client_writes: bool) -> Result<()>;
    /// Stores a rewritten piece for data byte `pos` (counted from the start of the data).
    fn store(&self, pos: u64, piece: &[u8]) -> Result<()>;
    /// The running step failed: nothing may be written to its zone from now on.
    fn step_failed(&self);
}

/// The offline host: nobody else uses the data.
struct Offline<'a> {
    data: &'a dyn Storage,
    data_offset: u64,
}

impl StepHost for Offline<'_> {
    fn set_layout(&self, _: Vec<SegmentKey>) -> Result<()> {
        Ok(())
    }
    fn begin_step(&self, _: SegmentKey, _: bool) -> Result<()> {
        Ok(())
    }
    fn store(&self, pos: u64, piece: &[u8]) -> Result<()> {
        Ok(self.data.write_at(piece, self.data_offset + pos)?)
    }
    fn step_failed(&self) {}
}

impl ReencryptStep {
    fn new(offset: u64, len: u64, hot_json: Value, hdr_size: u64) -> Result<ReencryptStep> {
        let model = Model::from_json(&hot_json, hdr_size)?;
        let recovery = model
            .reencryption()?
            .ok_or_else(|| bad("no reencryption"))?
            .step_recovery(&model)?;
        Ok(ReencryptStep {
            offset,
            len,
            recovery,
            hot_json,
        })
    }
}

impl ReencryptJob {
    /// Makes the heavy work (hashing the zone, rewriting it) run on helper threads that
    /// each call `hook` first (e.g. to lower their scheduling priority), never on the
    /// caller's.
    pub fn set_worker_hook(&mut self, hook: fn()) {
        self.worker_hook = Some(hook);
    }

    /// Where the data starts on the data device.
    pub fn data_offset(&self) -> u64 {
        self.d_new
    }

    /// Bytes under the new key so far and bytes in all.
    pub fn progress(&self) -> (u64, u64) {
        (self.done, self.total)
    }

    /// The next step from the current layout (committed, or pending with resilience none).
    pub fn next_step(&self, hdr: &Luks2Header) -> Result<ReencryptStep> {
        let json = self.pending.as_ref().unwrap_or(&hdr.json);
        let model = Model::from_json(json, hdr.hdr_size)?;
        let r = model
            .reencryption()?
            .ok_or_else(|| bad("no reencryption"))?;
        if let Some(ds) = self.decrypt_shift {
            let (offset, len) = ds.next_step(&model, self.total)?;
            let hot_json = ds.hot_layout(&r, json, &model, offset, len, self.total)?;
            return ReencryptStep::new(offset, len, hot_json, hdr.hdr_size);
        }
        let regular: Vec<&Segment> = model.segments.values().filter(|s| !s.is_backup()).collect();
        if let Some(sh) = self.shift.filter(|sh| sh.moved_offset.is_some()) {
            let linear =
                regular
                    .iter()
                    .filter(|s| s.kind == "linear")
                    .try_fold(0u64, |sum, s| {
                        let size = s
                            .size
                            .ok_or_else(|| bad("plaintext segment of dynamic size"))?;
                        sum.checked_add(size)
                            .ok_or_else(|| bad("plaintext segment sizes overflow"))
                    })?;
            let (offset, len) = sh.next_step(linear)?;
            let hot_json = hot_layout_shift(&r, json, hdr.hdr_size, offset, len)?;
            return ReencryptStep::new(offset, len, hot_json, hdr.hdr_size);
        }
        // Where the part done starts (forward: the old part's start; backward: its end).
        let boundary = match regular.as_slice() {
            [_] if self.backward => self.total,
            [_] => 0,
            [first, _] => first.size.ok_or_else(|| bad("dynamic first segment"))?,
            _ => return Err(bad("unexpected segments mid-reencryption")),
        };
        let left = if self.backward {
            boundary
        } else {
            self.total.saturating_sub(boundary)
        };
        if left == 0 {
            return Err(bad("the data ends before the reencryption's progress"));
        }
        let len = self.step_len.min(left);
        let offset = if self.backward {
            boundary - len
        } else {
            boundary
        };
        let hot_json = hot_layout(&r, json, offset, len, self.total)?;
        ReencryptStep::new(offset, len, hot_json, hdr.hdr_size)
    }

    /// The step's zone as it is once rewritten: under the new key, with its IV offset.
    pub fn hot_segment(&self, hdr: &Luks2Header, step: &ReencryptStep) -> Result<SegmentKey> {
        let model = Model::from_json(&step.hot_json, hdr.hdr_size)?;
        let seg = model
            .segments
            .values()
            .find(|s| s.in_reencryption())
            .ok_or_else(|| bad("no hot segment"))?;
        Ok(self.under_new_key(seg, step.offset, step.len))
    }

    /// `seg`, covering `len` bytes from volume byte `start`, keyed with the new key.
    fn under_new_key(&self, seg: &Segment, start: u64, len: u64) -> SegmentKey {
        SegmentKey {
            start,
            len,
            storage_offset: seg.offset,
            cipher: *self.new.spec(),
            sector_size: seg.sector_size,
            iv: IvOptions {
                large_sectors: false,
                offset: seg.iv_tweak,
            },
            key: self.new_key.clone(),
            integrity: None,
        }
    }

    /// Protects the zone's old bytes (checksums or a journal copy, synced) and commits the
    /// zone as hot (not with resilience `none`). Nothing may write to the zone from here
    /// until [`complete`](Self::complete).
    pub fn protect(
        &self,
        hdr: &mut Luks2Header,
        dev: &mut dyn Storage,
        data: &dyn Storage,
        step: &ReencryptStep,
    ) -> Result<()> {
        let hot_model = Model::from_json(&step.hot_json, hdr.hdr_size)?;
        let hot_r = hot_model
            .reencryption()?
            .ok_or_else(|| bad("no reencryption"))?;
        protect(
            &hot_r,
            step.recovery,
            &*dev,
            data,
            self.d_new + step.offset,
            step.len,
            self.worker_hook,
        )?;
        if !self.none {
            dev.sync()?;
            hdr.commit(dev, step.hot_json.clone())?;
        }
        Ok(())
    }

    /// Rewrites the zone under the new key, 1 MiB pieces spread over the cores: each read
    /// from `data`, converted, and handed to `write(pos, piece)` (`pos` counted from the
    /// start of the data) to be stored.
    pub fn rewrite(
        &self,
        data: &dyn Storage,
        step: &ReencryptStep,
        write: &(dyn Fn(u64, &[u8]) -> Result<()> + Sync),
    ) -> Result<()> {
        in_pieces(step.len, self.worker_hook, |at, b| {
            let pos = step.offset + at;
            let from = match (self.decrypt_shift, self.shift) {
                (Some(ds), _) => ds.source(pos),
                (None, Some(sh)) => sh.source(pos),
                (None, None) => self.d_new + pos,
            };
            data.read_at(b, from)?;
            self.old.decrypt(pos / self.old.sector_size() as u64, b)?;
            self.new.encrypt(pos / self.new.sector_size() as u64, b)?;
            write(pos, b)
        })
    }

    /// Ends a rewritten step: data synced, the layout after it committed (with resilience
    /// `none` only when the job stops or ends), freed areas wiped; the last step finishes
    /// the job. `Some(outcome)` when the job ends here.
    pub fn complete(
        &mut self,
        hdr: &mut Luks2Header,
        dev: &mut dyn Storage,
        data: &dyn Storage,
        step: &ReencryptStep,
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<ReencryptOutcome>> {
        data.sync()?;
        let hot_model = Model::from_json(&step.hot_json, hdr.hdr_size)?;
        let hot_r = hot_model
            .reencryption()?
            .ok_or_else(|| bad("no reencryption"))?;
        let after = hot_r.after_recovery(&hot_model, &step.hot_json, self.data_size)?;
        self.done = if self.backward {
            self.total - step.offset
        } else {
            step.offset + step.len
        };
        let finished = after.finish_after_wipe
            || Model::from_json(&after.json, hdr.hdr_size)?
                .reencryption()?
                .is_none();
        if self.none && !finished && !stop() {
            self.pending = Some(after.json);
            return Ok(None);
        }
        self.pending = None;
        hdr.commit(dev, after.json)?;
        for (o, l) in after.wipe_header {
            keyslot::wipe_area(dev, o, l)?;
        }
        dev.sync()?;
        if after.finish_after_wipe {
            hdr.finish_reencryption(dev, data, self.data_size, true)?;
            return Ok(Some(ReencryptOutcome::Finished));
        }
        if finished {
            return Ok(Some(ReencryptOutcome::Finished));
        }
        Ok(stop().then_some(ReencryptOutcome::Stopped))
    }

    /// After a failed step: commits the progress of earlier steps that resilience `none`
    /// kept in memory, so that a resume does not convert them twice.
    pub fn abandon(
        &mut self,
        hdr: &mut Luks2Header,
        dev: &mut dyn Storage,
        data: &dyn Storage,
    ) -> Result<()> {
        if let Some(p) = self.pending.take() {
            data.sync()?;
            hdr.commit(dev, p)?;
        }
        Ok(())
    }

    /// The data's layout now (committed, or pending with resilience `none`), each stretch
    /// keyed: what a volume serving the data reads and writes through between steps.
    pub fn segments(&self, hdr: &Luks2Header) -> Result<Vec<SegmentKey>> {
        let json = self.pending.as_ref().unwrap_or(&hdr.json);
        let model = Model::from_json(json, hdr.hdr_size)?;
        if let Some(r) = model.reencryption()? {
            return crate::luks2::keyed_segments(
                &model,
                r.layout(&model, self.data_size)?,
                &self.keys,
            );
        }
        // Finished: the final layout, all under the new key.
        Ok(vec![self.under_new_key(hdr.segment(), 0, self.total)])
    }
}

/// Bytes per step: a data move's shift, else [`step_length`].
fn job_step_length(
    shift: Option<ShiftSource>,
    r: &Reencryption<'_>,
    hotzone: Option<u64>,
    align: u64,
) -> Result<u64> {
    match shift {
        Some(sh) if sh.size.is_multiple_of(align) => Ok(sh.size),
        Some(sh) => Err(bad(format!(
            "data shift {} is not a multiple of the {align}-byte sector size",
            sh.size
        ))),
        None => step_length(r, hotzone, align),
    }
}

/// Bytes per step: what the resilience area can protect, capped (1 GiB, `--hotzone-size`)
/// and rounded down to whole sectors of both layouts.
fn step_length(r: &Reencryption<'_>, hotzone: Option<u64>, align: u64) -> Result<u64> {
    let area = r.keyslot.area_size;
    let mut l = match &r.params.resilience {
        Resilience::Checksum { hash, sector_size } => {
            let h = HashAlg::from_name(hash)
                .map_err(|_| Luks2Error::Unsupported(format!("checksum hash '{hash}'")))?;
            area / h.output_len() as u64 * *sector_size as u64
        }
        Resilience::Journal => area,
        _ => hotzone.unwrap_or(DEFAULT_NONE_HOTZONE),
    };
    l = l.min(MAX_HOTZONE);
    if let Some(h) = hotzone {
        l = l.min(h);
    }
    let align = match &r.params.resilience {
        Resilience::Checksum { sector_size, .. } => align.max(*sector_size as u64),
        _ => align,
    };
    l -= l % align;
    if l == 0 {
        return Err(Luks2Error::Unsupported(format!(
            "hot zone smaller than one {align}-byte block"
        ))
        .into());
    }
    Ok(l)
}

/// Calls `f(offset, piece)` for each `CHUNK`-sized piece of `len` bytes (the last one
/// shorter), the pieces spread over the CPU's cores, each with a buffer of its thread.
/// With a `hook`, every piece runs on a helper thread that called it first.
fn in_pieces(
    len: u64,
    hook: Option<fn()>,
    f: impl Fn(u64, &mut [u8]) -> Result<()> + Sync,
) -> Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let pieces = len.div_ceil(CHUNK);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_THREADS)
        .min(pieces as usize)
        .max(1);
    let next = AtomicU64::new(0);
    let work = || -> Result<()> {
        let mut buf = Zeroizing::new(vec![0u8; CHUNK.min(len) as usize]);
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= pieces {
                return Ok(());
            }
            let at = i * CHUNK;
            let n = (len - at).min(CHUNK);
            f(at, &mut buf[..n as usize])?;
        }
    };
    std::thread::scope(|sc| {
        let (first, mine_too) = if hook.is_some() {
            (0, false)
        } else {
            (1, true)
        };
        let helpers: Vec<_> = (first..threads)
            .map(|_| {
                sc.spawn(|| {
                    if let Some(h) = hook {
                        h();
                    }
                    work()
                })
            })
            .collect();
        let mine = if mine_too { work() } else { Ok(()) };
        helpers
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(bad("worker thread panicked")))
            })
            .fold(mine, |acc, r| acc.and(r))
    })
}

/// Threads working on a hot zone at most.
const MAX_THREADS: usize = 8;

/// Writes the hot zone's protection (its old bytes at `at` on the data device): one hash
/// per block, or the bytes themselves, at the start of the reencrypt keyslot's area.
fn protect(
    r: &Reencryption<'_>,
    recovery: StepRecovery,
    dev: &dyn Storage,
    data: &dyn Storage,
    at: u64,
    len: u64,
    hook: Option<fn()>,
) -> Result<()> {
    let area = r.keyslot.area_offset;
    // The data-shift types protect their in-place step (the moved segment's) as their
    // plain counterparts do; their other steps need nothing (the source stays).
    match (&r.params.resilience, recovery) {
        (
            Resilience::Checksum { hash, sector_size }
            | Resilience::DatashiftChecksum {
                hash, sector_size, ..
            },
            StepRecovery::Checksums,
        ) => {
            let h = HashAlg::from_name(hash)
                .map_err(|_| Luks2Error::Unsupported(format!("checksum hash '{hash}'")))?;
            let (bs, hl) = (*sector_size as u64, h.output_len());
            if !CHUNK.is_multiple_of(bs) {
                return Err(
                    Luks2Error::Unsupported(format!("checksum block of {bs} bytes")).into(),
                );
            }
            let sums = std::sync::Mutex::new(vec![0u8; (len / bs) as usize * hl]);
            in_pieces(len, hook, |off, b| {
                data.read_at(b, at + off)?;
                let mine: Vec<u8> = b
                    .chunks(bs as usize)
                    .flat_map(|blk| h.digest(blk))
                    .collect();
                let first = (off / bs) as usize * hl;
                let mut all = sums.lock().unwrap_or_else(|e| e.into_inner());
                all[first..first + mine.len()].copy_from_slice(&mine);
                Ok(())
            })?;
            let sums = sums.into_inner().unwrap_or_else(|e| e.into_inner());
            dev.write_at(&sums, area)?;
        }
        (Resilience::Journal | Resilience::DatashiftJournal { .. }, StepRecovery::Journal) => {
            in_pieces(len, hook, |off, b| {
                data.read_at(b, at + off)?;
                Ok(dev.write_at(b, area + off)?)
            })?
        }
        _ => {}
    }
    Ok(())
}
