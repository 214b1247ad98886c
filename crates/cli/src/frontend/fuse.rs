//! `open --fuse DIR`: the volume as the file DIR/NAME in a FUSE mount (crates/fuse), 0600,
//! the kernel checking its permissions even with `--allow-other`.

use super::{Control, Frontend, OpenArgs, Started};
use crate::error::{CliError, CliResult, io_err};
use cryptblk_device::BlockDevice;
use cryptblk_fuse::{FuseExport, FuseMount, FuseStats};
use cryptblk_volume::Volume;
use cryptblk_volume::VolumeInfo;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

pub(super) struct FuseFrontend {
    mountpoint: PathBuf,
}

impl FuseFrontend {
    pub(super) fn new(mountpoint: PathBuf) -> Self {
        FuseFrontend { mountpoint }
    }
}

struct FuseControl {
    mountpoint: PathBuf,
    stats: Arc<FuseStats>,
}

impl Control for FuseControl {
    /// A file that is still in use (open, loop device attached) is not pulled away.
    fn stop(&self) -> Result<(), String> {
        FuseMount::request_unmount(&self.mountpoint).map_err(|e| e.to_string())
    }
    fn status(&self) -> Value {
        let s = &self.stats;
        json!({"clients": s.open_handles.load(Relaxed), "clients_total": s.opens_total.load(Relaxed),
               "errors": s.errors.load(Relaxed)})
    }
}

impl Frontend for FuseFrontend {
    fn start(
        self: Box<Self>,
        a: &OpenArgs,
        _dir: &Path,
        vol: Arc<Volume>,
        _info: &VolumeInfo,
    ) -> CliResult<Started> {
        let mnt = self.mountpoint;
        std::fs::create_dir_all(&mnt).map_err(|e| io_err(&mnt, e))?;
        let mut mount = FuseExport::builder(&mnt, vol as Arc<dyn BlockDevice>)
            .file_name(a.name.clone())
            .threads(a.threads())
            .read_only(a.vol.read_only)
            .allow_other(a.allow_other)
            .mount()
            .map_err(|e| CliError::usage(format!("FUSE mount on {}: {e}", mnt.display())))?;
        let desc = format!("fuse {}", mount.file().display());
        let control = Arc::new(FuseControl {
            mountpoint: mnt,
            stats: mount.stats().clone(),
        });
        Ok(Started {
            summary: desc.clone(),
            desc,
            device_node: None,
            control,
            run: Box::new(move || {
                mount
                    .join()
                    .map_err(|e| CliError::usage(format!("FUSE session: {e}")))
            }),
        })
    }
}
