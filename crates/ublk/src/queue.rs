//! One ublk queue: a thread pinned to the queue's CPUs that fetches requests from the kernel
//! and serves each one itself, inline, in the request's own buffer (no hand-off).

use crate::sys::{self, IoCmd, IoDesc};
use cryptblk_device::{BlockDevice, errno_of};
use io_uring::{IoUring, opcode, types};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::Sender;

/// Per-queue counters (each queue writes only its own; `stats` sums them).
#[derive(Default, Debug)]
pub(crate) struct QueueCounters {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
}

pub(crate) struct QueueSetup {
    pub q_id: u16,
    pub depth: u16,
    /// Bytes of buffer per tag (the device's max_io_buf_bytes).
    pub buf_size: usize,
    pub cdev: Arc<File>,
    pub dev: Arc<dyn BlockDevice>,
    /// CPUs to pin the thread to (empty: not pinned).
    pub cpus: Vec<usize>,
    pub counters: Arc<QueueCounters>,
    /// Do storage I/O through the queue's io_uring when the device allows it
    /// ([`BlockDevice::split_io`]); else (and for memory devices) call the device.
    pub uring_storage: bool,
}

/// Serves one request the kernel handed over. `buf` is the request's own buffer (the
/// kernel copied write data into it, and copies read data out of it at commit); reads are
/// decrypted and writes encrypted in place, in one device call. Returns what the kernel
/// expects in the commit: bytes transferred for reads and writes, 0 for the other
/// operations, or a negative errno.
pub fn handle_request(dev: &dyn BlockDevice, iod: &IoDesc, buf: &mut [u8]) -> i32 {
    if iod.op() == sys::IO_OP_FLUSH {
        // A flush carries no range (its start sector is not meaningful).
        return dev.flush().map_or_else(|e| -errno_of(&e), |_| 0);
    }
    let (off, len) = match byte_range(iod, buf.len()) {
        Ok(r) => r,
        Err(errno) => return errno,
    };
    let r = match iod.op() {
        sys::IO_OP_READ => dev.read_at(&mut buf[..len], off).map(|_| len as i32),
        sys::IO_OP_WRITE => dev
            .write_at_mut(&mut buf[..len], off, iod.flags() & sys::IO_F_FUA != 0)
            .map(|_| len as i32),
        sys::IO_OP_DISCARD => dev.discard(off, len as u64).map(|_| 0),
        sys::IO_OP_WRITE_ZEROES => dev
            .write_zeroes(off, len as u64, iod.flags() & sys::IO_F_NOUNMAP == 0)
            .map(|_| 0),
        _ => return -libc::EOPNOTSUPP,
    };
    r.unwrap_or_else(|e| -errno_of(&e))
}

