//! LUKS header and keyslot commands, in cryptsetup's words.

use crate::ctx::Ctx;
use crate::error::{CliError, CliResult, EXIT_NO_DEVICE, EXIT_PERMISSION, io_err};
use crate::passphrase::{KeySource, confirm, get_passphrase, read_key_file};
use crate::{HeaderArgs, KdfArgs, KeyArgs};
use clap::Args;
use cryptblk_crypto::{CipherSpec, HashAlg, KdfKind, KdfRequest, SecretBytes};
use cryptblk_format::luks1::Luks1Header;
use cryptblk_format::luks2::Luks2Header;
use cryptblk_format::{FormatOptions, LuksHeader, MemStorage, Storage, load_header};
use cryptblk_volume::DataDevice;
use cryptblk_volume::VolumeType;
use std::fs::{File, OpenOptions};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct DeviceArgs {
    /// Image file or block device.
    pub device: PathBuf,
    #[command(flatten)]
    pub header: HeaderArgs,
}

#[derive(Args, Debug)]
pub struct FormatArgs {
    pub device: PathBuf,
    /// luks1 or luks2 (luks: LUKS2).
    #[arg(long = "type", value_enum, default_value_t = VolumeType::Luks2)]
    pub kind: VolumeType,
    /// Cipher specification, e.g. aes-xts-plain64, aes-cbc-essiv:sha256.
    #[arg(short = 'c', long, default_value = "aes-xts-plain64")]
    pub cipher: String,
    /// Volume key size in bits (default: 512 for XTS, 256 otherwise).
    #[arg(short = 's', long = "key-size")]
    pub key_size: Option<usize>,
    /// Encryption sector size in bytes (LUKS2: 512-4096). Default: 512 for LUKS1; for
    /// LUKS2 4096 when the data area allows it (as cryptsetup picks for image files), else 512.
    #[arg(long = "sector-size")]
    pub sector_size: Option<u32>,
    #[command(flatten)]
    pub kdf: KdfArgs,
    #[command(flatten)]
    pub header: HeaderArgs,
    #[command(flatten)]
    pub key: KeyArgs,
    /// LUKS2 label.
    #[arg(long)]
    pub label: Option<String>,
    /// LUKS2 subsystem.
    #[arg(long)]
    pub subsystem: Option<String>,
    /// Volume UUID instead of a random one.
    #[arg(long)]
    pub uuid: Option<String>,
    /// Data offset in 512-byte sectors.
    #[arg(long)]
    pub offset: Option<u64>,
    /// Keyslot for the passphrase.
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
    /// Use this volume key (raw bytes) instead of a random one.
    #[arg(long = "volume-key-file", alias = "master-key-file")]
    pub volume_key_file: Option<PathBuf>,
    /// LUKS2 metadata area size (bytes: 16384 ... 4194304).
    #[arg(long = "luks2-metadata-size")]
    pub luks2_metadata_size: Option<u64>,
    /// LUKS2 keyslots area size in bytes.
    #[arg(long = "luks2-keyslots-size")]
    pub luks2_keyslots_size: Option<u64>,
}

#[derive(Args, Debug)]
pub struct DumpArgs {
    pub device: PathBuf,
    #[command(flatten)]
    pub header: HeaderArgs,
    /// Print the metadata as JSON (LUKS2: the header's own JSON area).
    #[arg(long)]
    pub json: bool,
    /// Also print the volume key (asks for a passphrase).
    #[arg(long = "dump-volume-key", alias = "dump-master-key")]
    pub dump_volume_key: bool,
    /// LUKS2: print the header's JSON metadata as cryptsetup does.
    #[arg(long = "dump-json-metadata")]
    pub dump_json_metadata: bool,
    #[command(flatten)]
    pub key: KeyArgs,
    #[command(flatten)]
    pub select: TypeSelect,
}

#[derive(Args, Debug)]
pub struct AddKeyArgs {
    pub device: PathBuf,
    /// File holding the new passphrase (else asked, or the next line of stdin).
    pub new_key_file: Option<PathBuf>,
    #[command(flatten)]
    pub header: HeaderArgs,
    /// Existing passphrase source.
    #[command(flatten)]
    pub key: KeyArgs,
    /// Bytes of the new key file to use.
    #[arg(long = "new-keyfile-size")]
    pub new_keyfile_size: Option<usize>,
    #[arg(long = "new-keyfile-offset", default_value_t = 0)]
    pub new_keyfile_offset: u64,
    /// Keyslot for the new passphrase.
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
    #[command(flatten)]
    pub kdf: KdfArgs,
}

