//! What every command is given besides its own arguments: the global options, and the
//! opener of DEVICE arguments (local files, NBD exports, RBD images with the cluster the
//! global `--ceph-conf`/`--ceph-id` name).

use cryptblk_storage::Devices;

pub(crate) struct Ctx {
    /// `-q`: no confirmation questions.
    pub batch: bool,
    /// `-v` (or cryptsetup's `--debug`).
    pub verbose: bool,
    /// Run under the name `cryptsetup`: its drop-in (`open` detaches once serving).
    pub dropin: bool,
    /// Opens every DEVICE and `--header` argument.
    pub devices: Devices,
}

impl Ctx {
    /// The data path's view of [`Ctx::devices`] (for `cryptblk_volume::OpenOptions`).
    pub(crate) fn volume_devices(&self) -> cryptblk_volume::Devices {
        cryptblk_volume::Devices(std::sync::Arc::new(self.devices.clone()))
    }
}
