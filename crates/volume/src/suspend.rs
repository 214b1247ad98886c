//! `luksSuspend` / `luksResume` for a served volume: every key dropped (zeroized) and every
//! request held until the volume is unlocked again, as dm-crypt's suspend does (the key
//! leaves kernel memory and I/O queues up). A thread of its own holds the layout lock
//! alone for the whole suspension, so requests wait on the lock they already take and
//! the data path pays nothing for the feature.

use crate::volume::Layout;
use crate::{DataSegment, Error, Result, Volume};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

/// A suspended volume: [`Suspended::resume`] gives it its keys back.
pub struct Suspended {
    segments: mpsc::Sender<Vec<DataSegment>>,
    result: mpsc::Receiver<Result<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Volume {
    /// Suspends the volume: waits for the requests in flight, drops every key (zeroized)
    /// and holds every new request until [`Suspended::resume`]. Refused while an online
    /// reencryption step runs (the job holds keys of its own).
    pub fn suspend(self: &Arc<Self>) -> Result<Suspended> {
        let (seg_tx, seg_rx) = mpsc::channel::<Vec<DataSegment>>();
        let (res_tx, res_rx) = mpsc::channel::<Result<()>>();
        let vol = self.clone();
        let thread = std::thread::spawn(move || {
            let mut l = vol.layout_alone();
            if l.hot.is_some() {
                let _ = res_tx.send(Err(Error::Invalid(
                    "a reencryption step is running: stop the reencryption first".into(),
                )));
                return;
            }
            if l.segments.iter().any(|s| s.integrity.is_some()) {
                // Its journal state lives with the segment; resuming would have to reopen
                // the dm-integrity device.
                let _ = res_tx.send(Err(Error::Invalid(
                    "suspend is not supported on volumes with integrity protection".into(),
                )));
                return;
            }
            l.segments.clear();
            let _ = res_tx.send(Ok(()));
            hold(&vol, &mut l, &seg_rx, &res_tx);
        });
        match res_rx.recv() {
            Ok(Ok(())) => Ok(Suspended {
                segments: seg_tx,
                result: res_rx,
                thread: Some(thread),
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
