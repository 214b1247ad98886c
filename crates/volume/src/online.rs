//! Online reencryption: cryptsetup's LUKS2 reencryption steps run on a volume while it
//! serves. Each step closes its zone (the hot zone) to writes, protects and rewrites it,
//! commits, and switches the volume to the layout after it. Reads never wait for more than
//! the store of one 1 MiB piece; writes to the zone wait for the pieces they touch to be
//! rewritten where the step's crash recovery keeps such writes (checksums), else for the
//! step to be committed (journal, data shift, none: their recovery would rewrite the whole
//! zone from its old bytes); requests elsewhere do not wait.
//!
//! The heavy work (hashing, rewriting) runs on idle-priority threads, and while clients
//! are doing I/O the rewriting threads pause after each piece so that together they take
//! about a quarter of one CPU: idle priority alone is not enough (a busy idle-class
//! thread still cost NBD clients 15-30 % of their 128k throughput on a 2-vCPU EPYC, see
//! docs/benchmarks.md). With no client I/O the job runs at full speed.

use crate::open::data_segment;
use crate::volume::HotZone;
use crate::{Result, Volume};
use cryptblk_format::luks2::{Luks2Header, ReencryptOutcome, StepHost};
use cryptblk_format::{LuksHeader, SegmentKey, Storage};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bytes rewritten per step when the volume serves and no `--hotzone-size` is given: a
/// write to the zone waits for its step, so steps stay short.
pub const ONLINE_HOTZONE: u64 = 32 << 20;

/// Runs (or resumes) the LUKS2 reencryption of `hdr` on `vol` while it serves, until it is
/// done or `stop()` says to stop between steps; `progress(done, total)` after each step.
/// `dev` is the header's storage (the volume's own file unless the header is detached).
/// The volume's layout follows every step; a state cut off anywhere is one either tool
/// resumes or recovers. The steps run through the format crate's one driver
/// ([`Luks2Header::run_steps`]); this side is the volume as its [`StepHost`].
#[allow(clippy::too_many_arguments)]
pub fn reencrypt_online(
    vol: &Volume,
    hdr: &mut Luks2Header,
    dev: &mut dyn Storage,
    passphrase: &[u8],
    slot: Option<u32>,
    hotzone: Option<u64>,
    stop: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ReencryptOutcome> {
    vol.check_layout_changeable()?;
    let data = vol.storage();
    let data_size = data.size()?;
    let hotzone = Some(hotzone.unwrap_or(ONLINE_HOTZONE));
    let Some(mut job) = hdr.reencrypt_job(dev, data, data_size, passphrase, slot, hotzone)? else {
        // Finished by a recovery, or all its data was done: the final layout.
        let (_, segs) = hdr.unlock_segments(dev, passphrase, slot, data_size)?;
        vol.set_layout(data_segments(segs)?)?;
        return Ok(ReencryptOutcome::Finished);
    };
    job.set_worker_hook(background_thread);
    let host = ServingVolume {
        vol,
        hot: Mutex::new(None),
    };
    Ok(hdr.run_steps(job, dev, data, &host, stop, progress)?)
}

/// The volume as the host of a job's steps: each step's zone is a [`HotZone`] (writes to
/// it wait, except into rewritten pieces where the step's recovery keeps them), rewritten
/// pieces are stored through it, and the layout follows each step.
struct ServingVolume<'a> {
    vol: &'a Volume,
    /// The running step's zone.
    hot: Mutex<Option<Arc<HotZone>>>,
}

fn format_err(e: crate::Error) -> cryptblk_format::Error {
    match e {
        crate::Error::Format(e) => e,
        crate::Error::Io(e) => cryptblk_format::Error::Io(e),
        e => cryptblk_format::Error::Io(std::io::Error::other(e.to_string())),
    }
}

impl StepHost for ServingVolume<'_> {
    fn set_layout(&self, segments: Vec<SegmentKey>) -> cryptblk_format::Result<()> {
        let segs = data_segments(segments).map_err(format_err)?;
        self.vol.set_layout(segs).map_err(format_err)?;
        *self.hot.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }
    fn begin_step(&self, hot: SegmentKey, client_writes: bool) -> cryptblk_format::Result<()> {
        let seg = data_segment(hot).map_err(format_err)?;
        let zone = self
            .vol
            .begin_hot_zone(seg, client_writes)
            .map_err(format_err)?;
        *self.hot.lock().unwrap_or_else(|e| e.into_inner()) = Some(zone);
        Ok(())
    }
    fn store(&self, pos: u64, piece: &[u8]) -> cryptblk_format::Result<()> {
        let zone = self
            .hot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| std::io::Error::other("a rewritten piece outside any step"))?;
        self.vol.store_rewritten(&zone, pos, piece)?;
        yield_to_clients(self.vol, &zone);
        Ok(())
    }
    fn step_failed(&self) {
        self.vol.fail_hot_zone();
    }
}

fn data_segments(segs: Vec<SegmentKey>) -> Result<Vec<crate::DataSegment>> {
    segs.into_iter().map(data_segment).collect()
}

/// The share of one CPU the rewriting threads take together while clients do I/O.
const BUSY_CPU_SHARE: f64 = 0.25;

thread_local! {
    /// This worker's CPU time when it last finished a piece (or started), and the client
    /// I/O counter then.
    static LAST_PIECE: std::cell::Cell<(Duration, u64)> =
        const { std::cell::Cell::new((Duration::ZERO, u64::MAX)) };
}

/// CPU time of the calling thread (not wall time: a worker preempted by clients has not
/// worked while it waited).
fn thread_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Called by a rewriting thread after each piece: if clients did I/O since its last one,
/// it sleeps long enough that the workers' CPU time stays at [`BUSY_CPU_SHARE`] of a CPU
/// (not while a writer waits for the zone: the job is then what the client waits for).
fn yield_to_clients(vol: &Volume, hot: &HotZone) {
    let st = vol.stats();
    let io = st.read_bytes.load(Relaxed) + st.written_bytes.load(Relaxed);
    let now = thread_cpu_time();
    let (last, seen) = LAST_PIECE.with(|c| c.replace((now, io)));
    if io != seen {
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
        let pause =
            now.saturating_sub(last).as_secs_f64() * (workers as f64 / BUSY_CPU_SHARE - 1.0);
        hot.pause(Duration::from_secs_f64(pause.min(1.0)));
    }
}

/// Starts a rewriting thread: in the idle scheduling class (it runs on CPU time no
/// client wants; best effort, where the kernel refuses it keeps its priority), its CPU
/// clock noted for [`yield_to_clients`].
#[allow(unsafe_code)]
fn background_thread() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler(0, ...) changes only the calling thread's policy; `param`
    // is an initialised sched_param that outlives the call.
    let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    LAST_PIECE.with(|c| c.set((thread_cpu_time(), u64::MAX)));
}