#[derive(Args, Debug)]
pub struct RemoveKeyArgs {
    pub device: PathBuf,
    /// File holding the passphrase to remove.
    pub remove_key_file: Option<PathBuf>,
    #[command(flatten)]
    pub header: HeaderArgs,
    #[command(flatten)]
    pub key: KeyArgs,
}

#[derive(Args, Debug)]
pub struct ConvertKeyArgs {
    pub device: PathBuf,
    #[command(flatten)]
    pub header: HeaderArgs,
    #[command(flatten)]
    pub key: KeyArgs,
    /// The keyslot to convert (kept in place); else the one the passphrase opens, moved
    /// to the first free slot as cryptsetup does.
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
    #[command(flatten)]
    pub kdf: KdfArgs,
}

#[derive(Args, Debug)]
pub struct KillSlotArgs {
    pub device: PathBuf,
    pub slot: u32,
    #[command(flatten)]
    pub header: HeaderArgs,
    /// A remaining passphrase (required unless --batch-mode).
    #[command(flatten)]
    pub key: KeyArgs,
}

#[derive(Args, Debug)]
pub struct TestArgs {
    pub device: PathBuf,
    #[command(flatten)]
    pub header: HeaderArgs,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Only try this keyslot.
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
    #[command(flatten)]
    pub select: TypeSelect,
}

#[derive(Args, Debug)]
pub struct RepairArgs {
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
pub struct BackupArgs {
    pub device: PathBuf,
    #[arg(long = "header-backup-file")]
    pub header_backup_file: PathBuf,
    #[command(flatten)]
    pub header: HeaderArgs,
}

impl KeyArgs {
    /// The key file, for everything but TCRYPT (which takes several keyfiles).
    pub fn key_file(&self) -> Option<&PathBuf> {
        self.key_files.first()
    }

