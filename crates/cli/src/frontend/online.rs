//! The serving process's side of online reencryption: `reencrypt JSON` on the control
//! socket starts a job on the served volume (metadata written, or a job in progress
//! resumed), `reencrypt-stop` stops it after the current step, `status` reports its
//! progress, and `close` stops it before the volume closes. The job runs on its own
//! thread; clients go on reading and writing throughout.

use crate::commands::reencrypt::{Job, from_wire, read_luks2};
use crate::control::Reply;
use crate::error::{CliError, CliResult};
use cryptblk_format::luks2::{Luks2Header, ReencryptOutcome};
use cryptblk_volume::DataDevice;
use cryptblk_volume::Volume;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Instant;
use zeroize::Zeroizing;

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    Finished,
    Stopped,
    Failed,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Running => "running",
            Phase::Finished => "finished",
            Phase::Stopped => "stopped",
            Phase::Failed => "failed",
        }
    }
}

/// The last job's progress, for `status`.
struct Progress {
    phase: Phase,
    done: u64,
    total: u64,
    /// When the first step of this run ended, and the bytes done then (for the rate).
    first: Option<(Instant, u64)>,
    last: Option<(Instant, u64)>,
    resilience: String,
    error: Option<String>,
}

/// The reencryption a served volume runs on request (at most one at a time).
pub(crate) struct OnlineJobs {
    vol: Arc<Volume>,
    /// The LUKS2 header's file (the data file, or the detached header); `None` for
    /// volumes without one (plain, memory).
    header: Option<DataDevice>,
    device: PathBuf,
    progress: Mutex<Option<Progress>>,
    stop: Arc<AtomicBool>,
    thread: Mutex<JobThread>,
    /// Held by whoever stops the job and waits for it, so that a second caller waits too
    /// (instead of finding no handle and going on while the job still runs).
    joining: Mutex<()>,
}

/// The job's thread, and whether the volume is closing (no job starts any more).
#[derive(Default)]
struct JobThread {
    handle: Option<JoinHandle<()>>,
    closed: bool,
}

impl OnlineJobs {
    pub(crate) fn new(vol: Arc<Volume>, header: Option<DataDevice>, device: &Path) -> Arc<Self> {
        Arc::new(OnlineJobs {
            vol,
            header,
            device: device.to_path_buf(),
            progress: Mutex::new(None),
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(JobThread::default()),
            joining: Mutex::new(()),
        })
    }

    /// `reencrypt`: starts the job and answers once its metadata is written (or the job in
    /// progress is taken up): `started`, or `error CODE: message`.
    pub(crate) fn start(self: &Arc<Self>, pass: &[u8], job: &Value) -> Reply {
        match self.try_start(pass, job) {
            Ok(()) => Reply::Started,
            Err(e) => Reply::error(&e),
        }
    }

    fn try_start(self: &Arc<Self>, pass: &[u8], v: &Value) -> CliResult<()> {
        let closing = || CliError::new(crate::error::EXIT_BUSY, "the volume is closing");
        if self.lock_thread().closed {
            return Err(closing());
        }
        let pass = Zeroizing::new(pass.to_vec());
        let job = Job::of(&from_wire(v, &self.device))?;
        if cryptblk_device::BlockDevice::read_only(&*self.vol) {
            return Err(CliError::usage(
                "the volume is served read-only: reencrypt it with the volume closed, or \
                 served read-write",
            ));
        }
        let mut thread = self.lock_thread();
        if thread.closed {
            return Err(closing());
        }
        if thread.handle.as_ref().is_some_and(|t| !t.is_finished()) {
            return Err(CliError::new(
                crate::error::EXIT_BUSY,
                "a reencryption is already running on this volume",
            ));
        }
        let file = self.header.as_ref().ok_or_else(|| {
            CliError::usage("only LUKS2 volumes can be reencrypted (this one has no LUKS header)")
        })?;
        let mut hfile = file.clone();
        self.stop.store(false, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        let me = self.clone();
        thread.handle = Some(std::thread::spawn(move || {
            me.run(&mut hfile, job, &pass, tx);
        }));
        drop(thread);
        rx.recv()
            .unwrap_or_else(|_| Err(CliError::usage("the reencryption thread died")))
    }

    /// The job thread: init (or take up), tell `started`, then the steps.
    fn run(
        &self,
        hfile: &mut DataDevice,
        job: Job,
        pass: &[u8],
        started: mpsc::Sender<CliResult<()>>,
    ) {
        let mut hdr = match self.init(hfile, &job, pass) {
            Ok(Some(h)) => h,
            Ok(None) => {
                let _ = started.send(Ok(()));
                return;
            }
            Err(e) => {
                let _ = started.send(Err(e));
                return;
            }
        };
        *self.progress.lock().unwrap_or_else(|e| e.into_inner()) = Some(Progress {
            phase: Phase::Running,
            done: 0,
            total: 0,
            first: None,
            last: None,
            resilience: hdr.reencryption_resilience().unwrap_or_else(|| "?".into()),
            error: None,
        });
        let _ = started.send(Ok(()));
        let stop = self.stop.clone();
        let outcome = cryptblk_volume::reencrypt_online(
            &self.vol,
            &mut hdr,
            hfile,
            pass,
            job.slot,
            job.hotzone,
            &|| stop.load(Ordering::Relaxed),
            &mut |done, total| self.note(done, total),
        );
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = p.as_mut() {
            match outcome {
                Ok(ReencryptOutcome::Finished) => p.phase = Phase::Finished,
                Ok(ReencryptOutcome::Stopped) => p.phase = Phase::Stopped,
                Err(e) => {
                    eprintln!("reencryption failed: {e}");
                    p.phase = Phase::Failed;
                    p.error = Some(e.to_string());
                }
            }
        }
    }

    /// Checks and writes the job's metadata; `None` when only that was asked.
    fn init(
        &self,
        hfile: &mut DataDevice,
        job: &Job,
        pass: &[u8],
    ) -> CliResult<Option<Luks2Header>> {
        let mut hdr = read_luks2(hfile, &self.device)?;
        let block = cryptblk_device::BlockDevice::block_size(&*self.vol);
        if let Some(ss) = job.req.sector_size
            && ss > block
        {
            return Err(CliError::usage(format!(
                "--sector-size {ss} is larger than the served volume's {block}-byte blocks: \
                 its clients could not address it (reencrypt it with the volume closed)"
            )));
        }
        let size = self
            .vol
            .storage_size()
            .map_err(|e| crate::error::io_err(&self.device, e))?;
        let run = job.init(&mut hdr, hfile, size, pass, false)?;
        Ok(run.then_some(hdr))
    }

    fn note(&self, done: u64, total: u64) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = p.as_mut() {
            let now = (Instant::now(), done);
            p.first.get_or_insert(now);
            p.last = Some(now);
            p.done = done;
            p.total = total;
        }
    }

