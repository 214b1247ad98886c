//! `format` (cryptsetup luksFormat): a new LUKS1 or LUKS2 header.

use super::{header_path, kdf_request, remote};
use crate::args::{HeaderArgs, KdfArgs, KeyArgs};
use crate::ctx::Ctx;
use crate::error::{CliError, CliResult, io_err};
use crate::passphrase::{confirm, get_passphrase, read_key_file};
use clap::Args;
use cryptblk_crypto::{AeadSectorCipher, CipherSpec, HashAlg, SecretBytes};
use cryptblk_format::luks1::Luks1Header;
use cryptblk_format::luks2::Luks2Header;
use cryptblk_format::{FormatOptions, LuksHeader, SegmentIntegrity, Storage};
use cryptblk_volume::VolumeType;
use cryptblk_volume::{DataDevice, DeviceOpener};
use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args, Debug, Clone)]
pub(crate) struct FormatArgs {
    pub device: PathBuf,
    /// Key file holding the passphrase (cryptsetup's positional form of --key-file, which
    /// takes precedence).
    #[arg(value_name = "KEY_FILE")]
    pub positional_key_file: Option<PathBuf>,
    /// luks1 or luks2 (luks: LUKS2), or integrity: a standalone dm-integrity volume as
    /// integritysetup formats it (checksums, no encryption, no passphrase).
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
    /// Data offset in 512-byte sectors (a multiple of 8: 4096 bytes).
    #[arg(short = 'o', long, conflicts_with = "align_payload")]
    pub offset: Option<u64>,
    /// Put the data on a boundary of this many 512-byte sectors (with --header: the data
    /// offset itself), as cryptsetup's --align-payload.
    #[arg(long = "align-payload", value_name = "SECTORS")]
    pub align_payload: Option<u32>,
    /// Keyslot for the passphrase.
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
    /// Use this volume key (raw bytes) instead of a random one.
    #[arg(long = "volume-key-file", alias = "master-key-file")]
    pub volume_key_file: Option<PathBuf>,
    /// LUKS2 metadata area size (bytes: 16384 ... 4194304).
    #[arg(long = "luks2-metadata-size", value_parser = crate::units::parse_size)]
    pub luks2_metadata_size: Option<u64>,
    /// LUKS2 keyslots area size in bytes.
    #[arg(long = "luks2-keyslots-size", value_parser = crate::units::parse_size)]
    pub luks2_keyslots_size: Option<u64>,
    /// LUKS2 authenticated encryption over a dm-integrity layout: aead (with
    /// aes-gcm-random or aegis128-random), poly1305 (with chacha20-random), hmac-sha1,
    /// hmac-sha256 or hmac-sha512 (with aes-xts-plain64 or aes-xts-random). Written
    /// without the kernel. --type integrity: the checksum (crc32c, the default; crc32,
    /// sha1, sha256, sha512, hmac-sha1, hmac-sha256, hmac-sha512).
    #[arg(short = 'I', long)]
    pub integrity: Option<String>,
    /// With --integrity or --type integrity: do not write every sector's tag now (a
    /// sector never written then fails to read, as with cryptsetup's option of the same
    /// name and integritysetup's --no-wipe).
    #[arg(long = "integrity-no-wipe", alias = "no-wipe")]
    pub integrity_no_wipe: bool,
    /// --type integrity: bytes of tag per sector (default: the checksum's size; shorter
    /// cuts it, longer pads it with zeros).
    #[arg(long = "tag-size", value_name = "BYTES")]
    pub tag_size: Option<u16>,
    /// --type integrity: leave the salt out of the tags (integritysetup's option of the
    /// same name, for kernels before 5.11); by default a random salt is mixed in
    /// (`fix_hmac`), as integritysetup formats.
    #[arg(long = "integrity-legacy-hmac")]
    pub integrity_legacy_hmac: bool,
    #[command(flatten)]
    pub integrity_key: crate::args::IntegrityArgs,
}

