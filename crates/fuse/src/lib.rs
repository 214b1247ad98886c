//! A [`cryptblk_device::BlockDevice`] as one regular file in a FUSE mount.
//!
//! ```no_run
//! use std::sync::Arc;
//! use cryptblk_device::MemoryDevice;
//! use cryptblk_fuse::FuseExport;
//!
//! let mount = FuseExport::builder("/mnt/vol", Arc::new(MemoryDevice::new(64 << 20, 512)))
//!     .file_name("disk")
//!     .threads(2)
//!     .mount()?;
//! // /mnt/vol/disk is now the device: losetup, mkfs, dd...
//! mount.unmount()?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! The file is opened with `FOPEN_DIRECT_IO`: the kernel's page cache is bypassed, so every
//! read and write reaches the device as the caller issued it, and `fsync` is the device's
//! flush. Each FUSE worker thread has its own cloned `/dev/fuse` descriptor and serves the
//! requests it reads itself — the crypto runs on that thread, no hand-off.

#![forbid(unsafe_code)]

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime};

use cryptblk_device::BlockDevice;
use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, MountOption, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    SessionACL, TimeOrNow, WriteFlags,
};

/// Largest read or write the kernel sends in one request.
const MAX_IO: u32 = 1 << 20;
/// Attributes never change behind the kernel's back except through us, but keep the TTL
/// short so a size seen by a long-lived client stays right.
const TTL: Duration = Duration::from_secs(1);
const ROOT: INodeNo = INodeNo(1);
const FILE: INodeNo = INodeNo(2);

/// Counters for `status`.
#[derive(Debug, Default)]
pub struct FuseStats {
    /// Open file handles on the volume file.
    pub open_handles: AtomicU64,
    /// Successful opens of the volume file since the mount (never decreases).
    pub opens_total: AtomicU64,
    /// Requests answered with an error.
    pub errors: AtomicU64,
}

/// Builder for a FUSE mount exposing one device as one file.
pub struct FuseExportBuilder {
    mountpoint: PathBuf,
    device: Arc<dyn BlockDevice>,
    file_name: String,
    threads: usize,
    read_only: bool,
    allow_other: bool,
}

/// Entry point: `FuseExport::builder(mountpoint, device)`.
pub struct FuseExport;

impl FuseExport {
    /// Starts configuring a mount of `device` at `mountpoint` (an existing directory), with
    /// the defaults: file `volume`, 2 threads, writable if the device is, owner-only access.
    /// Nothing is mounted until [`FuseExportBuilder::mount`].
    pub fn builder(
        mountpoint: impl AsRef<Path>,
        device: Arc<dyn BlockDevice>,
    ) -> FuseExportBuilder {
        FuseExportBuilder {
            mountpoint: mountpoint.as_ref().to_path_buf(),
            device,
            file_name: "volume".into(),
            threads: 2,
            read_only: false,
            allow_other: false,
        }
    }
}

impl FuseExportBuilder {
    /// Name of the file inside the mount (default `volume`).
    pub fn file_name(mut self, name: impl Into<String>) -> Self {
        self.file_name = name.into();
        self
    }
    /// Worker threads, each with its own `/dev/fuse` descriptor (default 2).
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n.max(1);
        self
    }
    /// Refuse writes even if the device accepts them.
    pub fn read_only(mut self, ro: bool) -> Self {
        self.read_only = ro;
        self
    }
    /// Let other users than the mounting one (root included) open the file.
    pub fn allow_other(mut self, yes: bool) -> Self {
        self.allow_other = yes;
        self
    }

    /// Mounts the file system; it is served by background threads until
    /// [`FuseMount::unmount`] (or drop, which detaches lazily).
    pub fn mount(self) -> io::Result<FuseMount> {
        if self.file_name.is_empty()
            || self.file_name.contains('/')
            || self.file_name == "."
            || self.file_name == ".."
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid file name '{}'", self.file_name),
            ));
        }
        if !Path::new("/dev/fuse").exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "FUSE is not available: /dev/fuse is missing (modprobe fuse)",
            ));
        }
        let read_only = self.read_only || self.device.read_only();
        let stats = Arc::new(FuseStats::default());
        let fs = VolumeFs {
            device: self.device,
            name: self.file_name.clone(),
            read_only,
            stats: stats.clone(),
            uid: current_uid(),
            gid: current_gid(),
            mounted_at: SystemTime::now(),
        };
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("cryptblk".into()),
            MountOption::Subtype("cryptblk".into()),
            MountOption::NoExec,
            MountOption::NoSuid,
            MountOption::NoDev,
            MountOption::NoAtime,
            // The kernel checks every open against the file's owner and mode (0600, the
            // server's user): with --allow-other, other users reach the mount but still
            // not the file unless its permissions let them.
            MountOption::DefaultPermissions,
            if read_only {
                MountOption::RO
            } else {
                MountOption::RW
            },
        ];
        config.acl = if self.allow_other {
            SessionACL::All
        } else {
            SessionACL::Owner
        };
        config.n_threads = Some(self.threads);
        config.clone_fd = true;
        let session = fuser::spawn_mount(fs, &self.mountpoint, &config)?;
        Ok(FuseMount {
            session: Some(session),
            mountpoint: self.mountpoint.clone(),
            file: self.mountpoint.join(&self.file_name),
            stats,
        })
    }
}