    fn lock_thread(&self) -> std::sync::MutexGuard<'_, JobThread> {
        self.thread.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a job is running now.
    pub(crate) fn running(&self) -> bool {
        self.lock_thread()
            .handle
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }

    /// Stops the job after its current step (`reencrypt-stop`).
    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Stops the job and waits for it as the volume closes: no job starts after this
    /// (unless [`OnlineJobs::reopen`]: the stop was refused).
    pub(crate) fn close(&self) {
        let _joining = self.joining.lock().unwrap_or_else(|e| e.into_inner());
        // Under the lock that `start` holds while it resets the flag and spawns: a job
        // started just before is the one stopped and waited for, not left running.
        let t = {
            let mut thread = self.lock_thread();
            thread.closed = true;
            self.request_stop();
            thread.handle.take()
        };
        if let Some(t) = t {
            let _ = t.join();
        }
    }

    /// Jobs may start again: the volume did not close after all (a FUSE file in use).
    pub(crate) fn reopen(&self) {
        self.lock_thread().closed = false;
    }

    /// `status`'s `reencryption` object (null when no job ran).
    pub(crate) fn status(&self) -> Value {
        let p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let Some(p) = p.as_ref() else {
            return Value::Null;
        };
        let rate = match (p.first, p.last) {
            (Some((t0, d0)), Some((t1, d1))) if t1 > t0 => {
                (d1 - d0) as f64 / (t1 - t0).as_secs_f64()
            }
            _ => 0.0,
        };
        json!({
            "state": p.phase.name(), "done_bytes": p.done, "total_bytes": p.total,
            "bytes_per_second": rate as u64, "resilience": p.resilience, "error": p.error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::OnlineJobs;
    use cryptblk_crypto::{CipherSpec, IvOptions, SectorCipher};
    use cryptblk_device::MemStorage;
    use cryptblk_volume::{Volume, VolumeParams};
    use std::path::Path;
    use std::sync::Arc;

    #[test]
    fn once_the_volume_closes_no_reencryption_starts() {
        let cipher = CipherSpec::parse("aes-xts-plain64").unwrap();
        let params = VolumeParams {
            cipher,
            sector_size: 512,
            iv: IvOptions::default(),
            data_offset: 0,
            data_length: None,
            read_only: false,
            allow_discards: false,
        };
        let sc = SectorCipher::new(cipher, &[7u8; 64], 512, IvOptions::default()).unwrap();
        let vol = Volume::new(Box::new(MemStorage::new(1 << 20)), sc, &params).unwrap();
        let jobs = OnlineJobs::new(Arc::new(vol), None, Path::new("mem:test"));
        // Serving: the request is looked at (and this one is malformed).
        let malformed = serde_json::json!({"cipher": 7});
        let served = jobs.start(&[0], &malformed).to_string();
        assert!(served.starts_with("error"), "{served}");
        jobs.close();
        let closing = jobs.start(&[0], &malformed).to_string();
        assert_eq!(closing, "error 5: the volume is closing");
        assert!(!jobs.running());
        // The stop was refused after all: requests are looked at again.
        jobs.reopen();
        assert_ne!(jobs.start(&[0], &malformed).to_string(), closing);
    }
}
