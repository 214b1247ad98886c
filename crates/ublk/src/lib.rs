//! A ublk frontend: serves any [`cryptblk_device::BlockDevice`] as a Linux block device,
//! `/dev/ublkbN`, through the kernel's ublk driver (`ublk_drv`, Linux 6.5+).
//!
//! ```no_run
//! use std::sync::Arc;
//! use cryptblk_device::MemoryDevice;
//! use cryptblk_ublk::UblkServer;
//!
//! let server = UblkServer::builder(Arc::new(MemoryDevice::new(64 << 20, 4096)))
//!     .queues(2)
//!     .queue_depth(64)
//!     .build()?; // the device is live when this returns
//! println!("{}", server.block_device().display());
//! let handle = server.shutdown_handle();
//! // elsewhere: handle.shutdown();
//! server.run()?; // serves until shut down, then drains, flushes and deletes the device
//! # Ok::<(), cryptblk_ublk::Error>(())
//! ```
//!
//! # Design
//!
//! One thread per hardware queue (one queue per CPU by default), pinned to the CPUs the block
//! layer maps to that queue. Each thread owns an io_uring, the queue's shared request
//! descriptors and one buffer per tag. It fetches requests with `URING_CMD`s and serves every
//! request itself: the kernel copies write data into the tag's buffer, the thread encrypts
//! it there in one call on the device (`write_at_mut`) and writes it out; reads are read into
//! the buffer and decrypted in place, and the kernel copies them out at commit. No request
//! crosses threads. When the device offers a split data path
//! ([`BlockDevice::split_io`]: file-backed volumes), the storage reads, writes and
//! `fdatasync`s go through the queue thread's own io_uring, so each queue keeps many
//! requests in flight, and the crypto stays inline on that thread (encrypt before the write
//! is queued, decrypt when the read completes). Other devices (memory) are called directly.
//!
//! # Recovery
//!
//! When the kernel offers `UBLK_F_USER_RECOVERY` (and `_REISSUE`), devices are created with
//! it: if the server dies, the kernel keeps `/dev/ublkbN`, holds new I/O and re-queues what
//! was in flight; [`Builder::recover`] attaches a new server, which serves those requests
//! again. Without it, the kernel stops the device when the server dies and I/O fails.

#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

#[allow(unsafe_code)]
mod ctrl;
#[allow(unsafe_code)]
mod queue;
#[allow(unsafe_code)]
pub(crate) mod sys;

pub use ctrl::CONTROL_PATH;
pub use queue::handle_request;
pub use sys::{
    IO_F_FUA, IO_OP_DISCARD, IO_OP_FLUSH, IO_OP_READ, IO_OP_WRITE, IO_OP_WRITE_ZEROES, IoDesc,
};

use cryptblk_device::BlockDevice;
use ctrl::Control;
use queue::{QueueCounters, QueueSetup};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Default requests in flight per queue.
pub const DEFAULT_QUEUE_DEPTH: u16 = 128;
/// Default largest request (and per-tag buffer), when the caller gives none.
pub const DEFAULT_MAX_IO_BYTES: u32 = 1 << 20;

/// Everything that can go wrong.
#[derive(Debug)]
pub enum Error {
    /// No ublk in this kernel, or no access to it.
    NotAvailable(String),
    /// The kernel lacks a feature this needs.
    Unsupported(String),
    /// Bad settings, or a device to recover that does not match.
    Invalid(String),
    /// The device to recover is still served, or in a state that cannot be recovered.
    Busy(String),
    /// A control command, queue setup, queue thread, the final flush or the device's
    /// deletion failed; the message names the step.
    Io(io::Error),
}

/// `Result` with the ublk frontend's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotAvailable(s) | Error::Unsupported(s) | Error::Invalid(s) | Error::Busy(s) => {
                f.write_str(s)
            }
            Error::Io(e) => write!(f, "ublk: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

fn ctx(what: &str) -> impl FnOnce(io::Error) -> Error + '_ {
    move |e| Error::Io(io::Error::new(e.kind(), format!("{what}: {e}")))
}

/// The ublk feature bits of the running kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features(pub u64);

