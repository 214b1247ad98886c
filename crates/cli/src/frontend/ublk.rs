//! `open --ublk`: serve an unlocked volume as a kernel block device, /dev/ublkbN.
//!
//! Besides the files every open volume has (NAME.pid, NAME.ctl, NAME.log), a ublk volume
//! records its device number in NAME.ublk, which `open --recover` (re-attach a new server
//! after a crash) and `close` (remove a device whose server died) use.

use super::{Control, Frontend, OpenArgs, Started};
use crate::error::{CliError, CliResult, EXIT_BUSY, EXIT_NO_DEVICE};
use crate::rundir;
use clap::Args;
use cryptblk_device::BlockDevice;
use cryptblk_ublk::{Features, ShutdownHandle, UblkServer};
use cryptblk_volume::Volume;
use cryptblk_volume::VolumeInfo;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Options of `open` for the ublk frontend.
#[derive(Args, Debug, Default)]
pub(crate) struct UblkArgs {
    /// Serve as a kernel block device /dev/ublkbN (needs ublk_drv, Linux 6.5+).
    #[arg(long)]
    pub ublk: bool,
    /// ublk and vhost-user-blk: queues, one thread each (default: one per CPU).
    #[arg(long)]
    pub queues: Option<u16>,
    /// ublk: requests in flight per queue.
    #[arg(long = "queue-depth", default_value_t = cryptblk_ublk::DEFAULT_QUEUE_DEPTH)]
    pub queue_depth: u16,
    /// ublk: attach to the device NAME had when its server died (I/O held by the kernel is
    /// re-issued), instead of creating one.
    #[arg(long)]
    pub recover: bool,
    /// ublk: create the device without user recovery: if the server dies, the kernel stops
    /// it and I/O fails.
    #[arg(long = "no-recovery")]
    pub no_recovery: bool,
    /// ublk: device number to create, or to recover (default: new = any free one,
    /// recover = the one recorded for NAME).
    #[arg(long = "dev-id")]
    pub dev_id: Option<u32>,
}

/// Rejects ublk options given without `--ublk` (`--queues` is also vhost-user-blk's,
/// allowed with `queues_too`).
pub(crate) fn check_unused(a: &UblkArgs, queues_too: bool) -> CliResult<()> {
    if (a.queues.is_some() && !queues_too) || a.recover || a.no_recovery || a.dev_id.is_some() {
        return Err(CliError::usage(if queues_too {
            "--recover, --no-recovery and --dev-id need --ublk"
        } else {
            "--queues needs --ublk or --vhost-user-blk; --recover, --no-recovery and --dev-id need --ublk"
        }));
    }
    Ok(())
}

fn ublk_err(e: cryptblk_ublk::Error) -> CliError {
    use cryptblk_ublk::Error as E;
    match e {
        E::NotAvailable(s) | E::Unsupported(s) => CliError::new(EXIT_NO_DEVICE, s),
        E::Busy(s) => CliError::new(EXIT_BUSY, s),
        e => CliError::usage(e.to_string()),
    }
}

fn state_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.ublk"))
}

/// What NAME.ublk records about a served device, so that `--recover` re-attaches only the
/// same volume under the same key: the kernel re-issues the writes it held, and they must
/// never land on another volume or be encrypted under another key.
#[derive(Clone)]
struct Record {
    dev_id: u32,
    /// The LUKS UUID (none for plain mode).
    uuid: Option<String>,
    /// The volume's cipher applied to a fixed zero sector (see [`key_check`]).
    key_check: String,
    /// Where the ciphertext is: the device or file and the data segment (see [`target`]).
    target: String,
}

impl Record {
    fn to_json(&self) -> String {
        json!({"dev_id": self.dev_id, "uuid": self.uuid, "key_check": self.key_check,
               "target": self.target})
        .to_string()
            + "\n"
    }

    fn read(dir: &Path, name: &str) -> Option<Record> {
        let v: serde_json::Value =
            serde_json::from_str(rundir::read_private_file(&state_path(dir, name))?.trim()).ok()?;
        Some(Record {
            dev_id: u32::try_from(v["dev_id"].as_u64()?).ok()?,
            uuid: v["uuid"].as_str().map(String::from),
            key_check: v["key_check"].as_str()?.to_string(),
            target: v["target"].as_str()?.to_string(),
        })
    }
}

/// A fingerprint of the volume key that reveals nothing about it: the first 16 bytes of a
/// zero sector encrypted at a sector number no volume reaches (2^48) with the volume's own
/// cipher. Two volumes with different keys (or ciphers) differ here.
fn key_check(vol: &cryptblk_volume::Volume) -> CliResult<String> {
    vol.with_cipher(|c| {
        let mut sector = vec![0u8; c.sector_size() as usize];
        c.encrypt(1 << 48, &mut sector)?;
        Ok(hex::encode(&sector[..16]))
    })
}

