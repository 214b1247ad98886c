//! The serving process's side of `luksSuspend` / `luksResume`: `suspend` on the control
//! socket drops the volume's keys and holds its I/O; `resume PASSPHRASE-HEX [SLOT]`
//! unlocks the header again and lets the I/O go on. Refused for volumes without a LUKS
//! header (nothing to unlock them again with) and while a reencryption runs.

use crate::control::Reply;
use crate::error::{CliError, CliResult, EXIT_BUSY};
use cryptblk_volume::DataDevice;
use cryptblk_volume::{Suspended, Volume};
use std::sync::{Arc, Mutex};

pub(crate) struct SuspendControl {
    vol: Arc<Volume>,
    /// The LUKS header's file (none for plain and memory volumes).
    header: Option<DataDevice>,
    state: Mutex<Option<Suspended>>,
}

impl SuspendControl {
    /// `header`: the LUKS header's file (a handle of its own is kept).
    pub(crate) fn new(
        vol: Arc<Volume>,
        header: Option<&DataDevice>,
        device: &std::path::Path,
    ) -> CliResult<Arc<Self>> {
        let _ = device;
        let header = header.cloned();
        Ok(Arc::new(SuspendControl {
            vol,
            header,
            state: Mutex::new(None),
        }))
    }

    pub(crate) fn is_suspended(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// `suspend`: `suspended`, or `error CODE: message`. `reencrypting`: whether a job runs.
    pub(crate) fn suspend(&self, reencrypting: bool) -> Reply {
        Reply::of((|| {
            if self.header.is_none() {
                return Err(CliError::usage(
                    "only LUKS volumes can be suspended (a plain volume has no header to \
                     resume with)",
                ));
            }
            if reencrypting {
                return Err(CliError::new(
                    EXIT_BUSY,
                    "a reencryption is running: stop it first (reencrypt-stop, or Ctrl-C \
                     the reencrypt command)",
                ));
            }
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.is_some() {
                return Err(CliError::new(EXIT_BUSY, "the volume is already suspended"));
            }
            *st = Some(
                self.vol
                    .suspend()
                    .map_err(|e| CliError::new(EXIT_BUSY, e.to_string()))?,
            );
            Ok(Reply::Suspended)
        })())
    }

    /// `resume`: `resumed`, or `error CODE: message` (the volume then stays suspended).
    pub(crate) fn resume(&self, pass: &[u8], slot: Option<u32>) -> Reply {
        Reply::of((|| {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let s = st
                .as_mut()
                .ok_or_else(|| CliError::usage("the volume is not suspended"))?;
            let file = self
                .header
                .as_ref()
                .ok_or_else(|| CliError::usage("no header"))?;
            let mut f = file.clone();
            let hdr = cryptblk_format::load_header(&mut f)?;
            let size = self
                .vol
                .storage_size()
                .map_err(|e| CliError::usage(e.to_string()))?;
            let layout = cryptblk_volume::unlock_keys(&*hdr, &mut f, pass, slot, size).map_err(
                |e| match e {
                    cryptblk_volume::Error::Format(cryptblk_format::Error::WrongPassphrase) => {
                        CliError::new(
                            crate::error::EXIT_PERMISSION,
                            "No key available with this passphrase.",
                        )
                    }
                    cryptblk_volume::Error::Format(f) => CliError::from(f),
                    e => CliError::usage(e.to_string()),
                },
            )?;
            // A volume `resize`d smaller keeps its size: the header's one dynamic segment
            // covers the whole device again, cut back here as resize cut it.
            let mut layout = layout;
            let size = cryptblk_device::BlockDevice::size(&*self.vol);
            if let [only] = layout.as_mut_slice()
                && only.len > size
            {
                only.len = size;
            }
            s.resume_keys(layout)
                .map_err(|e| CliError::usage(e.to_string()))?;
            *st = None;
            Ok(Reply::Resumed)
        })())
    }
}