impl Features {
    /// Opens /dev/ublk-control and asks the driver what it supports.
    pub fn probe() -> Result<Self> {
        let ctl = open_control()?;
        Ok(Features(ctl.features().map_err(Error::Io)?))
    }
    /// Whether every bit set in `bit` (one or more `UBLK_F_*` flags) is supported.
    pub fn has(&self, bit: u64) -> bool {
        self.0 & bit == bit
    }
    /// Names of the supported feature bits.
    pub fn names(&self) -> Vec<&'static str> {
        sys::FEATURE_NAMES
            .iter()
            .filter(|(b, _)| self.has(*b))
            .map(|(_, n)| *n)
            .collect()
    }
    /// Whether a dead server can be replaced with in-flight I/O re-issued.
    pub fn recovery(&self) -> bool {
        self.has(sys::F_USER_RECOVERY | sys::F_USER_RECOVERY_REISSUE)
    }
    /// What is missing for cryptblk's full feature set, in words (empty: nothing).
    pub fn missing(&self) -> Vec<String> {
        let mut m = Vec::new();
        if !self.has(sys::F_USER_RECOVERY) {
            m.push("UBLK_F_USER_RECOVERY (a dead server cannot be replaced; I/O fails)".into());
        } else if !self.has(sys::F_USER_RECOVERY_REISSUE) {
            m.push(
                "UBLK_F_USER_RECOVERY_REISSUE (I/O in flight when the server dies fails \
                 instead of being re-issued)"
                    .into(),
            );
        }
        m
    }
}

fn open_control() -> Result<Control> {
    Control::open().map_err(|e| Error::NotAvailable(e.to_string()))
}

/// Settings for a [`UblkServer`].
pub struct Builder {
    dev: Arc<dyn BlockDevice>,
    queues: Option<u16>,
    depth: u16,
    max_io_bytes: u32,
    physical_block_size: Option<u32>,
    rotational: bool,
    recovery: bool,
    recover: Option<u32>,
    dev_id: Option<u32>,
    uring_storage: bool,
}

impl Builder {
    /// Do the storage I/O of file-backed devices through each queue's io_uring, many
    /// requests in flight per queue (default on). Off: the queue thread calls the device
    /// (`pread`/`pwrite`), one request at a time.
    pub fn uring_storage(mut self, on: bool) -> Self {
        self.uring_storage = on;
        self
    }
    /// Hardware queues, each served by its own thread (default: one per CPU).
    pub fn queues(mut self, n: u16) -> Self {
        self.queues = Some(n);
        self
    }
    /// Requests in flight per queue (default 128, at most 4096).
    pub fn queue_depth(mut self, d: u16) -> Self {
        self.depth = d;
        self
    }
    /// Largest request; also the buffer size per tag (default 1 MiB; rounded down to a
    /// multiple of the page size, at least one block).
    pub fn max_io_bytes(mut self, n: u32) -> Self {
        self.max_io_bytes = n;
        self
    }
    /// Physical block size to advertise (default: the logical one).
    pub fn physical_block_size(mut self, n: u32) -> Self {
        self.physical_block_size = Some(n);
        self
    }
    /// Advertise a rotational disk (`UBLK_ATTR_ROTATIONAL`), so the I/O schedulers treat
    /// the device as one (default off: non-rotational).
    pub fn rotational(mut self, r: bool) -> Self {
        self.rotational = r;
        self
    }
    /// Create the device with user recovery when the kernel has it (default on).
    pub fn recovery(mut self, on: bool) -> Self {
        self.recovery = on;
        self
    }
    /// Attach to the existing device `dev_id`, whose server died, instead of adding one.
    pub fn recover(mut self, dev_id: u32) -> Self {
        self.recover = Some(dev_id);
        self
    }
    /// Ask for this device number (default: the kernel picks).
    pub fn dev_id(mut self, id: u32) -> Self {
        self.dev_id = Some(id);
        self
    }

    fn validate(&self) -> Result<(u8, u32)> {
        let bs = self.dev.block_size();
        if !bs.is_power_of_two() || !(512..=4096).contains(&bs) {
            return Err(Error::Invalid(format!(
                "block size {bs} is not a power of two in 512..4096"
            )));
        }
        if self.dev.size() < bs as u64 || !self.dev.size().is_multiple_of(bs as u64) {
            return Err(Error::Invalid(format!(
                "device size {} is not a positive multiple of the block size {bs}",
                self.dev.size()
            )));
        }
        if self.depth == 0 || self.depth as u32 > sys::MAX_QUEUE_DEPTH {
            return Err(Error::Invalid(format!(
                "queue depth {} not in 1..={}",
                self.depth,
                sys::MAX_QUEUE_DEPTH
            )));
        }
        if self.queues == Some(0) {
            return Err(Error::Invalid("at least one queue is needed".into()));
        }
        let page = 4096u32;
        let max = (self.max_io_bytes.min(sys::MAX_IO_BUF_BYTES) / page * page).max(page);
        Ok((bs.trailing_zeros() as u8, max))
    }

