//! Where a volume's bytes live: a DEVICE argument opened as storage, for every command the
//! same way. Local files and block devices (locked: `cryptblk_device::open_local`), NBD
//! exports on another host or socket ([`NbdStorage`]: `nbd://HOST[:PORT]/EXPORT`,
//! `nbds://...` over TLS, `nbd+unix:///EXPORT?socket=PATH`) and Ceph RBD images
//! (`cryptblk_rbd::RbdStorage`: `rbd:POOL/IMAGE[@SNAP]`, librbd loaded at run time).
//! [`Devices`] is the [`DeviceOpener`] that knows them all; the data path
//! (`cryptblk-volume`) and the formats see only `cryptblk_device::Storage`.
//!
//! A new backend: a module here implementing `Storage`, and its arm in
//! [`Devices::open`] (with its test of [`is_remote`]).

#![forbid(unsafe_code)]

mod nbd;

use cryptblk_device::open_local_header;
pub use cryptblk_device::{DataDevice, DeviceOpener, LocalDevices, Storage, open_local};
pub use cryptblk_rbd::RbdOptions;
pub use nbd::{NbdAddress, NbdClientOptions, NbdStorage, NbdUri};

use cryptblk_rbd::{RbdSpec, RbdStorage};
use std::io;
use std::path::Path;
use std::sync::Arc;

/// Opens DEVICE arguments of every kind: a file or block device, an NBD export, an RBD
/// image. The RBD cluster to reach (configuration file, client id) is an argument here,
/// not process state.
#[derive(Clone, Debug, Default)]
pub struct Devices {
    /// For `rbd:` devices: the cluster's configuration file and client id (`read_only` is
    /// set per open).
    pub rbd: RbdOptions,
    /// cryptsetup's `--shared`: a local file or block device is opened for the data path
    /// without the lock or the exclusive open, so that a second volume can be served from
    /// another range of a device already in use (the ranges are the user's to keep
    /// apart, as with dm-crypt).
    pub shared_local: bool,
}

/// Whether `path` names remote storage rather than a file (an `nbd://`, `nbd+unix://`
/// URI, an `rbd:` image): such an argument is never looked up in the file system.
pub fn is_remote(path: &Path) -> bool {
    path.to_str()
        .is_some_and(|s| NbdUri::is_uri(s) || RbdSpec::is_spec(s))
}

/// The object size of the RBD image `device` is (formats align the data offset to it,
/// as librbd's own encryption does); `None` for anything else.
pub fn rbd_object_size(device: &DataDevice) -> Option<u64> {
    match device {
        DataDevice::Remote(r) => r.alignment(),
        DataDevice::File(_) => None,
    }
}

impl Devices {
    /// The remote storage `path` names, `None` when it names a file.
    pub fn open_remote(&self, path: &Path, read_only: bool) -> io::Result<Option<DataDevice>> {
        let Some(s) = path.to_str().filter(|_| is_remote(path)) else {
            return Ok(None);
        };
        let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidInput, e);
        if RbdSpec::is_spec(s) {
            let spec = RbdSpec::parse(s).map_err(|e| invalid(e.to_string()))?;
            let options = RbdOptions {
                read_only,
                ..self.rbd.clone()
            };
            let rbd = RbdStorage::open(&spec, &options)?;
            return Ok(Some(DataDevice::Remote(Arc::new(rbd))));
        }
        let uri = NbdUri::parse(s).map_err(|e| invalid(e.to_string()))?;
        let options = NbdClientOptions {
            read_only,
            ..NbdClientOptions::default()
        };
        let nbd = NbdStorage::connect(&uri, options)?;
        Ok(Some(DataDevice::Remote(Arc::new(nbd))))
    }
}

impl DeviceOpener for Devices {
    fn open(&self, path: &Path, read_only: bool) -> io::Result<DataDevice> {
        match self.open_remote(path, read_only)? {
            Some(r) => Ok(r),
            None if self.shared_local => Ok(DataDevice::File(std::sync::Arc::new(
                cryptblk_device::open_local_shared(path, read_only)?,
            ))),
            None => LocalDevices.open(path, read_only),
        }
    }
    fn open_header(&self, path: &Path, read_only: bool) -> io::Result<DataDevice> {
        match self.open_remote(path, read_only)? {
            Some(r) => Ok(r),
            None => open_local_header(path, read_only),
        }
    }
}
