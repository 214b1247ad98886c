//! The header as a whole: `uuid`, `is-luks`, `config`, `erase`, `header-backup`,
//! `header-restore`, `repair` (cryptsetup luksUUID, isLuks, config, erase,
//! luksHeaderBackup, luksHeaderRestore, repair).

use super::{header_path, load, open_header};
use crate::args::{DeviceArgs, HeaderArgs, KeyArgs};
use crate::ctx::Ctx;
use crate::error::{CliError, CliResult, EXIT_NO_DEVICE, EXIT_PERMISSION, io_err};
use crate::passphrase::{confirm, get_passphrase};
use clap::Args;
use cryptblk_format::luks2::Luks2Header;
use cryptblk_format::{LuksHeader, MemStorage, Storage, load_header};
use cryptblk_volume::VolumeType;
use std::fs::OpenOptions;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(crate) struct RepairArgs {
    pub device: PathBuf,
    #[command(flatten)]
    pub header: HeaderArgs,
    /// The passphrase, where an interrupted reencryption step is recovered or the
    /// reencryption metadata verified.
    #[command(flatten)]
    pub key: KeyArgs,
    /// Only try this keyslot.
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
}

#[derive(Args, Debug)]
pub(crate) struct BackupArgs {
    pub device: PathBuf,
    #[arg(long = "header-backup-file")]
    pub header_backup_file: PathBuf,
    #[command(flatten)]
    pub header: HeaderArgs,
}

#[derive(Args, Debug)]
pub(crate) struct UuidArgs {
    /// Image file or block device.
    pub device: PathBuf,
    #[command(flatten)]
    pub header: HeaderArgs,
    /// Set this UUID (36 characters, hyphenated) instead of printing the current one.
    #[arg(long)]
    pub uuid: Option<String>,
}

pub(crate) fn uuid(ctx: &Ctx, a: UuidArgs) -> CliResult<()> {
    let mut dev = open_header(ctx, &a.device, &a.header, a.uuid.is_some())?;
    let mut hdr = load(&mut dev, header_path(&a.device, &a.header))?;
    match &a.uuid {
        None => outln!("{}", hdr.uuid()),
        Some(u) => {
            confirm(
                ctx.batch,
                &format!(
                    "Do you really want to change the UUID of device {}?",
                    a.device.display()
                ),
            )?;
            hdr.set_uuid(&mut dev, u)?;
        }
    }
    Ok(())
}

#[derive(Args, Debug)]
pub(crate) struct ConfigArgs {
    /// LUKS2 image file or block device.
    pub device: PathBuf,
    #[command(flatten)]
    pub header: HeaderArgs,
    /// Set the label ("" clears it).
    #[arg(long)]
    pub label: Option<String>,
    /// Set the subsystem ("" clears it).
    #[arg(long)]
    pub subsystem: Option<String>,
    /// Keyslot priority: prefer, normal or ignore (with --key-slot).
    #[arg(long, requires = "key_slot")]
    pub priority: Option<String>,
    /// The keyslot whose priority is set.
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
}

/// `cryptsetup config`: label, subsystem, keyslot priority (LUKS2 only).
pub(crate) fn config(ctx: &Ctx, a: ConfigArgs) -> CliResult<()> {
    use cryptblk_format::luks2::Priority;
    if a.label.is_none() && a.subsystem.is_none() && a.priority.is_none() {
        return Err(CliError::usage(
            "nothing to change (--label, --subsystem, --priority)",
        ));
    }
    let priority = match a.priority.as_deref() {
        None => None,
        Some("prefer") => Some(Priority::Prefer),
        Some("normal") => Some(Priority::Normal),
        Some("ignore") => Some(Priority::Ignore),
        Some(p) => {
            return Err(CliError::usage(format!(
                "unknown --priority {p} (prefer, normal, ignore)"
            )));
        }
    };
    let mut dev = open_header(ctx, &a.device, &a.header, true)?;
    let path = header_path(&a.device, &a.header);
    if load(&mut dev, path)?.version() != 2 {
        return Err(CliError::usage("config is for LUKS2 volumes only"));
    }
    let mut hdr = Luks2Header::read(&mut dev)?;
    // As cryptsetup (crypt_set_label takes both): giving either sets both, the one not
    // given cleared.
    if a.label.is_some() || a.subsystem.is_some() {
        hdr.set_labels(
            &mut dev,
            a.label.as_deref().unwrap_or(""),
            a.subsystem.as_deref().unwrap_or(""),
        )?;
    }
    if let (Some(p), Some(slot)) = (priority, a.key_slot) {
        hdr.set_keyslot_priority(&mut dev, slot, p)?;
    }
    Ok(())
}

pub(crate) fn erase(ctx: &Ctx, a: DeviceArgs) -> CliResult<()> {
    let mut dev = open_header(ctx, &a.device, &a.header, true)?;
    let mut hdr = load(&mut dev, header_path(&a.device, &a.header))?;
    confirm(
        ctx.batch,
        &format!(
            "This will wipe all keyslots on {}: its data can never be decrypted again.",
            a.device.display()
        ),
    )?;
    hdr.erase(&mut dev)?;
    Ok(())
}

