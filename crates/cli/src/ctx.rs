//! What every command is given besides its own arguments: the global options, and the
//! opener of DEVICE arguments (local files, NBD exports, RBD images with the cluster the
//! global `--ceph-conf`/`--ceph-id` name).

use cryptblk_storage::Devices;

#[derive(Clone)]
pub(crate) struct Ctx {
    /// `-q`: no confirmation questions.
    pub batch: bool,
    /// `-v` (or cryptsetup's `--debug`).
    pub verbose: bool,
    /// Run under the name `cryptsetup` or `integritysetup`: its drop-in (`open` detaches
    /// once serving).
    pub dropin: bool,
    /// The name it runs under (`cryptblk`, `cryptsetup`, `integritysetup`), for messages.
    pub program: &'static str,
    /// Opens every DEVICE and `--header` argument.
    pub devices: Devices,
    /// `-T`: how many times a passphrase typed at a terminal is asked for (cryptsetup's
    /// default 3); a passphrase from anywhere else is read once.
    pub tries: u32,
    /// Whether `-T` was given (a crypttab line's `tries=` does not override it).
    pub tries_given: bool,
}

impl Ctx {
    /// How many passphrases to ask for: [`Ctx::tries`] when they are typed at a
    /// terminal (`interactive`), else one.
    pub(crate) fn tries_for(&self, interactive: bool) -> u32 {
        if interactive { self.tries.max(1) } else { 1 }
    }
}

impl Ctx {
    /// The data path's view of [`Ctx::devices`] (for `cryptblk_volume::OpenOptions`).
    pub(crate) fn volume_devices(&self) -> cryptblk_volume::Devices {
        cryptblk_volume::Devices(std::sync::Arc::new(self.devices.clone()))
    }
}