fn recorded_dev_id(dir: &Path, name: &str) -> Option<u32> {
    Record::read(dir, name).map(|r| r.dev_id)
}

/// Before `--recover` re-attaches `dev_id`: it must be the volume recorded for NAME.
/// Where a volume's ciphertext lives: the block device (its device number) or the file
/// (device and inode, so a copy of the image is another target), and the data segment.
fn target(device: &Path, vol: &cryptblk_volume::Volume) -> String {
    use cryptblk_device::BlockDevice;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let what = match std::fs::metadata(device) {
        Ok(m) if m.file_type().is_block_device() => format!("block device {}", m.rdev()),
        Ok(m) => format!("file {}:{}", m.dev(), m.ino()),
        Err(_) => device.display().to_string(), // mem:SIZE
    };
    format!("{what}, offset {}, size {}", vol.data_offset(), vol.size())
}

/// Before `--recover` re-attaches a device: `now` (what this server would serve) must be
/// what NAME.ublk recorded.
fn check_recovery(dir: &Path, name: &str, now: &Record) -> CliResult<()> {
    let (dev_id, uuid, check) = (now.dev_id, &now.uuid, &now.key_check);
    let refuse = |why: String| {
        Err(CliError::new(
            EXIT_BUSY,
            format!(
                "refusing to re-attach /dev/ublkb{dev_id}: {why}; the writes the kernel holds \
                 for it would be written under the wrong key (`cryptblk close {name}` drops them)"
            ),
        ))
    };
    let Some(r) = Record::read(dir, name) else {
        return refuse(format!(
            "nothing records which volume it served as {name} (no valid {})",
            state_path(dir, name).display()
        ));
    };
    if r.dev_id != dev_id {
        return refuse(format!("{name} was /dev/ublkb{}", r.dev_id));
    }
    if &r.uuid != uuid {
        return refuse(format!(
            "it served the volume with UUID {}, this is {}",
            r.uuid.as_deref().unwrap_or("(none)"),
            uuid.as_deref().unwrap_or("(none)")
        ));
    }
    if &r.key_check != check {
        return refuse("it served this volume under another key or cipher".into());
    }
    if r.target != now.target {
        return refuse(format!("it served {}, this is {}", r.target, now.target));
    }
    Ok(())
}

/// Queue limits of the block device under `path` (itself, or the one holding the file):
/// (max I/O bytes, physical block size, rotational). `None` when there is none in sysfs
/// (tmpfs, 9p, memory...).
fn backing_limits(path: &Path) -> Option<(u32, u32, bool)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::metadata(path).ok()?;
    let dev = if m.file_type().is_block_device() {
        m.rdev()
    } else {
        m.dev()
    };
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let base = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    // A partition has no queue of its own; its disk (the parent directory) has.
    let queue = [base.join("queue"), base.join("../queue")]
        .into_iter()
        .find(|q| q.is_dir())?;
    let read = |f: &str| -> Option<u64> {
        std::fs::read_to_string(queue.join(f))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let max = read("max_sectors_kb").map_or(cryptblk_ublk::DEFAULT_MAX_IO_BYTES, |kb| {
        (kb * 1024).min(cryptblk_ublk::DEFAULT_MAX_IO_BYTES as u64) as u32
    });
    Some((
        max,
        read("physical_block_size").unwrap_or(512) as u32,
        read("rotational") == Some(1),
    ))
}

/// Why `device` may not be pulled away, if it is held exclusively: a mounted file
/// system, a volume stacked on it (cryptblk's, dm's) or anything else opened with O_EXCL.
/// Removing a ublk device waits for its last opener, so `close` would hang where
/// cryptsetup answers "still in use"; an exclusive open of our own asks the kernel.
fn held_exclusively(device: &Path) -> Option<String> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL | libc::O_CLOEXEC)
        .open(device)
    {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Some(format!(
            "{} is held open (mounted, or a volume is stacked on it)",
            device.display()
        )),
        _ => None,
    }
}

/// The ublk frontend: `prepare` probes the driver and finds the device to recover (before
/// the passphrase is asked for or the process detaches), `start` creates or re-attaches it.
#[derive(Default)]
pub(super) struct UblkFrontend {
    features: Option<Features>,
    recover_id: Option<u32>,
}

struct UblkControl {
    handle: ShutdownHandle,
    /// The block device served (/dev/ublkbN).
    path: PathBuf,
    /// The fields fixed at start (path, queues, features...).
    fixed: Value,
}