/// A mounted volume file.
pub struct FuseMount {
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    file: PathBuf,
    stats: Arc<FuseStats>,
}

impl FuseMount {
    /// Path of the volume file.
    pub fn file(&self) -> &Path {
        &self.file
    }
    /// The directory the file system is mounted on.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }
    /// Live counters, updated by the worker threads while the mount is served.
    pub fn stats(&self) -> &Arc<FuseStats> {
        &self.stats
    }

    /// Asks the kernel to unmount, failing with `ResourceBusy` while the file is in use
    /// (open, or attached to a loop device) — like `umount` without `-l`.
    pub fn request_unmount(mountpoint: &Path) -> io::Result<()> {
        let out = Command::new(fusermount())
            .arg("-u")
            .arg(mountpoint)
            .output()?;
        if out.status.success() {
            return Ok(());
        }
        let msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let kind = if msg.contains("busy") {
            io::ErrorKind::ResourceBusy
        } else {
            io::ErrorKind::Other
        };
        Err(io::Error::new(
            kind,
            format!("unmounting {}: {msg}", mountpoint.display()),
        ))
    }

    /// Unmounts (refusing while the file is busy) and waits until every worker thread has
    /// finished its request.
    pub fn unmount(mut self) -> io::Result<()> {
        Self::request_unmount(&self.mountpoint)?;
        self.join()
    }

    /// Waits for the session to end (after an unmount by anyone).
    pub fn join(&mut self) -> io::Result<()> {
        match self.session.take() {
            Some(s) => s.join(),
            None => Ok(()),
        }
    }
}

fn fusermount() -> &'static str {
    if Path::new("/usr/bin/fusermount3").exists() || which("fusermount3") {
        "fusermount3"
    } else {
        "fusermount"
    }
}

fn which(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
        .unwrap_or(false)
}

fn current_uid() -> u32 {
    std::fs::metadata("/proc/self").map_or(0, |m| std::os::unix::fs::MetadataExt::uid(&m))
}

fn current_gid() -> u32 {
    std::fs::metadata("/proc/self").map_or(0, |m| std::os::unix::fs::MetadataExt::gid(&m))
}

struct VolumeFs {
    device: Arc<dyn BlockDevice>,
    name: String,
    read_only: bool,
    stats: Arc<FuseStats>,
    uid: u32,
    gid: u32,
    mounted_at: SystemTime,
}

thread_local! {
    /// Each worker's read buffer, grown to the largest read it has served.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn errno_of(e: &io::Error) -> Errno {
    Errno::from_i32(cryptblk_device::errno_of(e))
}