    /// Where the passphrase or key comes from, as the arguments say.
    pub fn source(&self) -> KeySource {
        KeySource {
            key_file: self.key_file().cloned(),
            extra_key_files: self.key_files.len().saturating_sub(1),
            keyfile_size: self.keyfile_size,
            keyfile_offset: self.keyfile_offset,
        }
    }
}

/// The file holding the header: `--header` if given, else the device.
pub(crate) fn header_path<'a>(device: &'a Path, h: &'a HeaderArgs) -> &'a Path {
    h.header.as_deref().unwrap_or(device)
}

/// Opens the header device; writers take an exclusive lock so two cryptblk (or a
/// cryptblk and a running `open`) never change metadata at once.
pub fn open_header(ctx: &Ctx, device: &Path, h: &HeaderArgs, write: bool) -> CliResult<DataDevice> {
    let path = header_path(device, h);
    if let Some(r) = remote(ctx, path, !write)? {
        return Ok(r);
    }
    let f = OpenOptions::new()
        .read(true)
        .write(write)
        .open(path)
        .map_err(|e| io_err(path, e))?;
    if write {
        f.try_lock().map_err(|_| {
            CliError::new(
                crate::error::EXIT_BUSY,
                format!("{} is in use (locked by another process)", path.display()),
            )
        })?;
    }
    Ok(DataDevice::File(Arc::new(f)))
}

/// The remote export `path` names (`nbd://...`), connected read-only or read-write; `None`
/// for a local path.
pub fn remote(ctx: &Ctx, path: &Path, read_only: bool) -> CliResult<Option<DataDevice>> {
    ctx.devices
        .open_remote(path, read_only)
        .map_err(|e| crate::unlock::volume_error(path, cryptblk_volume::Error::Io(e)))
}

pub fn load(dev: &mut dyn Storage, path: &Path) -> CliResult<Box<dyn LuksHeader>> {
    load_header(dev).map_err(|e| match e {
        cryptblk_format::Error::NotLuks => CliError::usage(format!(
            "Device {} is not a valid LUKS device.",
            path.display()
        )),
        e => CliError::from(e),
    })
}

pub fn kdf_request(args: &KdfArgs, luks1: bool) -> CliResult<KdfRequest> {
    let mut r = if luks1 {
        KdfRequest::luks1_default()
    } else {
        KdfRequest::luks2_default()
    };
    if let Some(p) = &args.pbkdf {
        r.kind = KdfKind::from_name(p)?;
    }
    if luks1 && r.kind != KdfKind::Pbkdf2 {
        return Err(CliError::usage("LUKS1 supports only the pbkdf2 PBKDF"));
    }
    if let Some(h) = &args.hash {
        r.hash = HashAlg::from_name(h)?;
    }
    if let Some(t) = args.iter_time {
        r.iter_time_ms = t;
    }
    r.forced_iterations = args.pbkdf_force_iterations;
    if let Some(m) = args.pbkdf_memory {
        r.memory_kib = m;
    }
    if let Some(p) = args.pbkdf_parallel {
        r.parallel = p;
    }
    Ok(r)
}

pub fn format(ctx: &Ctx, a: FormatArgs) -> CliResult<()> {
    let luks1 = match a.kind {
        VolumeType::Luks1 => true,
        VolumeType::Luks2 | VolumeType::Luks => false,
        other => {
            return Err(CliError::usage(format!(
                "unsupported --type {other} (luks1, luks2)"
            )));
        }
    };
    let mut opts = format_options(&a, luks1)?;
    // Check the data device exists before asking anything.
    let data_size = match remote(ctx, &a.device, true)? {
        Some(r) => {
            // On an RBD image the data starts on an object boundary, as librbd's own
            // encryption formats it (the default offset rounded up to the object size).
            if let Some(obj) = r
                .alignment()
                .filter(|_| a.offset.is_none() && a.header.header.is_none())
            {
                let default = if luks1 {
                    // cryptsetup's LUKS1 layout: eight 4000-stripe keyslots after the
                    // 4 KiB header, the payload on the next MiB.
                    let slot = (opts.key_len as u64 * 4000)
                        .div_ceil(512)
                        .next_multiple_of(8);
                    (8 + 8 * slot).next_multiple_of(2048) * 512
                } else {
                    16 << 20
                };
                let aligned = u64::max(default, obj).next_multiple_of(obj);
                if aligned != default {
                    opts.data_offset = Some(aligned);
                }
            }
            r.size().map_err(|e| io_err(&a.device, e))?
        }
        None => {
            let f = File::open(&a.device).map_err(|e| io_err(&a.device, e))?;
            Storage::size(&f).map_err(|e| io_err(&a.device, e))?
        }
    };
    if a.sector_size.is_none()
        && !luks1
        && data_size.is_multiple_of(4096)
        && a.offset.is_none_or(|o| o.is_multiple_of(8))
    {
        opts.sector_size = 4096;
    }
    confirm(
        ctx.batch,
        &format!(
            "This will overwrite data on {} irrevocably.",
            header_path(&a.device, &a.header).display()
        ),
    )?;
    let volume_key = match &a.volume_key_file {
        Some(p) => {
            let k = read_key_file(p, 0, Some(opts.key_len))?;
            SecretBytes::from_slice(&k)
        }
        None => SecretBytes::random(opts.key_len)?,
    };
    let pass = get_passphrase(
        &a.key.source(),
        &format!("Enter passphrase for {}: ", a.device.display()),
        true,
    )?;

    let mut dev = open_header_for_format(ctx, &a)?;
    let hdr: Box<dyn LuksHeader> = if luks1 {
        Box::new(Luks1Header::format(&mut dev, &opts, &volume_key, &pass)?)
    } else {
        Box::new(Luks2Header::format(&mut dev, &opts, &volume_key, &pass)?)
    };
    // cryptsetup refuses devices that cannot hold any data after the header.
    if !opts.detached_header && data_size <= hdr.data_offset() {
        return Err(CliError::usage(format!(
            "Device {} is too small: the data segment would start at byte {} of {data_size}.",
            a.device.display(),
            hdr.data_offset()
        )));
    }
    if ctx.verbose {
        eprintln!(
            "Formatted {} as LUKS{} ({}), UUID {}",
            a.device.display(),
            hdr.version(),
            hdr.cipher(),
            hdr.uuid()
        );
    }
    Ok(())
}

/// The format options the arguments ask for (the sector size may still change with the
/// device's size).
fn format_options(a: &FormatArgs, luks1: bool) -> CliResult<FormatOptions> {
    let cipher = CipherSpec::parse(&a.cipher)?;
    let key_len = match a.key_size {
        Some(bits) if bits % 8 != 0 => {
            return Err(CliError::usage("key size must be a multiple of 8 bits"));
        }
        Some(bits) => bits / 8,
        None => cipher.default_key_len(),
    };
    if !cipher.valid_key_len(key_len) {
        return Err(CliError::usage(format!(
            "key size {} bits is not valid for {cipher}",
            key_len * 8
        )));
    }
    let mut opts = FormatOptions::new(kdf_request(&a.kdf, luks1)?);
    opts.cipher = cipher;
    opts.key_len = key_len;
    opts.sector_size = a.sector_size.unwrap_or(512);
    if let Some(h) = &a.kdf.hash {
        opts.hash = HashAlg::from_name(h)?;
    }
    opts.uuid = a.uuid.clone();
    opts.label = a.label.clone();
    opts.subsystem = a.subsystem.clone();
    opts.data_offset = a.offset.map(|s| s * 512);
    opts.detached_header = a.header.header.is_some();
    opts.keyslot = a.key_slot;
    opts.luks2_metadata_size = a.luks2_metadata_size;
    opts.luks2_keyslots_size = a.luks2_keyslots_size;
    Ok(opts)
}

/// Opens (a detached header: creates, 0600: its keyslots would let another user attack the
/// passphrase offline) where the header goes, locked against a concurrent format or open
/// of the same file.
fn open_header_for_format(ctx: &Ctx, a: &FormatArgs) -> CliResult<DataDevice> {
    use std::os::unix::fs::OpenOptionsExt;
    let hpath = header_path(&a.device, &a.header);
    if let Some(r) = remote(ctx, hpath, false)? {
        return Ok(r);
    }
    let dev = if a.header.header.is_some() {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(hpath)
    } else {
        OpenOptions::new().read(true).write(true).open(hpath)
    }
    .map_err(|e| io_err(hpath, e))?;
    dev.try_lock().map_err(|_| {
        CliError::new(
            crate::error::EXIT_BUSY,
            format!("{} is in use", hpath.display()),
        )
    })?;
    Ok(DataDevice::File(Arc::new(dev)))
}

/// Unlocks with a passphrase from `src`, mapping a failure to cryptsetup's message.
fn unlock(
    hdr: &dyn LuksHeader,
    dev: &mut dyn Storage,
    src: &KeySource,
    prompt: &str,
    slot: Option<u32>,
) -> CliResult<(u32, SecretBytes)> {
    let pass = get_passphrase(src, prompt, false)?;
    hdr.unlock(dev, &pass, slot).map_err(|e| match e {
        cryptblk_format::Error::WrongPassphrase => {
            CliError::new(EXIT_PERMISSION, "No key available with this passphrase.")
        }
        e => e.into(),
    })
}

fn new_passphrase_source(a: &AddKeyArgs) -> KeySource {
    KeySource {
        key_file: a.new_key_file.clone(),
        extra_key_files: 0,
        keyfile_size: a.new_keyfile_size,
        keyfile_offset: a.new_keyfile_offset,
    }
}

pub fn add_key(ctx: &Ctx, a: AddKeyArgs) -> CliResult<()> {
    let mut dev = open_header(ctx, &a.device, &a.header, true)?;
    let mut hdr = load(&mut dev, header_path(&a.device, &a.header))?;
    let (_, vk) = unlock(
        &*hdr,
        &mut dev,
        &a.key.source(),
        "Enter any existing passphrase: ",
        None,
    )?;
    let new = get_passphrase(
        &new_passphrase_source(&a),
        "Enter new passphrase for key slot: ",
        true,
    )?;
    let kdf = kdf_request(&a.kdf, hdr.version() == 1)?;
    let slot = hdr.add_keyslot(&mut dev, &vk, &new, a.key_slot, &kdf)?;
    eprintln!("Key slot {slot} created.");
    Ok(())
}

pub fn change_key(ctx: &Ctx, a: AddKeyArgs) -> CliResult<()> {
    let mut dev = open_header(ctx, &a.device, &a.header, true)?;
    let mut hdr = load(&mut dev, header_path(&a.device, &a.header))?;
    let (old_slot, vk) = unlock(
        &*hdr,
        &mut dev,
        &a.key.source(),
        "Enter passphrase to be changed: ",
        a.key_slot,
    )?;
    let new = get_passphrase(&new_passphrase_source(&a), "Enter new passphrase: ", true)?;
    let kdf = kdf_request(&a.kdf, hdr.version() == 1)?;
    // Each format does it as crash-safely as its layout allows (see `replace_keyslot`).
    let slot = hdr.replace_keyslot(&mut dev, old_slot, &vk, &new, None, &kdf)?;
    eprintln!("Key slot {old_slot} changed (new passphrase in key slot {slot}).");
    Ok(())
}

pub fn convert_key(ctx: &Ctx, a: ConvertKeyArgs) -> CliResult<()> {
    let path = header_path(&a.device, &a.header);
    let mut dev = open_header(ctx, &a.device, &a.header, true)?;
    if load_header(&mut dev).map(|h| h.version()).ok() != Some(2) {
        return Err(CliError::usage(format!(
            "Device {} is not a valid LUKS2 device.",
            path.display()
        )));
    }
    let mut hdr = cryptblk_format::luks2::Luks2Header::read(&mut dev)?;
    if let Some(s) = a.key_slot
        && !hdr.keyslots().iter().any(|k| k.active && k.id == s)
    {
        return Err(CliError::usage(format!("Keyslot {s} is not active.")));
    }
    let kdf = kdf_request(&a.kdf, false)?;
    let pass = get_passphrase(
        &a.key.source(),
        "Enter passphrase for keyslot to be converted: ",
        false,
    )?;
    let slot = hdr
        .change_keyslot(&mut dev, &pass, &pass, a.key_slot, a.key_slot, &kdf)
        .map_err(|e| match e {
            cryptblk_format::Error::WrongPassphrase => {
                CliError::new(EXIT_PERMISSION, "No key available with this passphrase.")
            }
            e => e.into(),
        })?;
    if ctx.verbose {
        eprintln!("Key slot {slot} created.");
    }
    Ok(())
}

pub fn remove_key(ctx: &Ctx, a: RemoveKeyArgs) -> CliResult<()> {
    let mut dev = open_header(ctx, &a.device, &a.header, true)?;
    let mut hdr = load(&mut dev, header_path(&a.device, &a.header))?;
    let src = match &a.remove_key_file {
        Some(p) => KeySource {
            key_file: Some(p.clone()),
            extra_key_files: 0,
            ..Default::default()
        },
        None => a.key.source(),
    };
    let (slot, _vk) = unlock(
        &*hdr,
        &mut dev,
        &src,
        "Enter passphrase to be deleted: ",
        None,
    )?;
    if hdr.keyslots().iter().filter(|k| k.active).count() == 1 {
        confirm(
            ctx.batch,
            "This is the last keyslot. Device will become unusable after purging this key.",
        )?;
    }
    hdr.kill_keyslot(&mut dev, slot)?;
    eprintln!("Key slot {slot} removed.");
    Ok(())
}

pub fn kill_slot(ctx: &Ctx, a: KillSlotArgs) -> CliResult<()> {
    let mut dev = open_header(ctx, &a.device, &a.header, true)?;
    let mut hdr = load(&mut dev, header_path(&a.device, &a.header))?;
    let active: Vec<u32> = hdr
        .keyslots()
        .iter()
        .filter(|k| k.active)
        .map(|k| k.id)
        .collect();
    if !active.contains(&a.slot) {
        return Err(CliError::usage(format!(
            "Keyslot {} is not active.",
            a.slot
        )));
    }
    // As cryptsetup: a passphrase is checked unless in batch mode with none supplied (no
    // key file, standard input a terminal); one that was supplied and is wrong refuses,
    // wrong or not batch. Only an empty standard input counts as none supplied.
    let src = a.key.source();
    let supplied = src.key_file.is_some() || !std::io::stdin().is_terminal();
    if !ctx.batch || supplied {
        let pass = match get_passphrase(&src, "Enter any remaining passphrase: ", false) {
            Ok(p) => Some(p),
            Err(_) if ctx.batch && src.key_file.is_none() => None,
            Err(e) => return Err(e),
        };
        if let Some(pass) = pass {
            verify_remaining(&*hdr, &mut dev, &pass, a.slot, &active)?;
        }
    }
    if active.len() == 1 {
        confirm(
            ctx.batch,
            "This is the last keyslot. Device will become unusable after purging this key.",
        )?;
    }
    hdr.kill_keyslot(&mut dev, a.slot)?;
    eprintln!("Key slot {} wiped.", a.slot);
    Ok(())
}

/// cryptsetup's check before a keyslot is wiped: the passphrase opens a keyslot that stays
/// (or the slot itself when it is the last one), so nobody wipes a slot without a way in
/// that remains.
fn verify_remaining(
    hdr: &dyn LuksHeader,
    dev: &mut dyn Storage,
    pass: &[u8],
    slot: u32,
    active: &[u32],
) -> CliResult<()> {
    let candidates: Vec<u32> = if active == [slot] {
        vec![slot]
    } else {
        active.iter().copied().filter(|&s| s != slot).collect()
    };
    for s in candidates {
        match hdr.unlock(dev, pass, Some(s)) {
            Ok(_) => return Ok(()),
            Err(cryptblk_format::Error::WrongPassphrase) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(CliError::new(
        EXIT_PERMISSION,
        format!("No key available with this passphrase. Keyslot {slot} was NOT wiped."),
    ))
}

/// `--type` and the TCRYPT search options of `test-passphrase` and `dump`.
#[derive(Args, Debug, Clone, Default)]
pub struct TypeSelect {
    /// luks (detected), tcrypt (TrueCrypt/VeraCrypt; cryptsetup's tcryptDump/open
    /// --test-passphrase --type tcrypt), bitlk (BitLocker; bitlkDump) or fvault2
    /// (FileVault 2; fvault2Dump).
    #[arg(long = "type", value_enum)]
    pub kind: Option<VolumeType>,
    #[command(flatten)]
    pub tcrypt: crate::unlock::TcryptArgs,
    /// TCRYPT: only cipher chains whose name contains this.
    #[arg(short = 'c', long)]
    pub cipher: Option<String>,
    /// TCRYPT: only this KDF: a PBKDF2 hash, or argon2id (VeraCrypt 1.26.29+).
    #[arg(short = 'h', long)]
    pub hash: Option<String>,
}

impl TypeSelect {
    /// Whether `--type tcrypt` was given; any other type but LUKS, BITLK and FVAULT2 is
    /// refused.
    pub(crate) fn is_tcrypt(&self) -> CliResult<bool> {
        match self.kind {
            Some(VolumeType::Tcrypt) => Ok(true),
            None
            | Some(
                VolumeType::Luks
                | VolumeType::Luks1
                | VolumeType::Luks2
                | VolumeType::Bitlk
                | VolumeType::Fvault2,
            ) => Ok(false),
            Some(k) => Err(CliError::usage(format!(
                "unsupported --type {k} here (luks, tcrypt, bitlk, fvault2)"
            ))),
        }
    }

    /// Whether `--type fvault2` was given.
    pub(crate) fn is_fvault2(&self) -> bool {
        self.kind == Some(VolumeType::Fvault2)
    }

    /// Whether `--type bitlk` was given.
    pub(crate) fn is_bitlk(&self) -> bool {
        self.kind == Some(VolumeType::Bitlk)
    }

    /// The volume arguments of a TCRYPT `test-passphrase`/`dump`: read-only, the filters.
    pub(crate) fn tcrypt_args(
        &self,
        header: &HeaderArgs,
        key: &KeyArgs,
    ) -> crate::unlock::VolumeArgs {
        crate::unlock::VolumeArgs {
            header: header.clone(),
            key: key.clone(),
            kind: VolumeType::Tcrypt,
            tcrypt: self.tcrypt.clone(),
            cipher: self.cipher.clone(),
            hash: self.hash.clone(),
            read_only: true,
            ..Default::default()
        }
    }
}

pub fn test_passphrase(ctx: &Ctx, a: TestArgs) -> CliResult<()> {
    if a.select.is_bitlk() {
        crate::dump::bitlk_volume_key(ctx, &a.device, &a.key)?;
        return Ok(());
    }
    if a.select.is_fvault2() {
        crate::dump::fvault2_volume_key(ctx, &a.device, &a.key)?;
        return Ok(());
    }
    if a.select.is_tcrypt()? {
        crate::unlock::tcrypt_header(ctx, &a.device, &a.select.tcrypt_args(&a.header, &a.key))?;
        return Ok(());
    }
    let mut dev = open_header(ctx, &a.device, &a.header, false)?;
    let hdr = load(&mut dev, header_path(&a.device, &a.header))?;
    let (slot, _vk) = unlock(
        &*hdr,
        &mut dev,
        &a.key.source(),
        &format!("Enter passphrase for {}: ", a.device.display()),
        a.key_slot,
    )?;
    eprintln!("Key slot {slot} unlocked.");
    Ok(())
}

#[derive(Args, Debug)]
pub struct UuidArgs {
    /// Image file or block device.
    pub device: PathBuf,
    #[command(flatten)]
    pub header: HeaderArgs,
    /// Set this UUID (36 characters, hyphenated) instead of printing the current one.
    #[arg(long)]
    pub uuid: Option<String>,
}

pub fn uuid(ctx: &Ctx, a: UuidArgs) -> CliResult<()> {
    let mut dev = open_header(ctx, &a.device, &a.header, a.uuid.is_some())?;
    let mut hdr = load(&mut dev, header_path(&a.device, &a.header))?;
    match &a.uuid {
        None => println!("{}", hdr.uuid()),
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
pub struct ConfigArgs {
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
pub fn config(ctx: &Ctx, a: ConfigArgs) -> CliResult<()> {
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
    if let Some(l) = &a.label {
        hdr.set_label(&mut dev, Some(l))?;
    }
    if let Some(s) = &a.subsystem {
        hdr.set_subsystem(&mut dev, Some(s))?;
    }
    if let (Some(p), Some(slot)) = (priority, a.key_slot) {
        hdr.set_keyslot_priority(&mut dev, slot, p)?;
    }
    Ok(())
}

/// `cryptsetup erase`: wipes every keyslot, after which no passphrase opens the volume
/// (the data is unreadable for good: crypto-shredding).
#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// Image file or block device.
    pub device: PathBuf,
    #[command(flatten)]
    pub header: HeaderArgs,
    /// The version to convert to: luks1 or luks2.
    #[arg(long = "type", short = 'M', value_enum)]
    pub kind: VolumeType,
}

/// `convert --type luks1|luks2` (cryptsetup's checks and messages). The device is locked
/// exclusively: a volume being served is never converted behind its server's back.
pub fn convert(ctx: &Ctx, a: ConvertArgs) -> CliResult<()> {
    use cryptblk_format::luks1::Luks1Header;
    use cryptblk_format::luks2::Luks2Header;
    let to: u8 = match a.kind {
        VolumeType::Luks1 => 1,
        VolumeType::Luks2 => 2,
        _ => {
            return Err(CliError::usage(
                "Invalid LUKS type, only luks1 and luks2 are supported.",
            ));
        }
    };
    let path = header_path(&a.device, &a.header).to_path_buf();
    let mut dev = open_header(ctx, &a.device, &a.header, true)?;
    let from = load(&mut dev, &path)?.version();
    if from == to {
        return Err(CliError::usage(format!("Device is already LUKS{to} type.")));
    }
    confirm(
        ctx.batch,
        &format!(
            "This operation will convert {} to LUKS{to} format.",
            path.display()
        ),
    )?;
    if to == 2 {
        let v1 = Luks1Header::read(&mut dev)?;
        Luks2Header::convert_from_luks1(&mut dev, &v1)?;
    } else {
        let v2 = Luks2Header::read(&mut dev)?;
        v2.convert_to_luks1(&mut dev)?;
    }
    Ok(())
}

pub fn erase(ctx: &Ctx, a: DeviceArgs) -> CliResult<()> {
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

pub fn is_luks(ctx: &Ctx, a: DeviceArgs) -> CliResult<()> {
    let mut dev = open_header(ctx, &a.device, &a.header, false)?;
    match load_header(&mut dev) {
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

pub fn header_backup(ctx: &Ctx, a: BackupArgs) -> CliResult<()> {
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

pub fn header_restore(ctx: &Ctx, a: BackupArgs) -> CliResult<()> {
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
    if let Ok(current) = load_header(&mut dev)
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
pub fn repair(ctx: &Ctx, a: RepairArgs) -> CliResult<()> {
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
    let mut hdr = Luks2Header::read(&mut dev).map_err(|e| match e {
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
