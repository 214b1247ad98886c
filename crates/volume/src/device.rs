//! What a DEVICE argument names: a local file or block device, or storage on another host
//! (`nbd://HOST[:PORT]/EXPORT`, `nbd+unix:///EXPORT?socket=PATH`, `rbd:POOL/IMAGE[@SNAP]`),
//! opened the same way for every command, so the header and the data are read and written
//! through one [`Storage`].

use crate::{Error, Result};
use cryptblk_device::Storage;
use cryptblk_nbd::{NbdClientOptions, NbdStorage, NbdUri};
use cryptblk_rbd::{RbdSpec, RbdStorage};
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// An opened data (or header) device.
#[derive(Clone)]
pub enum DataDevice {
    /// A local file or block device, locked as [`crate::open_data_file`] locks it.
    File(Arc<File>),
    /// An export on another host (the NBD client: nothing locks it, the server decides who
    /// may write) or a Ceph RBD image (read-write under its exclusive lock).
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
}

impl std::fmt::Debug for DataDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Whether `path` names remote storage rather than a file (an `nbd://`, `nbd+unix://` URI,
/// an `rbd:` image): such an argument is never looked up in the file system.
pub fn is_remote(path: &Path) -> bool {
    path.to_str()
        .is_some_and(|s| NbdUri::is_uri(s) || RbdSpec::is_spec(s))
}

/// The object size of the RBD image `device` names (formats align the data offset to it,
/// as librbd's own encryption does); `None` for anything else.
pub fn rbd_object_size(device: &DataDevice) -> Option<u64> {
    match device {
        DataDevice::Remote(r) => r.alignment(),
        DataDevice::File(_) => None,
    }
}

/// Opens the device `path` names for the data path: a file or block device exclusively
/// (shared when `read_only`; see [`crate::open_data_file`]), or a remote export.
pub fn open_data(path: &Path, read_only: bool) -> Result<DataDevice> {
    match open_remote(path, read_only)? {
        Some(r) => Ok(r),
        None => Ok(DataDevice::File(Arc::new(crate::open_data_file(
            path, read_only,
        )?))),
    }
}

/// Opens the remote export `path` names, `None` when it names a file.
pub fn open_remote(path: &Path, read_only: bool) -> Result<Option<DataDevice>> {
    let Some(s) = path.to_str().filter(|_| is_remote(path)) else {
        return Ok(None);
    };
    if RbdSpec::is_spec(s) {
        let spec = RbdSpec::parse(s).map_err(|e| Error::Invalid(e.to_string()))?;
        let mut options = cryptblk_rbd::default_options()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        options.read_only = read_only;
        let rbd = RbdStorage::open(&spec, &options)?;
        return Ok(Some(DataDevice::Remote(Arc::new(rbd))));
    }
    let uri = NbdUri::parse(s).map_err(|e| Error::Invalid(e.to_string()))?;
    let options = NbdClientOptions {
        read_only,
        ..NbdClientOptions::default()
    };
    let nbd = NbdStorage::connect(&uri, options)?;
    Ok(Some(DataDevice::Remote(Arc::new(nbd))))
}

impl DataDevice {
    fn inner(&self) -> &dyn Storage {
        match self {
            DataDevice::File(f) => &**f,
            DataDevice::Remote(r) => &**r,
        }
    }
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