    fn params(&self, lbs_shift: u8, max_io: u32) -> sys::Params {
        let bs = 1u32 << lbs_shift;
        let pbs = self
            .physical_block_size
            .filter(|p| p.is_power_of_two())
            .unwrap_or(bs)
            .clamp(bs, 1 << 16);
        let mut attrs = sys::ATTR_VOLATILE_CACHE | sys::ATTR_FUA;
        if self.dev.read_only() {
            attrs |= sys::ATTR_READ_ONLY;
        }
        if self.rotational {
            attrs |= sys::ATTR_ROTATIONAL;
        }
        let zeroes_max = 1u32 << 21; // 1 GiB in sectors
        sys::Params {
            len: 0,
            types: sys::PARAM_TYPE_BASIC | sys::PARAM_TYPE_DISCARD,
            basic: sys::ParamBasic {
                attrs,
                logical_bs_shift: lbs_shift,
                physical_bs_shift: pbs.trailing_zeros() as u8,
                io_opt_shift: pbs.trailing_zeros() as u8,
                io_min_shift: pbs.trailing_zeros() as u8,
                max_sectors: max_io >> 9,
                chunk_sectors: 0,
                dev_sectors: self.dev.size() >> 9,
                virt_boundary_mask: 0,
            },
            discard: sys::ParamDiscard {
                discard_alignment: 0,
                discard_granularity: bs,
                max_discard_sectors: if self.dev.can_discard() {
                    zeroes_max
                } else {
                    0
                },
                max_write_zeroes_sectors: if self.dev.read_only() { 0 } else { zeroes_max },
                max_discard_segments: 1,
                reserved0: 0,
            },
            devt: Default::default(),
        }
    }

    /// Creates (or, with [`Builder::recover`], re-attaches to) the device and starts serving
    /// it; `/dev/ublkbN` is live when this returns.
    pub fn build(self) -> Result<UblkServer> {
        let (lbs_shift, max_io) = self.validate()?;
        let ctl = open_control()?;
        let features = Features(
            ctl.features()
                .map_err(|e| Error::Unsupported(e.to_string()))?,
        );
        if !features.has(sys::F_CMD_IOCTL_ENCODE) {
            return Err(Error::Unsupported(
                "ublk: the kernel lacks UBLK_F_CMD_IOCTL_ENCODE".into(),
            ));
        }
        match self.recover {
            Some(id) => self.build_recover(ctl, features, id, lbs_shift),
            None => self.build_new(ctl, features, lbs_shift, max_io),
        }
    }

    fn build_new(
        self,
        ctl: Control,
        features: Features,
        lbs: u8,
        max_io: u32,
    ) -> Result<UblkServer> {
        let queues = self.queues.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get().min(sys::MAX_QUEUE_DEPTH as usize) as u16)
        });
        let mut flags = sys::F_CMD_IOCTL_ENCODE;
        if self.recovery && features.has(sys::F_USER_RECOVERY) {
            flags |= sys::F_USER_RECOVERY;
            if features.has(sys::F_USER_RECOVERY_REISSUE) {
                flags |= sys::F_USER_RECOVERY_REISSUE;
            }
        }
        let mut info = sys::DevInfo {
            nr_hw_queues: queues,
            queue_depth: self.depth,
            max_io_buf_bytes: max_io,
            dev_id: self.dev_id.unwrap_or(u32::MAX),
            ublksrv_pid: std::process::id() as i32,
            flags,
            ..Default::default()
        };
        ctl.add_dev(&mut info).map_err(ctx("ublk ADD_DEV"))?;
        let id = info.dev_id;
        let ctl = Arc::new(ctl);
        let params = self.params(lbs, max_io);
        let started = (|| {
            ctl.set_params(id, &params)
                .map_err(ctx("ublk SET_PARAMS"))?;
            let threads = spawn_queues(&ctl, &info, &self.dev, self.uring_storage)?;
            ctl.start_dev(id).map_err(ctx("ublk START_DEV"))?;
            Ok::<_, Error>(threads)
        })();
        match started {
            Ok(threads) => Ok(UblkServer::new(ctl, info, features, self.dev, threads)),
            Err(e) => {
                let _ = ctl.stop_dev(id);
                let _ = ctl.del_dev(id);
                Err(e)
            }
        }
    }

    fn build_recover(
        self,
        ctl: Control,
        features: Features,
        id: u32,
        lbs: u8,
    ) -> Result<UblkServer> {
        // After a crash the kernel notices the dead server asynchronously; wait for it.
        let deadline = Instant::now() + Duration::from_secs(10);
        let info = loop {
            let info = ctl
                .dev_info(id)
                .map_err(|e| Error::Invalid(format!("ublk device {id}: {e}")))?;
            match info.state {
                sys::S_DEV_QUIESCED => break info,
                sys::S_DEV_LIVE if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                sys::S_DEV_LIVE => {
                    return Err(Error::Busy(format!(
                        "ublk device {id} is live, served by pid {}",
                        info.ublksrv_pid
                    )));
                }
                s => {
                    return Err(Error::Busy(format!(
                        "ublk device {id} cannot be recovered (state {}{})",
                        if s == sys::S_DEV_DEAD {
                            "dead"
                        } else {
                            "unknown"
                        },
                        if info.flags & sys::F_USER_RECOVERY == 0 {
                            ", created without UBLK_F_USER_RECOVERY"
                        } else {
                            ""
                        }
                    )));
                }
            }
        };
        let p = ctl.params(id).map_err(ctx("ublk GET_PARAMS"))?;
        if p.basic.dev_sectors != self.dev.size() >> 9 || p.basic.logical_bs_shift != lbs {
            return Err(Error::Invalid(format!(
                "ublk device {id} has {} sectors of {} bytes; this volume has {} of {}",
                p.basic.dev_sectors,
                1u32 << p.basic.logical_bs_shift,
                self.dev.size() >> 9,
                1u32 << lbs
            )));
        }
        // The old server's files may still be closing.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match ctl.start_recovery(id) {
                Ok(()) => break,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(e) => return Err(ctx("ublk START_USER_RECOVERY")(e)),
            }
        }
        let ctl = Arc::new(ctl);
        let threads = spawn_queues(&ctl, &info, &self.dev, self.uring_storage)?;
        ctl.end_recovery(id)
            .map_err(ctx("ublk END_USER_RECOVERY"))?;
        let info = ctl.dev_info(id).unwrap_or(info);
        Ok(UblkServer::new(ctl, info, features, self.dev, threads))
    }
}

