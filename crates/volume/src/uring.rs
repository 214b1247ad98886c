//! Synchronous I/O through a per-thread io_uring: the calling thread submits one read or
//! write and waits for its completion. Kept as an engine to measure against pread/pwrite.

#![allow(unsafe_code)]

use io_uring::{IoUring, opcode, types};
use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
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

/// One operation: `make(offset, done)` builds the entry for the part not yet done; short
/// transfers are resumed.
fn run(len: usize, mut make: impl FnMut(usize) -> io_uring::squeue::Entry) -> io::Result<()> {
    RING.with(|r| {
        let mut r = r.borrow_mut();
        if r.is_none() {
            *r = Some(IoUring::new(4)?);
        }
        let ring = r.as_mut().expect("set above");
        let mut done = 0usize;
        while done < len {
            let sqe = make(done);
            // SAFETY: the entry points into a buffer the caller borrows for this whole call,
            // and we wait for its completion below before returning or building the next
            // entry, so the kernel never touches the buffer after it is released.
            unsafe { ring.submission().push(&sqe) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
            ring.submit_and_wait(1)?;
            let cqe = ring
                .completion()
                .next()
                .ok_or_else(|| io::Error::other("io_uring: no completion"))?;
            match cqe.result() {
                n if n < 0 => {
                    let e = io::Error::from_raw_os_error(-n);
                    if e.kind() != io::ErrorKind::Interrupted {
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

pub(crate) fn read_exact_at(f: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let fd = types::Fd(f.as_raw_fd());
    let (ptr, len) = (buf.as_mut_ptr(), buf.len());
    run(len, |done| {
        // The pointer arithmetic stays inside `buf` (done < len).
        opcode::Read::new(fd, ptr.wrapping_add(done), (len - done) as u32)
            .offset(offset + done as u64)
            .build()
    })
}

pub(crate) fn write_all_at(f: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    let fd = types::Fd(f.as_raw_fd());
    let (ptr, len) = (buf.as_ptr(), buf.len());
    run(len, |done| {
        opcode::Write::new(fd, ptr.wrapping_add(done), (len - done) as u32)
            .offset(offset + done as u64)
            .build()
    })
}