impl Control for UblkControl {
    fn stop(&self) -> Result<(), String> {
        if let Some(why) = held_exclusively(&self.path) {
            return Err(why);
        }
        self.handle.shutdown();
        Ok(())
    }
    fn status(&self) -> Value {
        let st = self.handle.stats();
        let mut e = self.fixed.clone();
        e["requests"] = st.requests.into();
        e["errors"] = st.errors.into();
        e
    }
    fn can_resize(&self) -> Result<(), String> {
        Err(
            "a ublk device keeps the size it was added with (the kernel's size change, \
             UBLK_U_CMD_UPDATE_SIZE of Linux 6.16, is not used by cryptblk yet): close and \
             reopen the volume"
                .into(),
        )
    }
}

impl Frontend for UblkFrontend {
    fn prepare(&mut self, a: &OpenArgs, dir: &Path) -> CliResult<()> {
        if a.ublk.recover && a.ublk.no_recovery {
            return Err(CliError::usage(
                "--recover and --no-recovery exclude each other",
            ));
        }
        // Is there a ublk driver at all?
        self.features = Some(Features::probe().map_err(ublk_err)?);
        if a.ublk.recover {
            self.recover_id = Some(
                a.ublk
                    .dev_id
                    .or_else(|| recorded_dev_id(dir, &a.name))
                    .ok_or_else(|| {
                        CliError::new(
                            EXIT_NO_DEVICE,
                            format!("no ublk device is recorded for {} (give --dev-id)", a.name),
                        )
                    })?,
            );
        }
        Ok(())
    }

    fn start(
        self: Box<Self>,
        a: &OpenArgs,
        dir: &Path,
        vol: Arc<Volume>,
        info: &VolumeInfo,
    ) -> CliResult<Started> {
        let mut record = Record {
            dev_id: self.recover_id.unwrap_or(0),
            uuid: info.uuid.clone(),
            key_check: key_check(&vol)?,
            target: target(&a.device, &vol),
        };
        if self.recover_id.is_some() {
            check_recovery(dir, &a.name, &record)?;
        }
        let mut b = UblkServer::builder(vol as Arc<dyn BlockDevice>)
            .queue_depth(a.ublk.queue_depth)
            .recovery(!a.ublk.no_recovery);
        if let Some(q) = a.ublk.queues {
            b = b.queues(q);
        }
        if let Some((max, pbs, rot)) = backing_limits(&a.device) {
            b = b.max_io_bytes(max).physical_block_size(pbs).rotational(rot);
        }
        match self.recover_id {
            Some(id) => b = b.recover(id),
            None => {
                if let Some(id) = a.ublk.dev_id {
                    b = b.dev_id(id);
                }
            }
        }
        let server = b.build().map_err(ublk_err)?;
        let path = server.block_device().display().to_string();
        let state = state_path(dir, &a.name);
        record.dev_id = server.dev_id();
        rundir::write_private_file(&state, record.to_json().as_bytes())?;
        for m in self.features.iter().flat_map(|f| f.missing()) {
            eprintln!("{}: note: this kernel's ublk lacks {m}", a.name);
        }
        if a.ublk.no_recovery {
            eprintln!(
                "{}: user recovery off: if this server dies, {path} fails its I/O",
                a.name
            );
        }
        let summary = format!(
            "{path} ({} queues x {} deep{}{})",
            server.queues(),
            server.queue_depth(),
            if server.recoverable() {
                ", recoverable"
            } else {
                ""
            },
            if self.recover_id.is_some() {
                ", recovered"
            } else {
                ""
            },
        );
        let control = Arc::new(UblkControl {
            handle: server.shutdown_handle(),
            path: server.block_device(),
            fixed: json!({
                "path": path, "dev_id": server.dev_id(), "queues": server.queues(),
                "queue_depth": server.queue_depth(), "max_io_bytes": server.max_io_bytes(),
                "recoverable": server.recoverable(), "ublk_features": server.features().names(),
            }),
        });
        Ok(Started {
            desc: "ublk".into(),
            summary,
            device_node: Some(path),
            control,
            run: Box::new(move || {
                let r = server.run();
                let _ = std::fs::remove_file(&state);
                r.map_err(ublk_err)
            }),
        })
    }
}

/// `close NAME` when no server answers: if NAME had a ublk device, remove it (its server
/// died; pending I/O fails). `None` if there is nothing of NAME's to remove.
fn close_stale(dir: &Path, name: &str) -> Option<CliResult<()>> {
    let id = recorded_dev_id(dir, name)?;
    let r = match cryptblk_ublk::device_state(id) {
        Ok(None) => Ok(()),
        // A process that has exited (gone, or a zombie whose threads have all ended)
        // serves nothing any more.
        Ok(Some((_, pid))) if pid > 0 && !crate::process::has_exited(pid) => Err(CliError::new(
            EXIT_BUSY,
            format!("/dev/ublkb{id} is served by pid {pid}, which does not answer"),
        )),
        Ok(Some(_)) => cryptblk_ublk::remove_stale(id).map_err(ublk_err),
        Err(e) => Err(ublk_err(e)),
    };
    if r.is_ok() {
        for ext in ["ublk", "ctl", "pid"] {
            let _ = std::fs::remove_file(dir.join(format!("{name}.{ext}")));
        }
        eprintln!("{name}: its server was gone; removed /dev/ublkb{id}");
    }
    Some(r)
}