/// `isLuks`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct IsLuksArgs {
    /// Image file or block device.
    pub device: PathBuf,
    #[command(flatten)]
    pub header: crate::args::HeaderArgs,
    /// luks (either version), luks1 or luks2: only that version counts.
    #[arg(long = "type", value_enum)]
    pub kind: Option<VolumeType>,
}

pub(crate) fn is_luks(ctx: &Ctx, a: IsLuksArgs) -> CliResult<()> {
    let want = match a.kind {
        None | Some(VolumeType::Luks) => None,
        Some(VolumeType::Luks1) => Some(1),
        Some(VolumeType::Luks2) => Some(2),
        Some(other) => {
            return Err(CliError::usage(format!(
                "isLuks: --type {other} is not a LUKS type (luks, luks1, luks2)"
            )));
        }
    };
    let mut dev = open_header(ctx, &a.device, &a.header, false)?;
    match cryptblk_format::load_header_with_requirements(&mut dev) {
        Ok(h) if want.is_some_and(|v| v != h.version()) => Err(CliError::usage(if ctx.verbose {
            format!(
                "Device {} is not a valid LUKS{} device.",
                a.device.display(),
                want.unwrap_or_default()
            )
        } else {
            String::new()
        })),
        Ok(h) => {
            if ctx.verbose {
                eprintln!("{} is a LUKS{} device.", a.device.display(), h.version());
            }
            Ok(())
        }
        Err(e) => Err(CliError::usage(if ctx.verbose {
            format!(
                "Device {} is not a valid LUKS device: {e}",
                a.device.display()
            )
        } else {
            String::new()
        })),
    }
}

/// Largest header a backup takes: LUKS2's largest metadata (2 x 4 MiB) plus its largest
/// keyslots area (128 MiB), which also bounds every LUKS1 layout cryptsetup makes.
const MAX_HEADER_BACKUP: u64 = (8 << 20) + (128 << 20);

pub(crate) fn header_backup(ctx: &Ctx, a: BackupArgs) -> CliResult<()> {
    let mut dev = open_header(ctx, &a.device, &a.header, false)?;
    let hpath = header_path(&a.device, &a.header).to_path_buf();
    let hdr = load(&mut dev, &hpath)?;
    // The header says how large it is; a hostile one may claim terabytes. It cannot be
    // larger than the device it sits on, nor than any header cryptsetup writes.
    let size = hdr.header_size();
    let have = Storage::size(&dev).map_err(|e| io_err(&hpath, e))?;
    if size > have || size > MAX_HEADER_BACKUP {
        return Err(CliError::usage(format!(
            "{}: the header claims {size} bytes of header and keyslots, more than {}; refusing to back it up",
            hpath.display(),
            if size > have {
                format!("the device's {have} bytes")
            } else {
                format!("any valid header ({MAX_HEADER_BACKUP} bytes)")
            }
        )));
    }
    let mut buf = vec![0u8; size as usize];
    dev.read_at(&mut buf, 0).map_err(|e| io_err(&hpath, e))?;
    // Keyslots allow an offline attack on the passphrase: owner-read-only, as cryptsetup
    // writes it, whatever the umask; never through a link.
    let mut out = {
        use std::os::unix::fs::OpenOptionsExt;
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&a.header_backup_file)
            .map_err(|e| io_err(&a.header_backup_file, e))?
    };
    {
        use std::os::unix::fs::PermissionsExt;
        out.set_permissions(std::fs::Permissions::from_mode(0o400))
            .map_err(|e| io_err(&a.header_backup_file, e))?;
    }
    std::io::Write::write_all(&mut out, &buf)
        .and_then(|_| out.sync_all())
        .map_err(|e| io_err(&a.header_backup_file, e))?;
    Ok(())
}

