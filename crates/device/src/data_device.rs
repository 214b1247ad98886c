//! What a DEVICE argument opens to: a local file or block device, or storage on another
//! host, and who opens it ([`DeviceOpener`]: local files here, remote storage in the
//! `cryptblk-storage` crate), so that the crates reading headers and data never depend on
//! a backend.

use crate::Storage;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// An opened data (or header) device.
#[derive(Clone)]
pub enum DataDevice {
    /// A local file or block device, locked as [`open_local`] locks it.
    File(Arc<File>),
    /// Storage on another host (an NBD export: nothing locks it, the server decides who
    /// may write; a Ceph RBD image: read-write under its exclusive lock).
    Remote(Arc<dyn Storage>),
}

impl DataDevice {
    /// The local file, if it is one.
    pub fn as_file(&self) -> Option<&File> {
        match self {
            DataDevice::File(f) => Some(f),
            DataDevice::Remote(_) => None,
        }
    }

    /// Whether the device is on another host.
    pub fn is_remote(&self) -> bool {
        matches!(self, DataDevice::Remote(_))
    }

    fn inner(&self) -> &dyn Storage {
        match self {
            DataDevice::File(f) => &**f,
            DataDevice::Remote(r) => &**r,
        }
    }
}

impl std::fmt::Debug for DataDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Opens the device a DEVICE argument names, read-only (shared) or read-write (alone).
pub trait DeviceOpener: Send + Sync {
    /// `path` opened for the data path, locked against a second opener.
    fn open(&self, path: &Path, read_only: bool) -> io::Result<DataDevice>;
    /// `path` opened as a detached header. A local file is not locked here (a command
    /// that changes the header locks it itself); remote storage is opened as for data.
    fn open_header(&self, path: &Path, read_only: bool) -> io::Result<DataDevice> {
        let _ = read_only;
        let _ = path;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this device opener opens no headers",
        ))
    }
}

/// A local file opened as a detached header: read-write unless `read_only`, unlocked.
pub fn open_local_header(path: &Path, read_only: bool) -> io::Result<DataDevice> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(path)?;
    Ok(DataDevice::File(Arc::new(f)))
}

/// Local files and block devices only ([`open_local`]): what a library user gets unless
/// it brings remote storage (`cryptblk_storage::Devices`).
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalDevices;

impl DeviceOpener for LocalDevices {
    fn open(&self, path: &Path, read_only: bool) -> io::Result<DataDevice> {
        Ok(DataDevice::File(Arc::new(open_local(path, read_only)?)))
    }
    fn open_header(&self, path: &Path, read_only: bool) -> io::Result<DataDevice> {
        open_local_header(path, read_only)
    }
}

/// Opens a file or block device for the data path, locked against a second opener
/// (exclusive for read-write, shared for read-only). A device another process holds is an
/// error of kind `ResourceBusy` naming it.
pub fn open_local(path: &Path, read_only: bool) -> io::Result<File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let busy = || {
        io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!("{} is in use by another process", path.display()),
        )
    };
    // A block device is opened exclusively (O_EXCL), as cryptsetup opens what it maps: a
    // device that is mounted, mapped by dm-crypt or held by another cryptblk is refused,
    // and while we hold it, the kernel refuses them (mount, dm-crypt, `cryptsetup
    // luksFormat`). Files get the flock below, which cryptsetup honours for LUKS2.
    let block = std::fs::metadata(path)?.file_type().is_block_device();
    let excl = rustix::fs::OFlags::EXCL.bits() as i32;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(!read_only)
        .custom_flags(if block { excl } else { 0 })
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) {
                busy()
            } else {
                e
            }
        })?;
    let locked = if read_only {
        f.try_lock_shared()
    } else {
        f.try_lock()
    };
    locked.map_err(|_| busy())?;
    Ok(f)
}

/// Opens a file or block device for the data path unlocked and not exclusively
/// (cryptsetup's `--shared`): for a second volume on another range of a device that
/// another volume holds.
pub fn open_local_shared(path: &Path, read_only: bool) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(path)
}

impl Storage for DataDevice {
    fn size(&self) -> io::Result<u64> {
        self.inner().size()
    }
    fn refresh_size(&self) -> io::Result<u64> {
        self.inner().refresh_size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner().read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner().write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner().sync()
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner().punch_hole(offset, len)
    }
    fn prefetch(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner().prefetch(offset, len)
    }
    fn seek_data(&self, offset: u64) -> io::Result<Option<u64>> {
        self.inner().seek_data(offset)
    }
    fn seek_hole(&self, offset: u64) -> io::Result<u64> {
        self.inner().seek_hole(offset)
    }
    fn describe(&self) -> String {
        self.inner().describe()
    }
    fn alignment(&self) -> Option<u64> {
        self.inner().alignment()
    }
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner().raw_fd()
    }
    fn close(&self) -> io::Result<()> {
        self.inner().close()
    }
}
