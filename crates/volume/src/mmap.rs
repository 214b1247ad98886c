//! The mmap engine: reads and writes copy straight between the caller's buffer and the
//! page cache through a shared mapping of the whole file, with no system call and no
//! per-page lookup in the kernel. On memory-backed storage (tmpfs) that is the whole cost
//! of an I/O besides the cipher: `pread` of 128 KiB took about a quarter of the server's
//! time per request there (docs/benchmarks.md).
//!
//! A mapping fails differently from `pread`: an access the kernel cannot back (the file
//! was truncated under us, tmpfs is full, a disk read failed) raises SIGBUS instead of
//! returning an error. The handler installed here turns that into an error the caller
//! sees: when the faulting address is in the range the faulting thread is copying, the
//! page is replaced by an anonymous one, the copy finishes harmlessly, and the request is
//! done again with `pread`/`pwrite`, which report the real error (or succeed if the cause
//! went away). The file's pages are then mapped back. Any other SIGBUS goes on to the
//! handler that was there before (Rust's stack-overflow reporter) or kills the process
//! as it would have.
//!
//! While an anonymous page stands in for a file page, another thread may copy through it
//! without faulting; every copy therefore notes the fault counters before and after and is
//! done again with `pread`/`pwrite` if any fault happened or was outstanding meanwhile.
//!
//! A file shrunk to a size that is not a multiple of the page size keeps the page that
//! holds its new end mapped: bytes past the end there raise no SIGBUS, and what is
//! written to them is not in the file (gone at the next reopen). So a regular file's
//! range counts as in the file only when the page after it is in the page cache (only
//! pages inside the file are: truncation drops the others) or, failing that, when the
//! file's size says so; a write to a range the file no longer covers is done again with
//! `pwrite` (which extends the file, as the psync engine does) and a read with `pread`
//! (which reports the end of the file), so nothing past the end is acknowledged or read.
//! A write's check costs one load from the file's last page (`FileMap::in_file`), not a
//! system call, except in that page.

#![allow(unsafe_code)]

use std::cell::Cell;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst, compiler_fence, fence,
};

/// Faults turned into errors so far (any mapping, any thread).
static EPOCH: AtomicU64 = AtomicU64::new(0);
/// Anonymous pages standing in for file pages right now.
static OUTSTANDING: AtomicUsize = AtomicUsize::new(0);
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static INSTALL: OnceLock<Result<(), i32>> = OnceLock::new();
/// The SIGBUS action before ours, written once before ours is installed.
static mut PREVIOUS: Option<libc::sigaction> = None;

thread_local! {
    /// The address range this thread is copying to or from a mapping (0, 0: none).
    /// Const-initialised and without a destructor, so the handler may read it.
    static GUARD: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
    /// Pages this thread's handler replaced during the current copy.
    static FAULTS: Cell<usize> = const { Cell::new(0) };
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    let (base, len) = GUARD.with(Cell::get);
    // Only a fault the kernel raised (si_code > 0: BUS_ADRERR, BUS_OBJERR...): a SIGBUS
    // sent by a process (kill, sigqueue: si_code <= 0) names whatever address it likes
    // and is not a fault of ours.
    if code > 0 && len != 0 && addr >= base && addr - base < len {
        let page = PAGE.load(SeqCst);
        // OUTSTANDING first: a copy that starts after EPOCH moved must see it raised.
        OUTSTANDING.fetch_add(1, SeqCst);
        EPOCH.fetch_add(1, SeqCst);
        // SAFETY: replaces one page of our own mapping, which this thread is copying
        // through; mmap is a plain system call, safe in a signal handler.
        let r = unsafe {
            libc::mmap(
                (addr & !(page - 1)) as *mut libc::c_void,
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if r != libc::MAP_FAILED {
            FAULTS.with(|f| f.set(f.get() + 1));
            return;
        }
        OUTSTANDING.fetch_sub(1, SeqCst);
    }
    // Not ours: what would have happened without us. A fault goes to the handler that was
    // there (Rust's stack-overflow reporter); a signal a process sent gets the default
    // action, as `kill -BUS` gets from a process with no handler (Rust's handler would
    // only uninstall itself, and ours with it, and let the process go on).
    // SAFETY: PREVIOUS was written before this handler was installed and never after.
    let prev = unsafe { (*std::ptr::addr_of!(PREVIOUS)).as_ref().copied() };
    match prev {
        Some(p)
            if code > 0 && p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN =>
        {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: an SA_SIGINFO handler has this signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a plain handler has this signature.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // The default action (terminate, core): reset it and raise the signal again;
            // it is delivered as soon as this handler returns.
            // SAFETY: sigaction and raise are async-signal-safe.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
                libc::raise(libc::SIGBUS);
            }
        }
    }
}

fn install_handler() -> io::Result<()> {
    // The outcome is kept: a failed install fails every mapping, not only the first.
    let r = INSTALL.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, SeqCst);
        }
        let errno = || {
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL)
        };
        // SAFETY: sigaction with valid pointers; PREVIOUS is written here, once, before
        // the handler that reads it exists.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return Err(errno());
            }
            *std::ptr::addr_of_mut!(PREVIOUS) = Some(old);
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigbus as *const () as usize;
            // On the alternate stack where the thread has one (Rust gives its threads one
            // to report stack overflows, which arrive as SIGBUS or SIGSEGV).
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut act.sa_mask);
            if libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) != 0 {
                return Err(errno());
            }
        }
        Ok(())
    });
    r.map_err(io::Error::from_raw_os_error)
}