/// A running queue thread and its counters.
type QueueThread = (JoinHandle<io::Result<()>>, Arc<QueueCounters>);

/// Opens /dev/ublkcN (it may take a moment to appear) and starts one thread per queue;
/// returns once every queue has fetched its requests.
fn spawn_queues(
    ctl: &Control,
    info: &sys::DevInfo,
    dev: &Arc<dyn BlockDevice>,
    uring_storage: bool,
) -> Result<Vec<QueueThread>> {
    let path = format!("/dev/ublkc{}", info.dev_id);
    let deadline = Instant::now() + Duration::from_secs(5);
    let cdev: File = loop {
        match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => break f,
            Err(e) if e.kind() == io::ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => return Err(ctx(&path)(e)),
        }
    };
    let cdev = Arc::new(cdev);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    for q in 0..info.nr_hw_queues {
        let cpus = ctl.queue_affinity(info.dev_id, q).unwrap_or_default();
        let counters = Arc::new(QueueCounters::default());
        let setup = QueueSetup {
            q_id: q,
            depth: info.queue_depth,
            buf_size: info.max_io_buf_bytes as usize,
            cdev: cdev.clone(),
            dev: dev.clone(),
            cpus,
            counters: counters.clone(),
            uring_storage,
        };
        let tx = tx.clone();
        let t = std::thread::Builder::new()
            .name(format!("ublk{}q{q}", info.dev_id))
            .spawn(move || queue::queue_thread(setup, tx))
            .map_err(ctx("spawning a queue thread"))?;
        threads.push((t, counters));
    }
    drop(tx);
    for _ in 0..info.nr_hw_queues {
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(ctx("ublk queue setup")(e)),
            Err(_) => return Err(Error::Io(io::Error::other("ublk queue thread died"))),
        }
    }
    Ok(threads)
}

/// A snapshot of the server's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests served (all queues).
    pub requests: u64,
    /// Requests answered with an error.
    pub errors: u64,
}

/// Stops a running server from another thread.
#[derive(Clone)]
pub struct ShutdownHandle {
    ctl: Arc<Control>,
    dev_id: u32,
    stopping: Arc<AtomicBool>,
    counters: Arc<Vec<Arc<QueueCounters>>>,
}

impl ShutdownHandle {
    /// Stops the device: the kernel drains in-flight I/O and removes /dev/ublkbN, then
    /// [`UblkServer::run`] flushes and deletes the device and returns. Idempotent.
    pub fn shutdown(&self) {
        if !self.stopping.swap(true, Relaxed)
            && let Err(e) = self.ctl.stop_dev(self.dev_id)
        {
            eprintln!("ublk{}: STOP_DEV failed: {e}", self.dev_id);
        }
    }
    /// The server's counters now, summed over all queues.
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for c in self.counters.iter() {
            s.requests += c.requests.load(Relaxed);
            s.errors += c.errors.load(Relaxed);
        }
        s
    }
}

