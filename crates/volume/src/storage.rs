//! Where ciphertext lives: a file or block device (memory storage is
//! `cryptblk_device::MemStorage`).

pub use cryptblk_device::Storage;

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// How a [`FileStorage`] reaches the kernel. Both run on the calling (frontend) thread:
/// the request that needs the data waits for it, nothing is handed to another thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoEngine {
    /// `pread`/`pwrite`: one system call per request. The default: measured fastest for
    /// one request at a time per thread (docs/benchmarks.md).
    #[default]
    Psync,
    /// A per-thread io_uring, one submission and completion per request.
    Uring,
}

impl std::str::FromStr for IoEngine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "psync" | "pread" => Ok(IoEngine::Psync),
            "uring" | "io_uring" | "io-uring" => Ok(IoEngine::Uring),
            _ => Err(format!("unknown I/O engine '{s}' (psync or io_uring)")),
        }
    }
}

/// A regular file or block device.
pub struct FileStorage {
    file: File,
    /// Measured at open and by [`Storage::refresh_size`] (`resize`).
    size: std::sync::atomic::AtomicU64,
    engine: IoEngine,
    /// With O_DIRECT: the memory alignment the kernel wants for buffers.
    direct_mem_align: Option<usize>,
}

impl FileStorage {
    /// Wraps an open file or block device, using pread/pwrite through the page cache.
    /// The size is read once, here, by seeking to the end; errors are that seek's.
    pub fn new(file: File) -> io::Result<Self> {
        use std::io::Seek;
        let mut f = file;
        // Block devices report 0 in metadata; seeking to the end works for both.
        let size = f.seek(io::SeekFrom::End(0))?;
        Ok(FileStorage {
            file: f,
            size: size.into(),
            engine: IoEngine::Psync,
            direct_mem_align: None,
        })
    }

    /// Chooses the I/O engine.
    pub fn with_engine(mut self, engine: IoEngine) -> io::Result<Self> {
        if engine == IoEngine::Uring {
            crate::uring::probe()?;
        }
        self.engine = engine;
        Ok(self)
    }

    /// Bypasses the page cache (O_DIRECT) when the file system or device allows it for
    /// I/O of `sector_size` blocks; errors say why not. Buffers that are not aligned as
    /// the kernel wants are bounced through an aligned per-thread buffer.
    pub fn direct(mut self, sector_size: u32) -> io::Result<Self> {
        use rustix::fs::{AtFlags, OFlags, StatxFlags, fcntl_getfl, fcntl_setfl, statx};
        let st = statx(&self.file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN)
            .map_err(io::Error::from)?;
        let (mem, off) = (st.stx_dio_mem_align, st.stx_dio_offset_align);
        let reported = StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::DIOALIGN);
        if reported && off == 0 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this file system does not support O_DIRECT",
            ));
        }
        if off > sector_size {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "O_DIRECT needs {off}-byte aligned I/O here, the volume's sectors are {sector_size} bytes"
                ),
            ));
        }
        let flags = fcntl_getfl(&self.file).map_err(io::Error::from)?;
        fcntl_setfl(&self.file, flags | OFlags::DIRECT).map_err(io::Error::from)?;
        // The kernel's own figure when it gives one (often 4 bytes on NVMe, so frontend
        // buffers need no bounce); 512, the historical rule, when it does not.
        let mem = if reported && mem > 0 { mem } else { 512 };
        self.direct_mem_align = Some(mem as usize);
        Ok(self)
    }

    /// The underlying file or block device.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The I/O engine in use.
    pub fn engine(&self) -> IoEngine {
        self.engine
    }

    /// Whether O_DIRECT is on (after a successful [`FileStorage::direct`]).
    pub fn is_direct(&self) -> bool {
        self.direct_mem_align.is_some()
    }

    fn raw_read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self.engine {
            IoEngine::Psync => self.file.read_exact_at(buf, offset),
            IoEngine::Uring => crate::uring::read_exact_at(&self.file, buf, offset),
        }
    }

    fn raw_write(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        match self.engine {
            IoEngine::Psync => self.file.write_all_at(buf, offset),
            IoEngine::Uring => crate::uring::write_all_at(&self.file, buf, offset),
        }
    }
}

/// Most bytes any per-thread buffer of the data path holds (the O_DIRECT bounce buffer
/// here, the volume's scratch): larger requests go through it in pieces, so a thread's
/// private memory stays bounded whatever clients send (the NBD memory cap counts on it).
pub(crate) const THREAD_BUFFER_MAX: usize = 128 << 10;

thread_local! {
    /// Aligned bounce buffer for O_DIRECT I/O on unaligned caller buffers.
    static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f(piece, at)` on an `align`-aligned buffer for each piece of `len` bytes, at most
/// [`THREAD_BUFFER_MAX`] at a time, `at` being the piece's offset in the request.
fn with_aligned(
    len: usize,
    align: usize,
    mut f: impl FnMut(&mut [u8], usize) -> io::Result<()>,
) -> io::Result<()> {
    BOUNCE.with(|b| {
        let mut b = b.borrow_mut();
        let want = len.min(THREAD_BUFFER_MAX) + align;
        if b.len() < want {
            b.resize(want, 0);
        }
        let start = b.as_ptr().align_offset(align);
        let mut at = 0;
        while at < len {
            let n = (len - at).min(THREAD_BUFFER_MAX);
            f(&mut b[start..start + n], at)?;
            at += n;
        }
        Ok(())
    })
}

impl Storage for FileStorage {
    fn size(&self) -> io::Result<u64> {
        Ok(self.size.load(std::sync::atomic::Ordering::Relaxed))
    }
    fn refresh_size(&self) -> io::Result<u64> {
        use std::io::Seek;
        // I/O is positional (pread/pwrite): moving the shared file offset disturbs nothing.
        let size = (&self.file).seek(io::SeekFrom::End(0))?;
        self.size.store(size, std::sync::atomic::Ordering::Relaxed);
        Ok(size)
    }
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        Some(self.file.as_raw_fd())
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self.direct_mem_align {
            Some(a) if buf.as_ptr().align_offset(a) != 0 => with_aligned(buf.len(), a, |b, at| {
                self.raw_read(b, offset + at as u64)?;
                buf[at..at + b.len()].copy_from_slice(b);
                Ok(())
            }),
            _ => self.raw_read(buf, offset),
        }
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        match self.direct_mem_align {
            Some(a) if buf.as_ptr().align_offset(a) != 0 => with_aligned(buf.len(), a, |b, at| {
                b.copy_from_slice(&buf[at..at + b.len()]);
                self.raw_write(b, offset + at as u64)
            }),
            _ => self.raw_write(buf, offset),
        }
    }
    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn describe(&self) -> String {
        let engine = match self.engine {
            IoEngine::Psync => "psync",
            IoEngine::Uring => "io_uring",
        };
        let cache = if self.is_direct() {
            "O_DIRECT"
        } else {
            "page cache"
        };
        format!("file, {engine}, {cache}")
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        use rustix::fs::{FallocateFlags, fallocate};
        fallocate(
            &self.file,
            FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
            offset,
            len,
        )
        .map_err(io::Error::from)
    }
}