/// The byte offset and length of a request other than a flush, or the negative errno
/// refusing it (a start beyond 2^64 bytes, data larger than the request's buffer).
fn byte_range(iod: &IoDesc, buf_len: usize) -> Result<(u64, usize), i32> {
    let off = iod.start_sector.checked_mul(512).ok_or(-libc::EINVAL)?;
    let len = iod.nr_sectors as usize * 512;
    if matches!(iod.op(), sys::IO_OP_READ | sys::IO_OP_WRITE) && len > buf_len {
        return Err(-libc::EINVAL);
    }
    Ok((off, len))
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// A memory mapping, unmapped on drop.
struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    fn new(len: usize, prot: i32, flags: i32, fd: i32, offset: i64) -> io::Result<Self> {
        // SAFETY: a fresh mapping (no fixed address), so no existing memory is affected;
        // the result is checked for MAP_FAILED.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, offset) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned, and no reference into the
        // mapping outlives the queue that owns it.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Pins the calling thread to `cpus`.
fn pin(cpus: &[usize]) -> io::Result<()> {
    if cpus.is_empty() {
        return Ok(());
    }
    // SAFETY: cpu_set_t is a plain bit array; all-zero is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: CPU_SET bounds-checks `c` against the set's size.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 = this thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The mapped request descriptors and buffers of one queue, and its ring.
struct Queue {
    // Dropped first: the ring goes before the memory its commands name.
    ring: IoUring,
    setup: QueueSetup,
    iods: Mapping,
    bufs: Mapping,
    /// Per tag: the request whose storage I/O is in flight.
    pending: Vec<Pending>,
    /// Storage operations submitted and not yet completed: the kernel may still read or
    /// write their buffers, so the queue's memory must outlive them (see `Drop`).
    storage_inflight: usize,
}

impl Drop for Queue {
    /// On every way out of `run`, an error included, waits for the storage operations
    /// still in flight before the buffers they name are unmapped: a read completing into
    /// unmapped (or, worse, re-mapped) memory would write into whatever lives there now.
    fn drop(&mut self) {
        self.drain_storage();
    }
}

impl Queue {
    fn new(setup: QueueSetup) -> io::Result<Self> {
        let page = page_size();
        let depth = setup.depth as usize;
        let desc = std::mem::size_of::<IoDesc>();
        let iod_len = (depth * desc).div_ceil(page) * page;
        let stride = (sys::MAX_QUEUE_DEPTH as usize * desc).div_ceil(page) * page;
        let iods = Mapping::new(
            iod_len,
            libc::PROT_READ,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            setup.cdev.as_raw_fd(),
            sys::CMD_BUF_OFFSET + (setup.q_id as usize * stride) as i64,
        )?;
        Self::with_iods(setup, iods)
    }

    /// The queue around an already mapped descriptor area.
    fn with_iods(setup: QueueSetup, iods: Mapping) -> io::Result<Self> {
        let depth = setup.depth as usize;
        let bufs = Mapping::new(
            depth * setup.buf_size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )?;
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .build(depth.next_power_of_two() as u32)?;
        Ok(Queue {
            ring,
            iods,
            bufs,
            pending: vec![Pending::default(); depth],
            storage_inflight: 0,
            setup,
        })
    }

    fn buf_addr(&self, tag: u16) -> u64 {
        self.bufs.ptr as u64 + tag as u64 * self.setup.buf_size as u64
    }

    fn push(&mut self, op: u32, tag: u16, result: i32) -> io::Result<()> {
        let cmd = IoCmd {
            q_id: self.setup.q_id,
            tag,
            result,
            addr: self.buf_addr(tag),
        };
        let sqe = opcode::UringCmd16::new(types::Fd(self.setup.cdev.as_raw_fd()), op)
            .cmd(sys::to_cmd_bytes(&cmd))
            .build()
            .user_data(tag as u64);
        // SAFETY: the command names this tag's buffer, which lives (in `self.bufs`) until
        // the queue is dropped, after every command has completed.
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("ublk queue ring full"))
    }

    /// The tag's buffer and its current request descriptor.
    fn tag(&mut self, tag: u16) -> (IoDesc, &mut [u8]) {
        // SAFETY: tag < depth, so the descriptor lies inside the mapped area; the kernel
        // wrote it before completing the fetch and does not change it until our commit.
        // It is read volatile because the memory is shared with the kernel.
        let iod =
            unsafe { std::ptr::read_volatile((self.iods.ptr as *const IoDesc).add(tag as usize)) };
        let size = self.setup.buf_size;
        // SAFETY: the tag's buffer is `size` bytes inside the anonymous mapping; between a
        // fetch's completion and the next commit the kernel does not touch it, only this
        // thread uses it, and no storage I/O on it is in flight while the slice is used
        // (storage I/O is submitted after the slice's last use and completes before the next).
        let buf = unsafe {
            std::slice::from_raw_parts_mut(
                (self.bufs.ptr as *mut u8).add(tag as usize * size),
                size,
            )
        };
        (iod, buf)
    }

    fn count(&self, r: i32) {
        self.setup.counters.requests.fetch_add(1, Relaxed);
        if r < 0 {
            self.setup.counters.errors.fetch_add(1, Relaxed);
        }
    }

    /// A request just arrived on `tag`. Returns its result when it is done at once; `None`
    /// when storage I/O went to the ring (the request completes in `storage_done`).
    fn start(&mut self, tag: u16) -> Option<i32> {
        let dev = self.setup.dev.clone();
        let uring = self.setup.uring_storage;
        let (iod, buf) = self.tag(tag);
        // Asked only when the ring is to move the ciphertext: a volume that handed out
        // its split path keeps its layout fixed (no online reencryption).
        let Some(split) = uring.then(|| dev.split_io()).flatten() else {
            return Some(handle_request(&*dev, &iod, buf));
        };
        let step = if iod.op() == sys::IO_OP_FLUSH {
            Step::Sync
        } else {
            let (off, len) = match byte_range(&iod, buf.len()) {
                Ok(r) => r,
                Err(errno) => return Some(errno),
            };
            match iod.op() {
                sys::IO_OP_READ => match split.map(off, len as u64, false) {
                    Ok(_) => Step::Read,
                    Err(e) => return Some(-errno_of(&e)),
                },
                sys::IO_OP_WRITE => {
                    // The crypto, inline, in the request's own buffer: one call.
                    match split
                        .map(off, len as u64, true)
                        .and_then(|_| split.seal(off, &mut buf[..len]))
                    {
                        Ok(()) => Step::Write,
                        Err(e) => return Some(-errno_of(&e)),
                    }
                }
                _ => return Some(handle_request(&*dev, &iod, buf)),
            }
        };
        self.pending[tag as usize] = Pending { iod, done: 0 };
        self.submit_storage(tag, step);
        None
    }

    /// Queues the next storage operation of `tag`'s request.
    fn submit_storage(&mut self, tag: u16, step: Step) {
        let split = self
            .setup
            .dev
            .split_io()
            .expect("split I/O checked at start");
        let fd = types::Fd(split.fd());
        let p = self.pending[tag as usize];
        let sqe = if step == Step::Sync {
            // (A flush's start sector is meaningless: no range here.)
            opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build()
        } else {
            let len = p.iod.nr_sectors as usize * 512;
            let at = split
                .map(p.iod.start_sector * 512, len as u64, false)
                .expect("range checked at start")
                + p.done as u64;
            let ptr = (self.buf_addr(tag) + p.done as u64) as *mut u8;
            let rest = (len - p.done) as u32;
            if step == Step::Read {
                opcode::Read::new(fd, ptr, rest).offset(at).build()
            } else {
                opcode::Write::new(fd, ptr, rest).offset(at).build()
            }
        };
        let sqe = sqe.user_data(STORAGE | (step as u64) << 16 | tag as u64);
        // SAFETY: the buffer range named lies inside the tag's buffer, which stays mapped
        // until the ring is gone, and is not touched until this operation completes.
        // The ring has room: each tag has at most one operation in flight.
        unsafe { self.ring.submission().push(&sqe) }.expect("one entry per tag");
        self.storage_inflight += 1;
    }

    /// Cancels and reaps every storage operation in flight; returns once the kernel holds
    /// none of our buffers for storage I/O. Completions of ublk commands reaped on the way
    /// are dropped: the queue is going away.
    fn drain_storage(&mut self) {
        if self.storage_inflight == 0 {
            return;
        }
        let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(CANCEL);
        // SAFETY: a cancel request names no memory of ours. If the ring is full it is
        // skipped: the operations then simply run to their end, which we wait for.
        let _ = unsafe { self.ring.submission().push(&cancel) };
        let mut idle_waits = 0u32;
        while self.storage_inflight > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    // The wait itself fails: poll, never give up (the memory must stay).
                    idle_waits += 1;
                    std::thread::sleep(
                        std::time::Duration::from_millis(idle_waits.min(100) as u64),
                    );
                }
            }
            for cqe in self.ring.completion() {
                if cqe.user_data() & STORAGE != 0 && cqe.user_data() != CANCEL {
                    self.storage_inflight -= 1;
                }
            }
        }
    }

    /// A storage operation of `tag`'s request completed with `res`. Returns the request's
    /// result when it is done.
    fn storage_done(&mut self, tag: u16, step: Step, res: i32) -> Option<i32> {
        if res < 0 {
            return Some(res);
        }
        let p = &mut self.pending[tag as usize];
        let len = p.iod.nr_sectors as usize * 512;
        let fua = p.iod.flags() & sys::IO_F_FUA != 0;
        match step {
            Step::Read | Step::Write => {
                if res == 0 {
                    return Some(-libc::EIO); // the storage ended early
                }
                p.done += res as usize;
                if p.done < len {
                    self.submit_storage(tag, step); // short transfer: the rest
                    return None;
                }
                if step == Step::Write {
                    if fua {
                        self.submit_storage(tag, Step::Sync);
                        return None;
                    }
                    return Some(len as i32);
                }
                let off = p.iod.start_sector * 512;
                let dev = self.setup.dev.clone();
                let split = dev.split_io().expect("split I/O checked at start");
                let (_, buf) = self.tag(tag);
                // The crypto, inline, in the request's own buffer: one call.
                Some(match split.unseal(off, &mut buf[..len]) {
                    Ok(()) => len as i32,
                    Err(e) => -errno_of(&e),
                })
            }
            Step::Sync => {
                if p.iod.op() == sys::IO_OP_WRITE {
                    Some(len as i32) // the FUA write is durable now
                } else {
                    if let Some(s) = self.setup.dev.split_io() {
                        s.note_flush();
                    }
                    Some(0)
                }
            }
        }
    }

    fn commit(&mut self, tag: u16, r: i32) -> io::Result<()> {
        self.count(r);
        self.push(sys::U_IO_COMMIT_AND_FETCH_REQ, tag, r)
    }

    fn run(&mut self, ready: &Sender<io::Result<()>>) -> io::Result<()> {
        let depth = self.setup.depth;
        for tag in 0..depth {
            self.push(sys::U_IO_FETCH_REQ, tag, -1)?;
        }
        self.ring.submit()?;
        let _ = ready.send(Ok(()));
        let mut active = depth as usize;
        let mut done: Vec<(u64, i32)> = Vec::with_capacity(depth as usize);
        while active > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            done.clear();
            done.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            // Counted before any is handled: if handling one fails (or panics), the rest
            // are already reaped, and `drain_storage` must not wait for them.
            self.storage_inflight -= done
                .iter()
                .filter(|(ud, _)| ud & STORAGE != 0 && *ud != CANCEL)
                .count();
            for &(ud, res) in &done {
                let tag = ud as u16;
                if ud == CANCEL {
                    continue;
                }
                if ud & STORAGE != 0 {
                    let step = Step::from_bits(ud >> 16);
                    if let Some(r) = self.storage_done(tag, step, res) {
                        self.commit(tag, r)?;
                    }
                } else if res == sys::IO_RES_OK {
                    if let Some(r) = self.start(tag) {
                        self.commit(tag, r)?;
                    }
                } else {
                    // UBLK_IO_RES_ABORT (-ENODEV): the device is stopping (or the fetch failed);
                    // this tag gets no more requests.
                    active -= 1;
                }
            }
        }
        Ok(())
    }
}

