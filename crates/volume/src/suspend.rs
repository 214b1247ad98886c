//! `luksSuspend` / `luksResume` for a served volume: every key dropped (zeroized) and every
//! request held until the volume is unlocked again, as dm-crypt's suspend does (the key
//! leaves kernel memory and I/O queues up). A thread of its own holds the layout lock
//! alone for the whole suspension, so requests wait on the lock they already take and
//! the data path pays nothing for the feature.
//!
//! A LUKS2 volume with integrity has its dm-integrity device closed at suspend as the
//! kernel's `dm_integrity_postsuspend` leaves it (flushed; in bitmap mode the journal area
//! emptied and the bitmap clean) and dropped with its keys; a resume opens it again on the
//! same storage, in the same mode, with the key the header gives.

use crate::volume::Layout;
use crate::{DataSegment, Error, IntegrityMode, Result, Volume};
use cryptblk_format::SegmentKey;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

/// A suspended volume: [`Suspended::resume`] gives it its keys back.
pub struct Suspended {
    segments: mpsc::Sender<Vec<DataSegment>>,
    result: mpsc::Receiver<Result<()>>,
    thread: Option<JoinHandle<()>>,
    vol: Arc<Volume>,
    /// A volume with integrity: where its dm-integrity device starts, whether it was
    /// read-only, its mode (what opening it again takes besides the key).
    integrity: Option<(u64, bool, IntegrityMode)>,
}

impl Volume {
    /// Suspends the volume: waits for the requests in flight, drops every key (zeroized)
    /// and holds every new request until [`Suspended::resume`]. Refused while an online
    /// reencryption step runs (the job holds keys of its own). A volume with integrity
    /// resumes through [`Suspended::resume_keys`], from a LUKS2 header's keys: a standalone
    /// integritysetup volume has none (the CLI suspends only volumes with a header).
    pub fn suspend(self: &Arc<Self>) -> Result<Suspended> {
        let (seg_tx, seg_rx) = mpsc::channel::<Vec<DataSegment>>();
        let (res_tx, res_rx) = mpsc::channel::<Result<()>>();
        let integrity = self.integrity().map(|i| i.reopen_params());
        let vol = self.clone();
        let thread = std::thread::spawn(move || {
            let mut l = vol.layout_alone();
            if l.hot.is_some() {
                let _ = res_tx.send(Err(Error::Invalid(
                    "a reencryption step is running: stop the reencryption first".into(),
                )));
                return;
            }
            for i in l.segments.iter().filter_map(|s| s.integrity.as_ref()) {
                // Written out and left as the kernel leaves a suspended device; a failure
                // keeps the volume serving, unsuspended.
                if let Err(e) = i.close(vol.storage()) {
                    let _ = res_tx.send(Err(Error::Invalid(format!(
                        "suspend: the dm-integrity device could not be flushed: {e}"
                    ))));
                    return;
                }
                vol.stats().integrity_errors.store(i.failures(), Relaxed);
            }
            vol.set_integrity(None);
            l.segments.clear();
            // The keys' drop ran in frames below this one, where it may have moved key
            // material before wiping it (codegen decides): wiped before this thread waits
            // for the whole suspension.
            cryptblk_crypto::scrub_stack();
            let _ = res_tx.send(Ok(()));
            hold(&vol, &mut l, &seg_rx, &res_tx);
        });
        match res_rx.recv() {
            Ok(Ok(())) => Ok(Suspended {
                segments: seg_tx,
                result: res_rx,
                thread: Some(thread),
                vol: self.clone(),
                integrity,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Invalid("the suspending thread died".into())),
        }
    }
}

/// Holds the layout (no keys) until a layout that fits arrives. If the [`Suspended`] goes
/// away without resuming, the volume stays held: with no keys it has nothing to serve.
fn hold(
    vol: &Volume,
    l: &mut Layout,
    segments: &mpsc::Receiver<Vec<DataSegment>>,
    result: &mpsc::Sender<Result<()>>,
) {
    while let Ok(segs) = segments.recv() {
        match vol.check_layout(&segs) {
            Ok(()) => {
                vol.install(l, segs);
                let _ = result.send(Ok(()));
                return;
            }
            Err(e) => {
                let _ = result.send(Err(e));
            }
        }
    }
    loop {
        std::thread::park();
    }
}

impl Suspended {
    /// [`Suspended::resume`] from the header's unlocked segments (`keys`): a segment with
    /// integrity has its dm-integrity device opened again on the volume's storage, in the
    /// mode it had, counting its failed sectors on from where they were.
    pub fn resume_keys(&mut self, keys: Vec<SegmentKey>) -> Result<()> {
        let segments = keys
            .into_iter()
            .map(|k| match (&k.integrity, self.integrity) {
                (Some(_), Some(params)) => {
                    let seg = crate::open::integrity_segment_again(self.vol.storage(), &k, params)?;
                    if let Some(i) = &seg.integrity {
                        i.carry_failures(self.vol.stats().integrity_errors.load(Relaxed));
                    }
                    Ok(seg)
                }
                (Some(_), None) => Err(Error::Invalid(
                    "the header gives integrity protection the suspended volume did not have"
                        .into(),
                )),
                (None, Some(_)) => Err(Error::Invalid(
                    "the header gives no integrity protection; the suspended volume had it".into(),
                )),
                (None, None) => crate::open::data_segment(k),
            })
            .collect::<Result<Vec<_>>>()?;
        self.resume(segments)
    }

    /// Gives the volume its keys back (`segments`: the header unlocked again, as the
    /// volume was opened) and lets the held requests go on. A layout that does not fit
    /// the volume is refused and the volume stays suspended.
    pub fn resume(&mut self, segments: Vec<DataSegment>) -> Result<()> {
        self.segments
            .send(segments)
            .map_err(|_| Error::Invalid("the suspending thread died".into()))?;
        self.result
            .recv()
            .map_err(|_| Error::Invalid("the suspending thread died".into()))??;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        Ok(())
    }
}