pub(crate) fn format(ctx: &Ctx, mut a: FormatArgs) -> CliResult<()> {
    if let Some(k) = a.positional_key_file.take() {
        if a.key.key_files.is_empty() {
            a.key.key_files.push(k);
        } else {
            eprintln!("Option --key-file takes precedence over specified key file argument.");
        }
    }
    if a.offset.is_some_and(|o| !o.is_multiple_of(8)) {
        return Err(CliError::usage(
            "Data offset is not multiple of 4096 bytes.",
        ));
    }
    let luks1 = match a.kind {
        VolumeType::Luks1 => true,
        VolumeType::Luks2 | VolumeType::Luks => false,
        VolumeType::Integrity => return format_standalone_integrity(ctx, &a),
        other => {
            return Err(CliError::usage(format!(
                "unsupported --type {other} (luks1, luks2, integrity)"
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
                    // cryptsetup's LUKS1 layout: the payload on the MiB after the keyslots.
                    luks1_areas_end(opts.key_len).next_multiple_of(1 << 20)
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
    // cryptsetup's choice: the device's physical sector size for a block device (512 on
    // most loop devices and disks, 4096 on 4Kn ones), 4096 for an image file; either only
    // where the data area is a whole number of them.
    let preferred = match std::fs::File::open(&a.device) {
        Ok(f)
            if f.metadata()
                .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type())) =>
        {
            rustix::fs::ioctl_blkpbszget(&f)
                .ok()
                .filter(|&n| n.is_power_of_two() && (512..=4096).contains(&n))
                .unwrap_or(512)
        }
        _ => 4096,
    };
    if a.sector_size.is_none()
        && !luks1
        && preferred > 512
        && data_size.is_multiple_of(u64::from(preferred))
        && opts
            .data_offset
            .is_none_or(|o| o.is_multiple_of(u64::from(preferred)))
    {
        opts.sector_size = preferred;
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
    // An image file grows to hold the header (cryptsetup's way); a block device or a
    // remote store too small for it is refused before anything is written.
    let hpath = header_path(&a.device, &a.header);
    if !std::fs::metadata(hpath).is_ok_and(|m| m.file_type().is_file()) {
        let need = if luks1 {
            // The header and its eight keyslots; attached, the data offset too.
            let areas = luks1_areas_end(opts.key_len);
            match (opts.detached_header, opts.data_offset) {
                (true, _) => areas,
                (false, Some(off)) => off.max(areas),
                (false, None) => areas.next_multiple_of(1 << 20),
            }
        } else {
            Luks2Header::header_end(&opts)?
        };
        let have = Storage::size(&dev).map_err(|e| io_err(hpath, e))?;
        if have < need {
            return Err(CliError::usage(format!(
                "Device {} is too small: the header needs {need} bytes, it has {have}.",
                hpath.display()
            )));
        }
    }
    let hdr: Box<dyn LuksHeader> = if luks1 {
        Box::new(Luks1Header::format(&mut dev, &opts, &volume_key, &pass)?)
    } else {
        Box::new(Luks2Header::format(&mut dev, &opts, &volume_key, &pass)?)
    };
    if let Some(i) = &opts.integrity {
        let data = if opts.detached_header {
            ctx.devices
                .open(&a.device, false)
                .map_err(|e| io_err(&a.device, e))?
        } else {
            dev
        };
        format_integrity(
            ctx,
            &a,
            &data,
            hdr.data_offset(),
            i,
            &volume_key,
            opts.sector_size,
        )?;
    }
    // As cryptsetup: a device with no room for data after the header is still formatted
    // (an image file grows to hold the header; a block device too short has failed the
    // header write already), with a warning: it cannot be opened until it grows.
    if !opts.detached_header && data_size <= hdr.data_offset() {
        eprintln!(
            "Device {} is too small for activation, there is no remaining space for data.",
            a.device.display()
        );
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

/// The dm-integrity device under a LUKS2 header with integrity: superblock, empty journal
/// and (without --integrity-no-wipe) every sector sealed, as cryptsetup has the kernel do.
fn format_integrity(
    ctx: &Ctx,
    a: &FormatArgs,
    data: &DataDevice,
    offset: u64,
    i: &SegmentIntegrity,
    volume_key: &[u8],
    sector_size: u32,
) -> CliResult<()> {
    let cipher = AeadSectorCipher::new(&i.encryption, &i.kind, volume_key, sector_size, 0)?;
    write_integrity(
        ctx,
        a,
        data,
        offset,
        Box::new(cipher),
        cryptblk_volume::JournalKeys::default(),
        None,
    )
}

/// A dm-integrity device at byte `offset` of `data` with `auth`'s tags (and `salt`, for
/// fix_hmac), every sector's tag written unless --integrity-no-wipe.
fn write_integrity(
    ctx: &Ctx,
    a: &FormatArgs,
    data: &DataDevice,
    offset: u64,
    auth: Box<dyn cryptblk_crypto::SectorTags>,
    journal: cryptblk_volume::JournalKeys,
    salt: Option<[u8; 16]>,
) -> CliResult<()> {
    let wipe = !a.integrity_no_wipe;
    let mut shown: Option<crate::progress::Progress> = None;
    let mut progress = |done: u64, total: u64| {
        shown
            .get_or_insert_with(|| crate::progress::Progress::new(ctx, "wipe", Some(total)))
            .set(done);
    };
    cryptblk_volume::Integrity::format_with(data, offset, auth, journal, salt, wipe, &mut progress)
        .map_err(|e| crate::unlock::volume_error(&a.device, e))?;
    if let Some(p) = shown {
        p.finish();
    }
    if !wipe {
        eprintln!(
            "Device {} was not wiped: a sector never written fails to read until it is.",
            a.device.display()
        );
    }
    Ok(())
}

/// `format --type integrity`: a standalone dm-integrity volume as `integritysetup format`
/// writes it on the 6.12 kernel (superblock version 5: fixed padding and a random salt in
/// every tag, unless --integrity-legacy-hmac), without the kernel.
fn format_standalone_integrity(ctx: &Ctx, a: &FormatArgs) -> CliResult<()> {
    let alg = a
        .integrity
        .as_deref()
        .unwrap_or(cryptblk_volume::DEFAULT_INTEGRITY_ALGORITHM);
    let tag_size = match a.tag_size {
        Some(t) => usize::from(t),
        None => cryptblk_crypto::IntegrityHash::digest_size_of(alg)?,
    };
    let block = a.sector_size.unwrap_or(512);
    let key = a.integrity_key.key(alg)?;
    let salt = if a.integrity_legacy_hmac {
        None
    } else {
        let r = SecretBytes::random(16)?;
        Some(<[u8; 16]>::try_from(&r[..]).expect("16 random bytes"))
    };
    let hash = cryptblk_crypto::IntegrityHash::new(alg, key.as_deref(), tag_size, block, salt)?;
    let data = ctx
        .devices
        .open(&a.device, false)
        .map_err(|e| io_err(&a.device, e))?;
    confirm(
        ctx.batch,
        &format!(
            "This will overwrite data on {} irrevocably.",
            a.device.display()
        ),
    )?;
    let journal = cryptblk_volume::IntegrityOptions {
        algorithm: None,
        journal_mac: a.integrity_key.journal_mac()?,
        journal_crypt: a.integrity_key.journal_crypt()?,
    }
    .journal_keys()
    .map_err(|e| crate::unlock::volume_error(&a.device, e))?;
    write_integrity(ctx, a, &data, 0, Box::new(hash), journal, salt)?;
    if ctx.verbose {
        eprintln!(
            "Formatted {} as a dm-integrity volume ({alg}, {tag_size}-byte tags, {block}-byte sectors)",
            a.device.display()
        );
    }
    Ok(())
}

/// `--integrity` as the LUKS2 header names it (`hmac-sha256` is `hmac(sha256)`), and the
/// bytes of MAC key it adds to the volume key.
fn integrity_kind(name: &str) -> CliResult<(String, usize)> {
    let kind = match name.strip_prefix("hmac-") {
        Some(h) => format!("hmac({h})"),
        None => name.to_string(),
    };
    let mac = match kind.as_str() {
        "aead" | "poly1305" => 0,
        "hmac(sha1)" => 20,
        "hmac(sha256)" => 32,
        "hmac(sha512)" => 64,
        _ => {
            return Err(CliError::usage(format!(
                "unsupported --integrity {name} (aead, poly1305, hmac-sha1, hmac-sha256, \
                 hmac-sha512)"
            )));
        }
    };
    Ok((kind, mac))
}

/// `--cipher CIPHER --integrity NAME [--key-size BITS]`: the integrity kind as the header
/// names it, and the volume key's length in bytes, as cryptsetup sizes it: `--key-size`
/// covers the cipher (default 256 bits, 512 for XTS, 128 for AEGIS-128) and the MAC key is
/// appended.
pub(crate) fn integrity_key(
    cipher: &str,
    name: &str,
    key_size: Option<usize>,
) -> CliResult<(String, usize)> {
    let (kind, mac) = integrity_kind(name)?;
    AeadSectorCipher::tag_size_of(cipher, &kind)
        .map_err(|e| CliError::usage(format!("--cipher {cipher} --integrity {name}: {e}")))?;
    let bits = match key_size {
        Some(b) if b % 8 != 0 => {
            return Err(CliError::usage("key size must be a multiple of 8 bits"));
        }
        Some(b) => b,
        None if cipher.contains("-xts-") => 512,
        // AEGIS-128 takes 128 bits only (cryptsetup needs --key-size 128 for it).
        None if cipher.starts_with("aegis128-") => 128,
        None => 256,
    };
    Ok((kind, bits / 8 + mac))
}

/// The format options the arguments ask for (the sector size may still change with the
/// device's size).
fn format_options(a: &FormatArgs, luks1: bool) -> CliResult<FormatOptions> {
    if let Some(name) = &a.integrity {
        if luks1 {
            return Err(CliError::usage("--integrity needs LUKS2"));
        }
        let (kind, key_len) = integrity_key(&a.cipher, name, a.key_size)?;
        let mut opts = format_options(
            &FormatArgs {
                cipher: "aes-xts-plain64".into(),
                key_size: None,
                integrity: None,
                ..a.clone()
            },
            false,
        )?;
        opts.cipher = CipherSpec::parse("cipher_null-ecb")?;
        opts.key_len = key_len;
        opts.integrity = Some(SegmentIntegrity {
            encryption: a.cipher.clone(),
            kind,
            journal_encryption: "none".into(),
            journal_integrity: "none".into(),
        });
        return Ok(opts);
    }
    let cipher = CipherSpec::parse(&a.cipher)?;
    let key_len = match a.key_size {
        Some(bits) if bits % 8 != 0 => {
            return Err(CliError::usage("key size must be a multiple of 8 bits"));
        }
        Some(bits) => bits / 8,
        // cryptsetup gives a LUKS volume with cipher_null a 256-bit volume key all the
        // same (a keyslot must hold something); the data path ignores it.
        None if cipher.cipher == cryptblk_crypto::BlockCipherAlg::Null => 32,
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
    if let Some(align) = a.align_payload.filter(|&n| n > 0) {
        opts.data_offset = Some(aligned_data_offset(&opts, luks1, u64::from(align) * 512));
    }
    opts.keyslot = a.key_slot;
    opts.luks2_metadata_size = a.luks2_metadata_size;
    opts.luks2_keyslots_size = a.luks2_keyslots_size;
    opts.keyslot_encryption = a.kdf.keyslot_encryption()?;
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

/// `--align-payload`: cryptsetup's layout with the data on an `align`-byte boundary. With
/// a detached header the alignment is the data offset itself; otherwise the header and
/// keyslot areas (at their default sizes) end rounded up to it.
fn aligned_data_offset(opts: &FormatOptions, luks1: bool, align: u64) -> u64 {
    if opts.detached_header {
        return align;
    }
    let areas_end = if luks1 {
        luks1_areas_end(opts.key_len)
    } else {
        let hdr = opts.luks2_metadata_size.unwrap_or(16 << 10);
        opts.luks2_keyslots_size.map_or(16 << 20, |k| 2 * hdr + k)
    };
    areas_end.next_multiple_of(align)
}

/// Where cryptsetup's LUKS1 layout ends: the 4 KiB header, then eight keyslots of 4000
/// stripes of a `key_len`-byte key, each 4 KiB-aligned.
fn luks1_areas_end(key_len: usize) -> u64 {
    4096 + 8 * (key_len as u64 * 4000).next_multiple_of(4096)
}