/// What `status NAME` says when no server answers but NAME had a ublk device.
fn stale_status(dir: &Path, name: &str) -> Option<String> {
    let id = recorded_dev_id(dir, name)?;
    let state = cryptblk_ublk::device_state(id).ok()??.0;
    Some(match state {
        "quiesced" | "live" => format!(
            "{name}: its server is gone; the kernel holds /dev/ublkb{id} ({state}) for recovery: \
             `cryptblk open IMAGE {name} --ublk --recover` re-attaches, `cryptblk close {name}` removes it"
        ),
        _ => format!(
            "{name}: its server is gone and /dev/ublkb{id} is stopped; `cryptblk close {name}` removes it"
        ),
    })
}

/// The kernel device a dead ublk server leaves: removed by `close`, explained by `status`.
pub(super) struct UblkLeftovers;

impl super::Leftovers for UblkLeftovers {
    fn close_stale(&self, dir: &Path, name: &str) -> Option<CliResult<()>> {
        close_stale(dir, name)
    }
    fn stale_status(&self, dir: &Path, name: &str) -> Option<String> {
        stale_status(dir, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cryptblk_crypto::{CipherSpec, IvOptions};
    use cryptblk_volume::{MemStorage, VolumeParams, volume_from_key};

    fn volume(key_byte: u8) -> cryptblk_volume::Volume {
        let params = VolumeParams {
            cipher: CipherSpec::parse("aes-xts-plain64").unwrap(),
            sector_size: 4096,
            iv: IvOptions::default(),
            data_offset: 0,
            data_length: None,
            read_only: false,
            allow_discards: false,
        };
        volume_from_key(Box::new(MemStorage::new(1 << 20)), &[key_byte; 64], &params).unwrap()
    }

    #[test]
    fn recovery_reattaches_only_the_recorded_volume_under_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (
            key_check(&volume(1)).unwrap(),
            key_check(&volume(2)).unwrap(),
        );
        assert_eq!(a, key_check(&volume(1)).unwrap(), "deterministic");
        assert_ne!(a, b, "another key, another fingerprint");
        let img = dir.path().join("img");
        std::fs::write(&img, b"x").unwrap();
        let copy = dir.path().join("copy");
        std::fs::copy(&img, &copy).unwrap();
        let here = target(&img, &volume(1));
        assert_ne!(
            here,
            target(&copy, &volume(1)),
            "a copy of the image is another target"
        );
        let uuid = Some("0a1b2c3d-1111-2222-3333-444455556666".to_string());
        let now = Record {
            dev_id: 3,
            uuid: uuid.clone(),
            key_check: a.clone(),
            target: here.clone(),
        };
        let refused = |r: CliResult<()>, what: &str| {
            let e = r.expect_err(what);
            assert_eq!(e.code, EXIT_BUSY, "{what}");
            assert!(e.message.contains("refusing to re-attach"), "{what}: {e}");
        };
        refused(check_recovery(dir.path(), "v", &now), "no record at all");
        rundir::write_private_file(&state_path(dir.path(), "v"), now.to_json().as_bytes()).unwrap();
        assert_eq!(recorded_dev_id(dir.path(), "v"), Some(3));
        check_recovery(dir.path(), "v", &now).unwrap();
        let with = |f: &dyn Fn(&mut Record)| {
            let mut r = Record { ..now.clone() };
            f(&mut r);
            r
        };
        refused(
            check_recovery(dir.path(), "v", &with(&|r| r.dev_id = 4)),
            "other device",
        );
        refused(
            check_recovery(dir.path(), "v", &with(&|r| r.uuid = Some("other".into()))),
            "other volume",
        );
        refused(
            check_recovery(dir.path(), "v", &with(&|r| r.uuid = None)),
            "plain instead",
        );
        refused(
            check_recovery(dir.path(), "v", &with(&|r| r.key_check = b.clone())),
            "other key",
        );
        refused(
            check_recovery(
                dir.path(),
                "v",
                &with(&|r| r.target = target(&copy, &volume(1))),
            ),
            "a copy of the image",
        );
        // A record in the old format (just the number) is not enough to re-attach.
        rundir::write_private_file(&state_path(dir.path(), "v"), b"3\n").unwrap();
        refused(check_recovery(dir.path(), "v", &now), "old record");
    }
}