/// A live ublk device and the threads that serve it.
pub struct UblkServer {
    info: sys::DevInfo,
    features: Features,
    dev: Arc<dyn BlockDevice>,
    threads: Vec<JoinHandle<io::Result<()>>>,
    handle: ShutdownHandle,
}

impl UblkServer {
    /// Settings start from the device; see [`Builder`].
    pub fn builder(dev: Arc<dyn BlockDevice>) -> Builder {
        Builder {
            dev,
            queues: None,
            depth: DEFAULT_QUEUE_DEPTH,
            max_io_bytes: DEFAULT_MAX_IO_BYTES,
            physical_block_size: None,
            rotational: false,
            recovery: true,
            recover: None,
            dev_id: None,
            uring_storage: true,
        }
    }

    fn new(
        ctl: Arc<Control>,
        info: sys::DevInfo,
        features: Features,
        dev: Arc<dyn BlockDevice>,
        threads: Vec<QueueThread>,
    ) -> Self {
        let (threads, counters): (Vec<_>, Vec<_>) = threads.into_iter().unzip();
        UblkServer {
            handle: ShutdownHandle {
                ctl,
                dev_id: info.dev_id,
                stopping: Arc::new(AtomicBool::new(false)),
                counters: Arc::new(counters),
            },
            info,
            features,
            dev,
            threads,
        }
    }

    /// The device number N of `/dev/ublkbN` (and of the char device `/dev/ublkcN`).
    pub fn dev_id(&self) -> u32 {
        self.info.dev_id
    }
    /// `/dev/ublkbN`.
    pub fn block_device(&self) -> PathBuf {
        PathBuf::from(format!("/dev/ublkb{}", self.info.dev_id))
    }
    /// Number of hardware queues (the kernel's `nr_hw_queues`), one serving thread each.
    pub fn queues(&self) -> u16 {
        self.info.nr_hw_queues
    }
    /// Requests in flight per queue, as the device was created with.
    pub fn queue_depth(&self) -> u16 {
        self.info.queue_depth
    }
    /// Largest request in bytes, also the buffer size per tag (the kernel's
    /// `max_io_buf_bytes`).
    pub fn max_io_bytes(&self) -> u32 {
        self.info.max_io_buf_bytes
    }
    /// Whether this device survives the death of its server (user recovery is on).
    pub fn recoverable(&self) -> bool {
        self.info.flags & sys::F_USER_RECOVERY != 0
    }
    /// The ublk feature bits of the running kernel, as probed when the server was built.
    pub fn features(&self) -> Features {
        self.features
    }
    /// A handle to stop the server from another thread; get it before [`UblkServer::run`].
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.handle.clone()
    }

    /// Serves until the device is stopped ([`ShutdownHandle::shutdown`]), then flushes the
    /// device and deletes the ublk device.
    pub fn run(self) -> Result<()> {
        let mut first_err = None;
        for t in self.threads {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("queue thread panicked")));
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        // If a queue failed on its own, stop the rest of the device too.
        self.handle.shutdown();
        let flushed = self.dev.flush();
        let deleted = self.handle.ctl.del_dev(self.info.dev_id);
        if let Some(e) = first_err {
            return Err(ctx("ublk queue")(e));
        }
        flushed.map_err(ctx("flush"))?;
        deleted.map_err(ctx("ublk DEL_DEV"))?;
        Ok(())
    }
}

/// Stops and deletes a device whose server is gone (after a crash), so its number and
/// memory are released. Pending I/O on it fails.
pub fn remove_stale(dev_id: u32) -> Result<()> {
    let ctl = open_control()?;
    let _ = ctl.stop_dev(dev_id);
    ctl.del_dev(dev_id).map_err(ctx("ublk DEL_DEV"))
}

/// State and server pid of device `dev_id` ("live", "quiesced", "dead"), or `None` if there
/// is no such device.
pub fn device_state(dev_id: u32) -> Result<Option<(&'static str, i32)>> {
    let ctl = open_control()?;
    match ctl.dev_info(dev_id) {
        Ok(i) => Ok(Some((
            match i.state {
                sys::S_DEV_LIVE => "live",
                sys::S_DEV_QUIESCED => "quiesced",
                sys::S_DEV_DEAD => "dead",
                _ => "unknown",
            },
            i.ublksrv_pid,
        ))),
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(Error::Io(e)),
    }
}
