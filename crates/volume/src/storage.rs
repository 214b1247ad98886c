//! Where ciphertext lives: a file or block device, or memory (for benchmarks, like brd).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::RwLock;

/// Positioned, thread-safe I/O on the backing store of a volume.
pub trait Storage: Send + Sync {
    fn size(&self) -> u64;
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Durable up to here (fdatasync).
    fn sync(&self) -> io::Result<()>;
    /// Deallocates the range (the range then reads as zero ciphertext, i.e. garbage plaintext).
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()>;
    /// The file descriptor offsets refer to, if the storage is one (for frontends doing
    /// their own I/O, e.g. io_uring).
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

/// A regular file or block device.
pub struct FileStorage {
    file: File,
    size: u64,
}

impl FileStorage {
    pub fn new(file: File) -> io::Result<Self> {
        use std::io::Seek;
        let mut f = file;
        // Block devices report 0 in metadata; seeking to the end works for both.
        let size = f.seek(io::SeekFrom::End(0))?;
        Ok(FileStorage { file: f, size })
    }

    pub fn file(&self) -> &File {
        &self.file
    }
}

impl Storage for FileStorage {
    fn size(&self) -> u64 {
        self.size
    }
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        Some(self.file.as_raw_fd())
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
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

/// Memory split into independently locked chunks, so threads working on different parts
/// of the disk do not serialise on one lock.
pub struct MemStorage {
    chunks: Vec<RwLock<Box<[u8]>>>,
    size: u64,
}

const CHUNK: u64 = 1 << 20;

impl MemStorage {
    pub fn new(size: u64) -> Self {
        let n = size.div_ceil(CHUNK);
        let chunks = (0..n)
            .map(|i| {
                let len = CHUNK.min(size - i * CHUNK) as usize;
                RwLock::new(vec![0u8; len].into_boxed_slice())
            })
            .collect();
        MemStorage { chunks, size }
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "I/O past the end of memory storage",
            )),
        }
    }

    /// Calls `f(chunk index, offset in chunk, range in buf)` for each chunk the I/O touches.
    fn for_chunks(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(usize, usize, std::ops::Range<usize>),
    ) {
        let mut done = 0usize;
        while done < len {
            let pos = offset + done as u64;
            let (ci, co) = ((pos / CHUNK) as usize, (pos % CHUNK) as usize);
            let n = (CHUNK as usize - co).min(len - done);
            f(ci, co, done..done + n);
            done += n;
        }
    }
}

impl Storage for MemStorage {
    fn size(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len())?;
        self.for_chunks(offset, buf.len(), |ci, co, r| {
            let c = self.chunks[ci].read().unwrap_or_else(|e| e.into_inner());
            buf[r.clone()].copy_from_slice(&c[co..co + r.len()]);
        });
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len())?;
        self.for_chunks(offset, buf.len(), |ci, co, r| {
            let mut c = self.chunks[ci].write().unwrap_or_else(|e| e.into_inner());
            c[co..co + r.len()].copy_from_slice(&buf[r]);
        });
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len as usize)?;
        self.for_chunks(offset, len as usize, |ci, co, r| {
            let mut c = self.chunks[ci].write().unwrap_or_else(|e| e.into_inner());
            c[co..co + r.len()].fill(0);
        });
        Ok(())
    }
}
