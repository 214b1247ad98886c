//! Online reencryption: cryptsetup's LUKS2 reencryption steps run on a volume while it
//! serves. Each step closes its zone (the hot zone) to writes, protects and rewrites it,
//! commits, and switches the volume to the layout after it. Reads never wait for more than
//! the store of one 1 MiB piece; writes to the zone wait for the pieces they touch to be
//! rewritten (checksum and none resilience) or for the step (journal); requests
//! elsewhere do not wait.
//!
//! The heavy work (hashing, rewriting) runs on idle-priority threads, and while clients
//! are doing I/O the rewriting threads pause after each piece so that together they take
//! about a quarter of one CPU: idle priority alone is not enough (a busy idle-class
//! thread still cost NBD clients 15-30 % of their 128k throughput on a 2-vCPU EPYC, see
//! docs/benchmarks.md). With no client I/O the job runs at full speed.

use crate::open::data_segment;
use crate::{Result, Volume};
use cryptblk_format::luks2::{Luks2Header, ReencryptJob, ReencryptOutcome};
use cryptblk_format::{LuksHeader, SegmentKey, Storage};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// Bytes rewritten per step when the volume serves and no `--hotzone-size` is given: a
/// write to the zone waits for its step, so steps stay short.
pub const ONLINE_HOTZONE: u64 = 32 << 20;

/// Runs (or resumes) the LUKS2 reencryption of `hdr` on `vol` while it serves, until it is
/// done or `stop()` says to stop between steps; `progress(done, total)` after each step.
/// `dev` is the header's storage (the volume's own file unless the header is detached).
/// The volume's layout follows every step; a state cut off anywhere is one either tool
/// resumes or recovers.
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
    vol.set_layout(data_segments(job.segments(hdr)?)?)?;
    job.set_worker_hook(background_thread);
    loop {
        let step = job.next_step(hdr)?;
        let seg = data_segment(job.hot_segment(hdr, &step)?)?;
        let hot = vol.begin_hot_zone(seg, job.rewritten_writable())?;
        // Whatever fails from here on, the zone must end (failed): writers wait on it.
        let stepped = run_step(vol, &mut job, hdr, dev, &step, &hot, stop)
            .map_err(crate::Error::from)
            .and_then(|end| {
                vol.set_layout(data_segments(job.segments(hdr)?)?)?;
                Ok(end)
            });
        let end = match stepped {
            Ok(end) => end,
            Err(e) => {
                vol.fail_hot_zone();
                let _ = job.abandon(hdr, dev, data);
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

/// One step with its zone closed to writes: what reached the zone before it closed is
/// synced first (its protection must match the disk), then protect, rewrite, commit.
fn run_step(
    vol: &Volume,
    job: &mut ReencryptJob,
    hdr: &mut Luks2Header,
    dev: &mut dyn Storage,
    step: &cryptblk_format::luks2::ReencryptStep,
    hot: &crate::volume::HotZone,
    stop: &dyn Fn() -> bool,
) -> cryptblk_format::Result<Option<ReencryptOutcome>> {
    let data = vol.storage();
    data.sync()?;
    job.protect(hdr, dev, data, step)?;
    job.rewrite(data, step, &|pos, b| {
        vol.store_rewritten(hot, pos, b)?;
        yield_to_clients(vol, hot);
        Ok(())
    })?;
    job.complete(hdr, dev, data, step, stop)
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
fn yield_to_clients(vol: &Volume, hot: &crate::volume::HotZone) {
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