pub(crate) fn header_restore(ctx: &Ctx, a: BackupArgs) -> CliResult<()> {
    let backup =
        std::fs::read(&a.header_backup_file).map_err(|e| io_err(&a.header_backup_file, e))?;
    let mut mem = MemStorage::from_vec(backup);
    let from_backup = load_header(&mut mem).map_err(|e| {
        CliError::usage(format!(
            "{} is not a valid LUKS header backup: {e}",
            a.header_backup_file.display()
        ))
    })?;
    let hpath = header_path(&a.device, &a.header).to_path_buf();
    let mut dev = open_header(ctx, &a.device, &a.header, true)?;
    let size = Storage::size(&dev).map_err(|e| io_err(&hpath, e))?;
    if size < from_backup.header_size() {
        return Err(CliError::new(
            EXIT_NO_DEVICE,
            format!("{} is smaller than the header backup", hpath.display()),
        ));
    }
    // cryptsetup's checks against a header of the same version already on the device
    // (another version, or none, is replaced after the confirmation): LUKS1, the same
    // data offset and key size; LUKS2 not mid-reencryption, the same data offset and
    // header-with-keyslot-areas size.
    // (A header with unknown requirements on the device may be restored over, as in
    // cryptsetup; a backup with them is refused above.)
    if let Ok(current) = cryptblk_format::load_header_with_requirements(&mut dev)
        && current.version() == from_backup.version()
    {
        let refused = match current.version() {
            1 if current.data_offset() != from_backup.data_offset()
                || current.key_len() != from_backup.key_len() =>
            {
                Some("Data offset or key size differs on device and backup, restore failed.")
            }
            2 if !current.in_reencryption()
                && current.data_offset() != from_backup.data_offset() =>
            {
                Some("Data offset differ on device and backup, restore failed.")
            }
            2 if !current.in_reencryption()
                && current.header_size() != from_backup.header_size() =>
            {
                Some(
                    "Binary header with keyslot areas size differ on device and backup, \
                     restore failed.",
                )
            }
            _ => None,
        };
        if let Some(why) = refused {
            return Err(CliError::usage(why));
        }
        if current.uuid() != from_backup.uuid() {
            eprintln!(
                "WARNING: real device header has different UUID than backup! (backup {}, \
                 device {})",
                from_backup.uuid(),
                current.uuid()
            );
        }
        if current.in_reencryption() {
            eprintln!(
                "WARNING: Unfinished offline reencryption detected on the device!\n\
                 Replacing header with backup may corrupt data."
            );
        }
    }
    confirm(
        ctx.batch,
        &format!(
            "Device {} will be overwritten with the header from {}.",
            hpath.display(),
            a.header_backup_file.display()
        ),
    )?;
    let n = from_backup.header_size() as usize;
    dev.write_at(&mem.to_vec()[..n], 0)
        .and_then(|_| dev.sync())
        .map_err(|e| io_err(&hpath, e))?;
    Ok(())
}

/// `repair`, as cryptsetup's: LUKS1, the keyslot checks and repairs of its loader; LUKS2,
/// both header copies rewritten when one is damaged or stale, then the reencryption
/// metadata: a step cut off is recovered, a job between steps has its metadata verified
/// (both need the passphrase). A header with nothing wrong is left as it is.
pub(crate) fn repair(ctx: &Ctx, a: RepairArgs) -> CliResult<()> {
    let hpath = header_path(&a.device, &a.header).to_path_buf();
    let mut dev = open_header(ctx, &a.device, &a.header, true)?;
    let mut magic = [0u8; 8];
    dev.read_at(&mut magic, 0).map_err(|e| io_err(&hpath, e))?;
    if magic[..6] == *cryptblk_format::luks1::MAGIC && magic[6..8] == [0, 1] {
        confirm(ctx.batch, "Really try to repair LUKS device header?")?;
        let r = cryptblk_format::luks1::repair(&mut dev)?;
        for m in &r.messages {
            eprintln!("{m}");
        }
        return Ok(());
    }
    let mut hdr = Luks2Header::read_for_repair(&mut dev).map_err(|e| match e {
        cryptblk_format::Error::NotLuks => CliError::usage(format!(
            "Device {} is not a valid LUKS device.",
            hpath.display()
        )),
        e => e.into(),
    })?;
    if hdr.copy_status().both_valid() && hdr.copies_in_sync() {
        if ctx.verbose {
            eprintln!("No known problems detected for LUKS header.");
        }
    } else {
        confirm(ctx.batch, "Really try to repair LUKS device header?")?;
        hdr.repair(&mut dev)?;
        eprintln!("LUKS2 header repaired: both copies rewritten from the valid one.");
    }
    // As cryptsetup: the copies are made whole, but then the reencryption state of a
    // header with requirements it does not know cannot be told, and that is an error.
    if let Some(unknown) = hdr.unmet_requirements() {
        return Err(CliError::usage(format!(
            "Cannot check the reencryption state of {}: unknown mandatory requirements [{}].",
            hpath.display(),
            unknown.join(", ")
        )));
    }
    if !hdr.in_reencryption() {
        return Ok(());
    }
    let crashed = hdr.interrupted_step();
    if crashed {
        confirm(
            ctx.batch,
            "Really proceed with LUKS2 reencryption recovery?",
        )?;
    }
    let prompt = if crashed {
        "Enter passphrase for reencryption recovery: "
    } else {
        "Enter passphrase to verify reencryption metadata digest: "
    };
    let pass = get_passphrase(&a.key.source(), prompt, false)?;
    // The data: the same open file when the header is attached, else the device.
    let data = if a.header.header.is_some() {
        open_header(ctx, &a.device, &HeaderArgs::default(), true)?
    } else {
        dev.clone()
    };
    let size = Storage::size(&data).map_err(|e| io_err(&a.device, e))?;
    let wrong = |e| match e {
        cryptblk_format::Error::WrongPassphrase => {
            CliError::new(EXIT_PERMISSION, "No key available with this passphrase.")
        }
        e => e.into(),
    };
    if crashed {
        hdr.recover_interrupted_step(&mut dev, &data, &pass, a.key_slot, size)
            .map_err(wrong)?;
        eprintln!("Reencryption step recovered.");
    } else {
        hdr.unlock_segments(&mut dev, &pass, a.key_slot, size)
            .map_err(wrong)?;
        if ctx.verbose {
            eprintln!("Reencryption metadata verified.");
        }
    }
    Ok(())
}