impl VolumeFs {
    fn attr(&self, ino: INodeNo) -> FileAttr {
        let (kind, perm, size, nlink) = if ino == ROOT {
            (FileType::Directory, 0o755, 0, 2)
        } else {
            let perm = if self.read_only { 0o400 } else { 0o600 };
            (FileType::RegularFile, perm, self.device.size(), 1)
        };
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: self.device.block_size().max(4096),
            flags: 0,
        }
    }

    fn fail(&self, e: &io::Error) -> Errno {
        self.stats.errors.fetch_add(1, Relaxed);
        errno_of(e)
    }

    /// Clips a request to the device: `None` when it starts past the end.
    fn clip(&self, offset: u64, len: u64) -> Option<u64> {
        let size = self.device.size();
        (offset <= size).then(|| len.min(size - offset))
    }
}

impl Filesystem for VolumeFs {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> io::Result<()> {
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_readahead(MAX_IO);
        // O_DIRECT reads and writes submitted asynchronously (io_uring, libaio) reach the
        // worker threads together instead of one at a time.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_ASYNC_DIO);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT && name == OsStr::new(&self.name) {
            reply.entry(&TTL, &self.attr(FILE), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino == ROOT || ino == FILE {
            reply.attr(&TTL, &self.attr(ino));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    /// A block device cannot change size or owner: only no-op changes succeed (tools such
    /// as `cp --sparse` or `truncate` to the same size), anything else is refused.
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if ino != FILE && ino != ROOT {
            return reply.error(Errno::ENOENT);
        }
        if mode.is_some() || uid.is_some() || gid.is_some() {
            return reply.error(Errno::EPERM);
        }
        if let Some(s) = size
            && (ino != FILE || s != self.device.size())
        {
            return reply.error(if self.read_only {
                Errno::EROFS
            } else {
                Errno::EPERM
            });
        }
        reply.attr(&TTL, &self.attr(ino));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if self.read_only && flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        self.stats.open_handles.fetch_add(1, Relaxed);
        self.stats.opens_total.fetch_add(1, Relaxed);
        reply.opened(
            FileHandle(0),
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
        );
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        let Some(len) = self.clip(offset, u64::from(size)) else {
            return reply.data(&[]);
        };
        READ_BUF.with(|b| {
            let mut buf = b.borrow_mut();
            if buf.len() < len as usize {
                buf.resize(len as usize, 0);
            }
            let buf = &mut buf[..len as usize];
            match self.device.read_at(buf, offset) {
                Ok(()) => reply.data(buf),
                Err(e) => reply.error(self.fail(&e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if self.read_only {
            return reply.error(Errno::EROFS);
        }
        // Writing past the end of a block device is ENOSPC, as for a real one.
        let Some(len) = self
            .clip(offset, data.len() as u64)
            .filter(|&l| l > 0 || data.is_empty())
        else {
            return reply.error(Errno::ENOSPC);
        };
        let fua = flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0;
        match self.device.write_at(&data[..len as usize], offset, fua) {
            Ok(()) => reply.written(len as u32),
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2): nothing buffered here (direct I/O); durability is fsync's job.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if ino == FILE {
            self.stats.open_handles.fetch_sub(1, Relaxed);
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.device.flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.fail(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (ROOT, FileType::Directory, "."),
            (ROOT, FileType::Directory, ".."),
            (FILE, FileType::RegularFile, self.name.as_str()),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bs = self.device.block_size();
        let blocks = self.device.size() / u64::from(bs);
        reply.statfs(blocks, 0, 0, 2, 0, bs, 255, bs);
    }

    /// `fallocate(PUNCH_HOLE)` and `ZERO_RANGE` both write zeros: fallocate(2) promises
    /// that a punched range reads back as zeros, and a hole in the ciphertext would decrypt
    /// to garbage (the loop driver turns write-zeroes into PUNCH_HOLE, so a file system on
    /// a loop device relies on it). Plain preallocation is a no-op on a fixed-size device.
    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        let end = offset.checked_add(length);
        if end.is_none_or(|e| e > self.device.size()) {
            return reply.error(if mode & libc::FALLOC_FL_KEEP_SIZE != 0 {
                Errno::EINVAL
            } else {
                Errno::ENOSPC
            });
        }
        let r = if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0 {
            if self.read_only {
                return reply.error(Errno::EROFS);
            }
            self.device.write_zeroes(offset, length, false)
        } else {
            Ok(())
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.fail(&e)),
        }
    }
}