/// `user_data` bit of storage operations (ublk commands carry just the tag).
const STORAGE: u64 = 1 << 63;
/// `user_data` of the cancel request sent when the queue goes away.
const CANCEL: u64 = u64::MAX;

/// The storage operation a request waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
enum Step {
    Read = 0,
    Write = 1,
    Sync = 2,
}

impl Step {
    fn from_bits(b: u64) -> Self {
        match b & 0xff {
            0 => Step::Read,
            1 => Step::Write,
            _ => Step::Sync,
        }
    }
}

/// A request whose storage I/O is in flight: its descriptor, and bytes moved so far.
#[derive(Clone, Copy, Default)]
struct Pending {
    iod: IoDesc,
    done: usize,
}

/// The body of a queue thread: set up, report readiness, serve until the kernel aborts.
pub(crate) fn queue_thread(setup: QueueSetup, ready: Sender<io::Result<()>>) -> io::Result<()> {
    if let Err(e) = pin(&setup.cpus) {
        eprintln!(
            "ublk queue {}: cannot pin to CPUs {:?}: {e}",
            setup.q_id, setup.cpus
        );
    }
    let mut q = match Queue::new(setup) {
        Ok(q) => q,
        Err(e) => {
            let _ = ready.send(Err(io::Error::new(e.kind(), e.to_string())));
            return Err(e);
        }
    };
    match q.run(&ready) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = ready.send(Err(io::Error::new(e.kind(), e.to_string())));
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    //! The storage engine of a queue (io_uring reads, writes and fdatasyncs, crypto inline)
    //! driven with fake descriptors: no ublk needed, only io_uring.
    use super::*;
    use cryptblk_crypto::{CipherSpec, IvOptions};
    use cryptblk_volume::{FileStorage, Volume, VolumeParams, volume_from_key};

    fn queue() -> (Queue, Arc<Volume>) {
        let f = tempfile::tempfile().unwrap();
        f.set_len(8 << 20).unwrap();
        let key: Vec<u8> = (0..64u8).collect();
        let params = VolumeParams {
            cipher: CipherSpec::parse("aes-xts-plain64").unwrap(),
            sector_size: 4096,
            iv: IvOptions {
                large_sectors: true,
                offset: 0,
            },
            data_offset: 4096,
            data_length: None,
            read_only: false,
            allow_discards: false,
        };
        let vol = Arc::new(
            volume_from_key(Box::new(FileStorage::new(f).unwrap()), &key, &params).unwrap(),
        );
        let setup = QueueSetup {
            q_id: 0,
            depth: 4,
            buf_size: 1 << 20,
            cdev: Arc::new(File::open("/dev/null").unwrap()),
            dev: vol.clone(),
            cpus: Vec::new(),
            counters: Arc::default(),
            uring_storage: true,
        };
        let iods = Mapping::new(
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
        .unwrap();
        (Queue::with_iods(setup, iods).unwrap(), vol)
    }

    /// Plays the kernel: puts `iod` (and write data) on `tag`, runs the request to its end.
    fn drive(q: &mut Queue, tag: u16, iod: IoDesc, data: Option<&[u8]>) -> i32 {
        // SAFETY: the test's descriptor area is a private read-write mapping of 4096 bytes,
        // room for 170 descriptors; tag < 4.
        unsafe { (q.iods.ptr as *mut IoDesc).add(tag as usize).write(iod) };
        if let Some(d) = data {
            q.tag(tag).1[..d.len()].copy_from_slice(d);
        }
        if let Some(r) = q.start(tag) {
            return r;
        }
        loop {
            q.ring.submit_and_wait(1).unwrap();
            let cqes: Vec<_> = q
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (ud, res) in cqes {
                assert!(
                    ud & STORAGE != 0 && ud as u16 == tag,
                    "only our storage I/O"
                );
                q.storage_inflight -= 1;
                if let Some(r) = q.storage_done(tag, Step::from_bits(ud >> 16), res) {
                    return r;
                }
            }
        }
    }

    fn iod(op: u8, flags: u32, start_sector: u64, bytes: usize) -> IoDesc {
        IoDesc {
            op_flags: op as u32 | flags,
            nr_sectors: (bytes / 512) as u32,
            start_sector,
            addr: 0,
        }
    }

    #[test]
    fn uring_storage_reads_writes_and_flushes_with_one_crypto_call_each() {
        let (mut q, vol) = queue();
        let calls = || vol.stats().crypto_calls.load(Relaxed);
        let plain: Vec<u8> = (0..(256u32 << 10)).map(|i| (i % 251) as u8).collect();

        let c = calls();
        let w = iod(sys::IO_OP_WRITE, sys::IO_F_FUA, 64, plain.len());
        assert_eq!(drive(&mut q, 1, w, Some(&plain)), plain.len() as i32);
        assert_eq!(calls(), c + 1, "one cipher call for a 64-sector write");
        let mut back = vec![0u8; plain.len()];
        vol.read_at(&mut back, 64 * 512).unwrap();
        assert_eq!(back, plain, "the inline path reads what the ring wrote");

        q.tag(2).1.fill(0);
        let c = calls();
        let r = iod(sys::IO_OP_READ, 0, 64, plain.len());
        assert_eq!(drive(&mut q, 2, r, None), plain.len() as i32);
        assert_eq!(calls(), c + 1, "one cipher call for a 64-sector read");
        assert_eq!(
            &q.tag(2).1[..plain.len()],
            &plain[..],
            "decrypted in the tag's buffer"
        );

        // A flush's start sector is garbage; it must not matter.
        let f = vol.stats().flushes.load(Relaxed);
        assert_eq!(
            drive(&mut q, 3, iod(sys::IO_OP_FLUSH, 0, u64::MAX, 0), None),
            0
        );
        assert_eq!(vol.stats().flushes.load(Relaxed), f + 1);

        // Errors come back as negative errnos, not panics.
        let end = vol.size() / 512;
        assert_eq!(
            drive(&mut q, 0, iod(sys::IO_OP_READ, 0, end, 4096), None),
            -libc::EINVAL
        );
        assert_eq!(
            drive(&mut q, 0, iod(sys::IO_OP_WRITE, 0, u64::MAX, 4096), None),
            -libc::EINVAL
        );
        assert_eq!(
            drive(&mut q, 0, iod(sys::IO_OP_READ, 0, 0, 2 << 20), None),
            -libc::EINVAL
        );
    }

    /// A queue that goes away (its thread's error path included) first waits for the
    /// storage I/O still in flight on its buffers.
    #[test]
    fn dropping_a_queue_waits_for_its_storage_io() {
        let (mut q, _vol) = queue();
        let read = iod(sys::IO_OP_READ, 0, 0, 256 << 10);
        // SAFETY: the test's descriptor area is a private read-write mapping of 4096
        // bytes, room for 170 descriptors; tag 1 < 4.
        unsafe { (q.iods.ptr as *mut IoDesc).add(1).write(read) };
        assert_eq!(q.start(1), None, "the read went to the ring");
        assert_eq!(q.storage_inflight, 1);
        q.drain_storage();
        assert_eq!(q.storage_inflight, 0, "drained");
        assert!(q.ring.completion().is_empty(), "every completion reaped");
        // Nothing in flight: draining again returns at once, and so does the drop.
        q.drain_storage();
        drop(q);
    }
}
