//! Where ciphertext lives: a file or block device (memory storage is
//! `cryptblk_device::MemStorage`).

pub(crate) use cryptblk_device::Storage;

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use crate::mmap::FileMap;

/// Whether `file` lives on tmpfs or ramfs (memory).
fn on_memory(file: &File) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    rustix::fs::fstatfs(file).is_ok_and(|s| {
        #[allow(clippy::unnecessary_cast)] // f_type's type differs between architectures
        let t = s.f_type as i64;
        t == TMPFS_MAGIC || t == RAMFS_MAGIC
    })
}

/// How a [`FileStorage`] reaches the data. All run on the calling (frontend) thread: the
/// request that needs the data waits for it, nothing is handed to another thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoEngine {
    /// The default: [`IoEngine::Mmap`] for a regular file on tmpfs or ramfs (memory: no
    /// write-back, no disk errors, the mapping *is* the data), [`IoEngine::Psync`]
    /// otherwise and with O_DIRECT.
    #[default]
    Auto,
    /// `pread`/`pwrite`: one system call per request. Measured fastest for one request at
    /// a time per thread on disk-backed files and devices (docs/benchmarks.md).
    Psync,
    /// A per-thread io_uring, one submission and completion per request.
    Uring,
    /// Copies through a shared mapping of the whole file (no system call, no page-cache
    /// lookup per request); SIGBUS (truncation, a full tmpfs, a disk error) falls back to
    /// `pread`/`pwrite`, which report the error. Reads of holes go through `pread` so a
    /// sparse image stays sparse. On disk-backed files each page written after a
    /// write-back costs a fault, so it pays off mostly on memory and read-mostly data.
    Mmap,
}

impl std::str::FromStr for IoEngine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(IoEngine::Auto),
            "psync" | "pread" => Ok(IoEngine::Psync),
            "uring" | "io_uring" | "io-uring" => Ok(IoEngine::Uring),
            "mmap" => Ok(IoEngine::Mmap),
            _ => Err(format!(
                "unknown I/O engine '{s}' (auto, psync, io_uring or mmap)"
            )),
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
    /// The mmap engine's mapping.
    map: Option<FileMap>,
    /// A regular file (it may have holes, which the mmap engine reads with `pread`).
    regular: bool,
}

impl FileStorage {
    /// Wraps an open file or block device, using pread/pwrite through the page cache.
    /// The size is read once, here, by seeking to the end; errors are that seek's.
    pub fn new(file: File) -> io::Result<Self> {
        use std::io::Seek;
        let mut f = file;
        // Block devices report 0 in metadata; seeking to the end works for both.
        let size = f.seek(io::SeekFrom::End(0))?;
        let regular = f.metadata()?.file_type().is_file();
        Ok(FileStorage {
            file: f,
            size: size.into(),
            engine: IoEngine::Psync,
            direct_mem_align: None,
            map: None,
            regular,
        })
    }

    /// Chooses the I/O engine ([`IoEngine::Auto`] is resolved here; [`FileStorage::engine`]
    /// then names the one chosen).
    pub fn with_engine(mut self, engine: IoEngine) -> io::Result<Self> {
        let auto = engine == IoEngine::Auto;
        let engine = match engine {
            IoEngine::Auto if self.regular && !self.is_direct() && on_memory(&self.file) => {
                IoEngine::Mmap
            }
            IoEngine::Auto => IoEngine::Psync,
            e => e,
        };
        self.map = None;
        match engine {
            IoEngine::Uring => crate::uring::probe()?,
            IoEngine::Mmap => {
                if self.is_direct() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "the mmap engine goes through the page cache: not with O_DIRECT",
                    ));
                }
                let writable = rustix::fs::fcntl_getfl(&self.file)
                    .map_err(io::Error::from)?
                    .contains(rustix::fs::OFlags::RDWR);
                let size = self.size.load(std::sync::atomic::Ordering::Relaxed);
                // An empty file has nothing to map: it reads and writes with pread/pwrite.
                if size > 0 {
                    match FileMap::new(&self.file, size, writable) {
                        Ok(m) => self.map = Some(m),
                        // Chosen by `auto`, not asked for: pread/pwrite instead.
                        Err(_) if auto => {
                            self.engine = IoEngine::Psync;
                            return Ok(self);
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            _ => {}
        }
        self.engine = engine;
        Ok(self)
    }

    /// Bypasses the page cache (O_DIRECT) when the file system or device allows it for
    /// I/O of `sector_size` blocks; errors say why not. Buffers that are not aligned as
    /// the kernel wants are bounced through an aligned per-thread buffer.
    pub fn direct(mut self, sector_size: u32) -> io::Result<Self> {
        use rustix::fs::{AtFlags, OFlags, StatxFlags, fcntl_getfl, fcntl_setfl, statx};
        if self.engine == IoEngine::Mmap {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the mmap engine goes through the page cache: not with O_DIRECT",
            ));
        }
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
            IoEngine::Uring => crate::uring::read_exact_at(&self.file, buf, offset),
            IoEngine::Mmap
                if self.map.as_ref().is_some_and(|m| {
                    (!self.regular || m.resident(buf.len(), offset)) && m.copy_out(buf, offset)
                }) =>
            {
                Ok(())
            }
            _ => self.file.read_exact_at(buf, offset),
        }
    }

    fn raw_write(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        match self.engine {
            IoEngine::Uring => crate::uring::write_all_at(&self.file, buf, offset),
            IoEngine::Mmap if self.map.as_ref().is_some_and(|m| m.copy_in(buf, offset)) => Ok(()),
            _ => self.file.write_all_at(buf, offset),
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
    fn read_in_place(&self, len: usize, offset: u64, f: &mut dyn FnMut(&[u8])) -> Option<bool> {
        let m = self.map.as_ref()?;
        if self.regular && !m.resident(len, offset) {
            return None;
        }
        m.lend(len, offset, f)
    }
    fn write_in_place(
        &self,
        len: usize,
        offset: u64,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> Option<bool> {
        self.map.as_ref()?.lend_mut(len, offset, f)
    }
    fn describe(&self) -> String {
        let engine = match self.engine {
            IoEngine::Auto | IoEngine::Psync => "psync",
            IoEngine::Uring => "io_uring",
            IoEngine::Mmap => "mmap",
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
    fn prefetch(&self, offset: u64, len: u64) -> io::Result<()> {
        // O_DIRECT reads never look in the page cache: filling it would only cost memory.
        if self.is_direct() {
            return Ok(());
        }
        cryptblk_device::file_prefetch(&self.file, offset, len)
    }
    fn seek_data(&self, offset: u64) -> io::Result<Option<u64>> {
        cryptblk_device::file_seek_data(&self.file, offset)
    }
    fn seek_hole(&self, offset: u64) -> io::Result<u64> {
        cryptblk_device::file_seek_hole(&self.file, offset)
    }
}
