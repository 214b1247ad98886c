//! Synchronous I/O through a per-thread io_uring: the calling thread submits one read or
//! write and waits for its completion. Kept as an engine to measure against pread/pwrite.
//!
//! The one rule that makes this safe: **no call returns while an operation it submitted
//! is still in the kernel's hands.** A wait interrupted by a signal (or a debugger) is
//! retried, never turned into an error while the kernel may still write into the caller's
//! buffer; every operation carries a fresh `user_data`, and completions are matched by it,
//! so a completion can never be taken for another request's.

#![allow(unsafe_code)]

use io_uring::{IoUring, opcode, squeue, types};
use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// A thread's ring and the `user_data` its next operation gets.
struct Ring {
    ring: IoUring,
    next_id: u64,
}

thread_local! {
    static RING: RefCell<Option<Ring>> = const { RefCell::new(None) };
}

/// Checks that io_uring can be set up here (kernel support, not disabled by sysctl or a
/// seccomp filter), with an error that says so.
pub(crate) fn probe() -> io::Result<()> {
    IoUring::new(2).map(drop).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("io_uring is not available: {e} (see kernel.io_uring_disabled)"),
        )
    })
}

impl Ring {
    /// Submits `sqe` and waits for its own completion; returns the kernel's result.
    ///
    /// # Safety
    /// Any buffer `sqe` names must stay valid until this returns (it returns only once the
    /// kernel is done with the operation, or never saw it).
    unsafe fn complete(&mut self, sqe: squeue::Entry) -> io::Result<i32> {
        self.next_id = self.next_id.wrapping_add(1);
        let id = self.next_id;
        // SAFETY: the caller keeps the buffers valid until we return, and we return only
        // after this entry's completion (below), or with the entry never consumed.
        unsafe { self.ring.submission().push(&sqe.user_data(id)) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                // A signal or ptrace stop: the entry may already be in flight. Wait again.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // The completion queue is full: reaping (below) makes room.
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) => {}
                Err(e) => {
                    if !self.ring.submission().is_empty() {
                        // The kernel never took the entry: nothing is in flight, and the
                        // ring (with the entry still queued) is thrown away by our caller.
                        return Err(PoisonedRing(e).into());
                    }
                    // Taken but the wait failed: the operation is in flight; keep waiting
                    // for it, without spinning hot.
                    std::thread::yield_now();
                }
            }
            let mut found = None;
            for cqe in self.ring.completion() {
                // Anything else is a stray completion (none can exist: every earlier call
                // waited for its own): never mistake it for ours.
                if cqe.user_data() == id {
                    found = Some(cqe.result());
                }
            }
            if let Some(r) = found {
                return Ok(r);
            }
        }
    }
}

/// An error after which the thread's ring must not be used again.
#[derive(Debug)]
struct PoisonedRing(io::Error);

impl std::fmt::Display for PoisonedRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "io_uring submit failed: {}", self.0)
    }
}
impl std::error::Error for PoisonedRing {}
impl From<PoisonedRing> for io::Error {
    fn from(p: PoisonedRing) -> io::Error {
        io::Error::new(p.0.kind(), p)
    }
}

/// One operation: `make(done)` builds the entry for the part not yet done; short
/// transfers are resumed, interrupted ones retried.
///
/// # Safety
/// Every entry `make` returns must name only memory borrowed for this whole call.
unsafe fn run(len: usize, mut make: impl FnMut(usize) -> squeue::Entry) -> io::Result<()> {
    RING.with(|r| {
        let mut r = r.borrow_mut();
        if r.is_none() {
            *r = Some(Ring {
                ring: IoUring::new(4)?,
                next_id: 0,
            });
        }
        let ring = r.as_mut().expect("set above");
        let (mut done, mut canceled) = (0usize, 0u32);
        while done < len {
            // SAFETY: forwarded from our caller: the entry's memory outlives this call.
            let res = match unsafe { ring.complete(make(done)) } {
                Ok(res) => res,
                Err(e) => {
                    if e.get_ref().is_some_and(|i| i.is::<PoisonedRing>()) {
                        *r = None; // a fresh ring next time
                    }
                    return Err(e);
                }
            };
            match res {
                // The kernel gave the operation up before doing it: a signal reached the
                // thread while the request waited for an io-wq worker (seen with O_DIRECT
                // writes on Linux 6.18). It is complete and nothing holds the buffer, so it
                // is simply issued again, a bounded number of times in a row.
                n if n == -rustix::io::Errno::CANCELED.raw_os_error()
                    && canceled < MAX_CANCELED =>
                {
                    canceled += 1;
                }
                n if n < 0 => {
                    let e = io::Error::from_raw_os_error(-n);
                    if !matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                    ) {
                        return Err(e);
                    }
                }
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => done += n as usize,
            }
        }
        Ok(())
    })
}

/// Cancellations of one operation in a row that are retried before the error is returned.
const MAX_CANCELED: u32 = 1000;

/// One operation's length: at most what the SQE's 32-bit field holds (the rest follows as
/// a short transfer would).
fn op_len(rest: usize) -> u32 {
    u32::try_from(rest).unwrap_or(!4095)
}

pub(crate) fn read_exact_at(f: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let fd = types::Fd(f.as_raw_fd());
    let (ptr, len) = (buf.as_mut_ptr(), buf.len());
    // SAFETY: the entries point into `buf`, borrowed mutably for this whole call.
    unsafe {
        run(len, |done| {
            // The pointer arithmetic stays inside `buf` (done < len).
            opcode::Read::new(fd, ptr.wrapping_add(done), op_len(len - done))
                .offset(offset + done as u64)
                .build()
        })
    }
}

pub(crate) fn write_all_at(f: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    let fd = types::Fd(f.as_raw_fd());
    let (ptr, len) = (buf.as_ptr(), buf.len());
    // SAFETY: the entries point into `buf`, borrowed for this whole call.
    unsafe {
        run(len, |done| {
            opcode::Write::new(fd, ptr.wrapping_add(done), op_len(len - done))
                .offset(offset + done as u64)
                .build()
        })
    }
}