/// A shared mapping of a whole file or block device.
pub(crate) struct FileMap {
    base: usize,
    /// Bytes of the file mapped (its size then).
    len: usize,
    /// Bytes of address space mapped: `len` rounded up to pages, and one page more, so
    /// that the page after any range of the file is in the mapping (past the end of the
    /// file it is never touched, only looked up).
    map_len: usize,
    /// A regular file, whose size may change under us (block devices: checked by
    /// SIGBUS alone).
    regular: bool,
    writable: bool,
    fd: libc::c_int,
    /// Set when a page could not be mapped back after a fault: from then on every I/O
    /// goes through `pread`/`pwrite`.
    broken: AtomicBool,
}

// SAFETY: the mapping is plain shared memory; every access goes through `copy_in`,
// `copy_out`, `lend` or `lend_mut`, which any thread may call.
unsafe impl Send for FileMap {}
// SAFETY: as above.
unsafe impl Sync for FileMap {}

impl FileMap {
    /// Maps `len` bytes of `file` (read-write when `writable`). The file must stay open
    /// as long as the map lives (the map does not own it).
    pub(crate) fn new(file: &File, len: u64, writable: bool) -> io::Result<FileMap> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an empty file cannot be mapped",
            ));
        }
        let len = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too large to map"))?;
        install_handler()?;
        let page = PAGE.load(SeqCst);
        let map_len = len
            .checked_next_multiple_of(page)
            .and_then(|l| l.checked_add(page))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "file too large to map"))?;
        let regular = file.metadata()?.file_type().is_file();
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a new mapping at an address the kernel picks; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(FileMap {
            base: base as usize,
            len,
            map_len,
            regular,
            writable,
            fd: file.as_raw_fd(),
            broken: AtomicBool::new(false),
        })
    }

    fn covers(&self, len: usize, offset: u64) -> bool {
        !self.broken.load(SeqCst)
            && usize::try_from(offset).is_ok_and(|o| o <= self.len && len <= self.len - o)
    }

    /// Copies `buf.len()` bytes at `offset` out of the mapping. False when it could not
    /// be done cleanly (outside the mapping, a fault): then read with `pread` instead.
    pub(crate) fn copy_out(&self, buf: &mut [u8], offset: u64) -> bool {
        if !self.covers(buf.len(), offset) {
            return false;
        }
        let at = self.base + offset as usize;
        self.guarded(at, buf.len(), || {
            // SAFETY: `at..at + len` is inside our mapping (checked above); a page the
            // kernel cannot back is replaced by the SIGBUS handler, so the copy completes.
            let src = unsafe { std::slice::from_raw_parts(at as *const u8, buf.len()) };
            buf.copy_from_slice(src);
        })
    }

    /// Runs `f` on the mapped bytes at `offset..offset + len`: `None` outside the mapping;
    /// else whether `f` saw the file's bytes (false: a fault on the way, `f`'s result is
    /// worthless; read with `pread` instead).
    pub(crate) fn lend(&self, len: usize, offset: u64, f: &mut dyn FnMut(&[u8])) -> Option<bool> {
        if !self.covers(len, offset) {
            return None;
        }
        let at = self.base + offset as usize;
        Some(self.guarded(at, len, || {
            // SAFETY: as in `copy_out`: inside our mapping, faults replaced by the handler.
            // The slice lives only during `f`, while the mapping does.
            let src = unsafe { std::slice::from_raw_parts(at as *const u8, len) };
            f(src)
        }))
    }

    /// Lets `f` write the mapped bytes at `offset..offset + len`: `None` outside the
    /// mapping or when it is read-only; else whether what `f` wrote reached the file
    /// (false: a fault on the way; write with `pwrite` instead).
    pub(crate) fn lend_mut(
        &self,
        len: usize,
        offset: u64,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> Option<bool> {
        if !self.writable || !self.covers(len, offset) {
            return None;
        }
        let at = self.base + offset as usize;
        let clean = self.guarded(at, len, || {
            // SAFETY: as in `copy_in`; the slice lives only during `f`. Other threads may
            // write the same bytes at once (overlapping client writes), as with pwrite: the
            // result is one of them or a mix, never memory unsafety for us (we only write).
            let dst = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, len) };
            f(dst)
        });
        Some(clean && self.in_file(len, offset))
    }

    /// Copies `buf` into the mapping at `offset`. False when it could not be done cleanly:
    /// then write with `pwrite` instead (which also reports the real error, e.g. ENOSPC).
    pub(crate) fn copy_in(&self, buf: &[u8], offset: u64) -> bool {
        if !self.writable || !self.covers(buf.len(), offset) {
            return false;
        }
        let at = self.base + offset as usize;
        self.guarded(at, buf.len(), || {
            // SAFETY: as in `copy_out`; the mapping is writable.
            let dst = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, buf.len()) };
            dst.copy_from_slice(buf);
        }) && self.in_file(buf.len(), offset)
    }

    /// Whether the file still covers `[offset, offset + len)` now (after a write through
    /// the mapping: else what was written is not in the file). Block devices: true (a
    /// fault is their only sign).
    ///
    /// Without a system call for a range before the file's last page (at mapping time):
    /// one load from that page, the canary. A file shrunk to end anywhere before the
    /// canary page has had the canary unmapped, and the load faults (caught); one that
    /// still reaches into the canary page covers every page before it. A range in the
    /// last page itself, or a canary that faults, is checked precisely: the page after
    /// the range in the page cache (pages past the end are dropped by a truncation), or
    /// else the file's size.
    fn in_file(&self, len: usize, offset: u64) -> bool {
        if !self.regular {
            return true;
        }
        let page = PAGE.load(SeqCst);
        let end = offset as usize + len;
        let canary = (self.len - 1) & !(page - 1);
        if end <= canary {
            let at = self.base + canary;
            let alive = self.guarded(at, 1, || {
                // SAFETY: a byte inside our mapping (below `len`); a fault there is turned
                // into a replaced page by the SIGBUS handler and reported by `guarded`.
                let _ = unsafe { std::ptr::read_volatile(at as *const u8) };
            });
            if alive {
                return true;
            }
        }
        let next = end.next_multiple_of(page);
        if next + page <= self.map_len && self.pages_resident(next, page) {
            return true;
        }
        // SAFETY: fstat on our own descriptor into a zeroed stat buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let r = unsafe { libc::fstat(self.fd, &mut st) };
        r == 0 && st.st_size as u64 >= end as u64
    }

    /// Whether every page of `[rel, rel + len)` of the mapping (offsets from its start,
    /// inside `map_len`) is in memory (`mincore`).
    fn pages_resident(&self, rel: usize, len: usize) -> bool {
        let page = PAGE.load(SeqCst);
        let at = self.base + rel;
        let start = at & !(page - 1);
        let pages = (at + len - start).div_ceil(page);
        let mut small = [0u8; 64];
        let mut big = Vec::new();
        let vec: &mut [u8] = if pages <= small.len() {
            &mut small[..pages]
        } else {
            big.resize(pages, 0);
            &mut big
        };
        // SAFETY: the range is inside our mapping (`map_len`); `vec` has one byte per page.
        let r =
            unsafe { libc::mincore(start as *mut libc::c_void, pages * page, vec.as_mut_ptr()) };
        r == 0 && vec.iter().all(|v| v & 1 != 0)
    }

    /// True when every page of `[offset, offset + len)` is in memory (`mincore`), and for
    /// a regular file the page after it too. On tmpfs a page that is not is a hole (or
    /// swapped out): a read fault there would allocate a page where `pread` returns zeros
    /// for free, and a sparse image would fill up as it is read; such reads go through
    /// `pread`. The page after the range proves the file still extends past it (see the
    /// module docs: a shrunk file's last page maps bytes that are not in the file); where
    /// it is not in memory, `pread` reads. Costs one system call that only looks pages up
    /// (`SEEK_HOLE` scans on to the next hole, to the end of a full file).
    pub(crate) fn resident(&self, len: usize, offset: u64) -> bool {
        if !self.covers(len, offset) || len == 0 {
            return len == 0;
        }
        let page = PAGE.load(SeqCst);
        let end = offset as usize + len;
        let span = if self.regular {
            end.next_multiple_of(page) + page - offset as usize
        } else {
            len
        };
        self.pages_resident(offset as usize, span)
    }

    /// Runs `copy` on `[at, at + len)` with the SIGBUS guard up; true when no fault
    /// happened and no anonymous page stood in anywhere meanwhile.
    fn guarded(&self, at: usize, len: usize, copy: impl FnOnce()) -> bool {
        /// Lowers the guard however `copy` ends.
        struct Lower;
        impl Drop for Lower {
            fn drop(&mut self) {
                compiler_fence(SeqCst);
                GUARD.with(|g| g.set((0, 0)));
            }
        }
        let epoch = EPOCH.load(SeqCst);
        let outstanding = OUTSTANDING.load(SeqCst);
        GUARD.with(|g| g.set((at, len)));
        compiler_fence(SeqCst);
        {
            let _lower = Lower;
            copy();
        }
        fence(SeqCst);
        let faults = FAULTS.with(|f| f.replace(0));
        // A page that cannot be mapped back stays counted as outstanding: every later copy
        // (which `broken` stops anyway) is then redone with pread/pwrite.
        if faults > 0 && self.map_back(at, len) {
            OUTSTANDING.fetch_sub(faults, SeqCst);
        }
        faults == 0 && outstanding == 0 && EPOCH.load(SeqCst) == epoch && !self.broken.load(SeqCst)
    }

    /// Maps the file's pages back over `[at, at + len)` after the handler replaced some;
    /// false (and the map marked broken) when that failed.
    fn map_back(&self, at: usize, len: usize) -> bool {
        let page = PAGE.load(SeqCst);
        let start = at & !(page - 1);
        let end = (at + len).div_ceil(page) * page;
        let prot = if self.writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: replaces pages inside our own mapping with the file's pages at the same
        // offsets, as they were mapped at first.
        let r = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                end - start,
                prot,
                libc::MAP_SHARED | libc::MAP_FIXED,
                self.fd,
                (start - self.base) as libc::off_t,
            )
        };
        if r == libc::MAP_FAILED {
            self.broken.store(true, SeqCst);
            return false;
        }
        true
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used (we are being dropped).
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.map_len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
    use std::sync::Mutex;

    /// Held by the tests that fault in this process and by those that assert a clean
    /// copy: a fault on any thread moves the global epoch, and every copy running
    /// meanwhile rightly reports itself unclean (its caller would redo it with pread).
    static FAULTING: Mutex<()> = Mutex::new(());

    fn tmp(len: u64) -> (tempfile::NamedTempFile, File) {
        let t = tempfile::NamedTempFile::new().unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(t.path())
            .unwrap();
        f.set_len(len).unwrap();
        (t, f)
    }

    #[test]
    fn a_truncated_file_is_an_error_then_reads_again_once_restored() {
        let _serial = FAULTING.lock().unwrap_or_else(|e| e.into_inner());
        let (_t, f) = tmp(1 << 20);
        f.write_all_at(&[7u8; 1 << 20], 0).unwrap();
        let m = FileMap::new(&f, 1 << 20, true).unwrap();
        let mut buf = vec![0u8; 64 << 10];
        assert!(m.copy_out(&mut buf, 0));
        assert!(buf.iter().all(|&b| b == 7));
        f.set_len(0).unwrap();
        // Past the end now: the fault is caught and the copy reported unclean.
        assert!(!m.copy_out(&mut buf, 512 << 10));
        let mut seen = 0;
        let sum = &mut |b: &[u8]| seen = b.iter().map(|&x| x as usize).sum::<usize>() + b.len();
        assert_eq!(m.lend(8192, 512 << 10, sum), Some(false));
        assert_eq!(seen, 8192, "the faulting pages read as zeros");
        assert_eq!(m.lend(8192, 1 << 20, &mut |_| {}), None, "outside");
        assert!(!m.copy_in(&buf, 512 << 10));
        f.set_len(1 << 20).unwrap();
        // The file's pages are mapped again: it reads as the file now is (zeros).
        assert!(m.copy_out(&mut buf, 512 << 10));
        assert!(buf.iter().all(|&b| b == 0));
        let mut sum = 1u64;
        assert_eq!(
            m.lend(4096, 0, &mut |b| sum = b.iter().map(|&x| x as u64).sum()),
            Some(true)
        );
        assert_eq!(sum, 0, "the truncation zeroed the start too");
        assert!(m.copy_in(&[5u8; 4096], 4096));
        let mut back = [0u8; 4096];
        f.read_exact_at(&mut back, 4096).unwrap();
        assert_eq!(back, [5u8; 4096]);
        assert_eq!(m.lend_mut(4096, 8192, &mut |d| d.fill(6)), Some(true));
        f.read_exact_at(&mut back, 8192).unwrap();
        assert_eq!(back, [6u8; 4096]);
        f.set_len(4096).unwrap();
        assert_eq!(m.lend_mut(4096, 8192, &mut |d| d.fill(6)), Some(false));
        assert_eq!(m.lend_mut(4096, 1 << 20, &mut |_| {}), None, "outside");
    }

    #[test]
    fn outside_the_mapping_is_refused() {
        let _serial = FAULTING.lock().unwrap_or_else(|e| e.into_inner());
        let (_t, f) = tmp(8192);
        let m = FileMap::new(&f, 8192, false).unwrap();
        let mut b = [0u8; 4096];
        assert!(!m.copy_out(&mut b, 8192 - 100));
        assert!(!m.copy_out(&mut b, u64::MAX - 10));
        assert!(!m.copy_in(&b, 0), "read-only mapping");
        assert!(m.copy_out(&mut b, 4096));
    }

    /// Run only as the child of `a_fault_outside_any_copy_still_kills_the_process`.
    #[test]
    fn sigbus_child() {
        if std::env::var_os("CRYPTBLK_SIGBUS_CHILD").is_none() {
            return;
        }
        let (_t, f) = tmp(1 << 20);
        let m = FileMap::new(&f, 1 << 20, false).unwrap();
        f.set_len(0).unwrap();
        // SAFETY: deliberately touches a page past the end of the file, outside any copy.
        let v = unsafe { std::ptr::read_volatile((m.base + 8192) as *const u8) };
        println!("survived a fault outside any copy: {v}");
    }

    /// Run only as the child of `a_sigbus_sent_by_a_process_is_not_taken_for_a_fault`.
    #[test]
    fn queued_sigbus_child() {
        if std::env::var_os("CRYPTBLK_QUEUED_SIGBUS_CHILD").is_none() {
            return;
        }
        let (_t, f) = tmp(1 << 20);
        let m = FileMap::new(&f, 1 << 20, false).unwrap();
        let ok = m.lend(4096, 0, &mut |src| {
            // A SIGBUS queued as a process would (SI_QUEUE) naming the very page being
            // copied: siginfo's fields by their x86-64/aarch64 Linux offsets (signo,
            // errno, code, padding, then the address).
            let mut info = [0u64; 16];
            info[0] = libc::SIGBUS as u32 as u64;
            info[1] = (libc::SI_QUEUE as u32) as u64;
            info[2] = src.as_ptr() as u64;
            // SAFETY: sends this thread a signal with a fully initialised siginfo buffer
            // of the kernel's size (128 bytes).
            unsafe {
                libc::syscall(
                    libc::SYS_rt_tgsigqueueinfo,
                    libc::getpid(),
                    libc::gettid(),
                    libc::SIGBUS,
                    info.as_mut_ptr(),
                );
            }
        });
        println!("survived a queued SIGBUS (taken for a fault: {ok:?})");
    }

    /// A SIGBUS a process queues (si_code SI_QUEUE) naming an address being copied is not
    /// a fault: it is not turned into a pread retry, it gets SIGBUS's default action.
    #[test]
    fn a_sigbus_sent_by_a_process_is_not_taken_for_a_fault() {
        assert_child_dies_of_sigbus("queued_sigbus_child", "CRYPTBLK_QUEUED_SIGBUS_CHILD");
    }

    #[test]
    fn a_fault_outside_any_copy_still_kills_the_process() {
        assert_child_dies_of_sigbus("sigbus_child", "CRYPTBLK_SIGBUS_CHILD");
    }

    /// Runs the test `child` of this module in a child process (`env` set tells it to
    /// act) and asserts that SIGBUS killed it.
    fn assert_child_dies_of_sigbus(child: &str, env: &str) {
        use std::os::unix::process::ExitStatusExt;
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &format!("mmap::tests::{child}"), "--nocapture"])
            .env(env, "1")
            .output()
            .unwrap();
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGBUS),
            "{:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
    }

    #[test]
    fn holes_are_not_resident() {
        let (_t, f) = tmp(1 << 20);
        f.write_all_at(&[1u8; 8192], 0).unwrap();
        let m = FileMap::new(&f, 1 << 20, false).unwrap();
        // A range is resident with the page after it (which proves the file goes on).
        assert!(m.resident(4096, 0));
        assert!(m.resident(100, 1000));
        assert!(!m.resident(8192, 0), "the page after it is a hole");
        assert!(!m.resident(100, 5000), "the page after it is a hole");
        assert!(!m.resident(4096, 512 << 10));
        assert!(!m.resident(4096, 1 << 20), "outside");
    }
}
