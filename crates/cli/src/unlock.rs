//! Opening a volume for the data path: LUKS (passphrase → keyslot) or plain mode
//! (passphrase hashed, or raw key file), with cryptsetup's option names.

use crate::ctx::Ctx;
use crate::error::{CliError, CliResult, EXIT_BUSY, EXIT_PERMISSION, io_err};
use crate::passphrase::{get_passphrase, get_tcrypt_passphrase, read_key_file};
use crate::{HeaderArgs, KeyArgs};
use clap::Args;
use cryptblk_crypto::CipherSpec;
use cryptblk_crypto::SecretBytes;
use cryptblk_format::bitlk::BitlkHeader;
use cryptblk_format::plain::PlainParams;
use cryptblk_format::tcrypt::{TcryptHeader, TcryptOptions};
use cryptblk_volume::{
    OpenOptions, Unlock, UnlockedTcrypt, Volume, VolumeParams, open_plain_on, open_tcrypt,
    unlock_luks,
};
use std::path::Path;

/// Everything that says how to unlock and map a volume.
#[derive(Args, Debug, Clone, Default)]
pub struct VolumeArgs {
    #[command(flatten)]
    pub header: HeaderArgs,
    #[command(flatten)]
    pub key: KeyArgs,
    /// luks (LUKS1 or LUKS2, detected), plain, loopaes, tcrypt (TrueCrypt/VeraCrypt),
    /// bitlk (BitLocker) or fvault2 (FileVault 2).
    #[arg(long = "type", default_value = "luks")]
    pub kind: String,
    /// BitLocker, FileVault 2: open with the volume key in this file (as `dump
    /// --dump-volume-key` shows it, raw bytes) instead of a passphrase.
    #[arg(long = "volume-key-file", alias = "master-key-file")]
    pub volume_key_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub tcrypt: TcryptArgs,
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
    /// Open read-only.
    #[arg(short = 'r', long = "readonly", alias = "read-only")]
    pub read_only: bool,
    /// Pass discards (TRIM) down to the storage (reveals unused blocks; off by default).
    #[arg(long = "allow-discards")]
    pub allow_discards: bool,
    /// Plain mode: cipher specification.
    #[arg(short = 'c', long)]
    pub cipher: Option<String>,
    /// Plain mode: key size in bits.
    #[arg(short = 's', long = "key-size")]
    pub key_size: Option<usize>,
    /// Plain mode: passphrase hash (sha256, ripemd160, plain, sha256:LEN, ...); TCRYPT: only
    /// this header KDF (a PBKDF2 hash, or argon2id).
    #[arg(short = 'h', long)]
    pub hash: Option<String>,
    /// Plain mode: data start on the device, in 512-byte sectors.
    #[arg(short = 'o', long)]
    pub offset: Option<u64>,
    /// Plain mode: IV offset in 512-byte sectors.
    #[arg(short = 'p', long)]
    pub skip: Option<u64>,
    /// Plain mode: size in 512-byte sectors.
    #[arg(short = 'b', long)]
    pub size: Option<u64>,
    /// Plain mode: encryption sector size.
    #[arg(long = "sector-size")]
    pub sector_size: Option<u32>,
    /// Plain mode: IVs count encryption sectors, not 512-byte sectors.
    #[arg(long = "iv-large-sectors")]
    pub iv_large_sectors: bool,
    /// How the image is read and written: auto (mmap for an image on tmpfs/ramfs, psync
    /// otherwise), psync (pread/pwrite), io_uring or mmap (a shared mapping).
    #[arg(long = "io-engine", default_value = "auto")]
    pub io_engine: cryptblk_volume::IoEngine,
    /// Bypass the page cache (O_DIRECT) for the image.
    #[arg(long = "direct-io")]
    pub direct_io: bool,
}

impl VolumeArgs {
    fn file_io(&self) -> cryptblk_volume::FileIo {
        cryptblk_volume::FileIo {
            engine: self.io_engine,
            direct: self.direct_io,
        }
    }
}

/// TrueCrypt/VeraCrypt options (cryptsetup's names); `-c`/`-h` narrow the cipher chains
/// and header KDFs tried.
#[derive(Args, Debug, Clone, Default)]
pub struct TcryptArgs {
    /// TCRYPT: open the hidden volume.
    #[arg(long = "tcrypt-hidden")]
    pub hidden: bool,
    /// TCRYPT: a system-encrypted disk (header at sector 62).
    #[arg(long = "tcrypt-system")]
    pub system: bool,
    /// TCRYPT: use the backup header at the end of the device.
    #[arg(long = "tcrypt-backup")]
    pub backup: bool,
    /// TCRYPT: try VeraCrypt's formats too (the default; kept for cryptsetup's scripts).
    #[arg(long)]
    pub veracrypt: bool,
    /// TCRYPT: TrueCrypt formats only.
    #[arg(long = "disable-veracrypt", conflicts_with = "veracrypt")]
    pub disable_veracrypt: bool,
    /// TCRYPT: VeraCrypt's Personal Iterations Multiplier.
    #[arg(long = "veracrypt-pim")]
    pub pim: Option<u32>,
}

impl VolumeArgs {
    /// The TCRYPT options with the keyfiles read (`--key-file`, each at most 1 MiB used).
    pub fn tcrypt_options(&self) -> CliResult<TcryptOptions> {
        let t = &self.tcrypt;
        if (t.hidden || t.system || t.backup || t.pim.is_some() || t.disable_veracrypt)
            && self.kind != "tcrypt"
        {
            return Err(CliError::usage(
                "Options --tcrypt-hidden, --tcrypt-system, --tcrypt-backup, --veracrypt-pim and --disable-veracrypt are supported only for TCRYPT devices.",
            ));
        }
        if t.hidden && t.system {
            return Err(CliError::usage(
                "--tcrypt-hidden and --tcrypt-system cannot be combined.",
            ));
        }
        if t.hidden && self.allow_discards {
            return Err(CliError::usage(
                "Option --tcrypt-hidden cannot be combined with --allow-discards.",
            ));
        }
        let keyfiles = self
            .key
            .key_files
            .iter()
            .map(|f| read_key_file(f, 0, None).map(trim_keyfile))
            .collect::<CliResult<Vec<_>>>()?;
        Ok(TcryptOptions {
            hidden: t.hidden,
            system: t.system,
            backup: t.backup,
            no_veracrypt: t.disable_veracrypt,
            pim: t.pim,
            kdf: self
                .hash
                .as_deref()
                .map(cryptblk_format::tcrypt::TcryptKdf::from_name)
                .transpose()?,
            cipher: self.cipher.clone(),
            keyfiles,
            partition_start: None,
        })
    }
}

/// A keyfile's first MiB (all TrueCrypt reads).
fn trim_keyfile(k: cryptblk_crypto::SecretBytes) -> cryptblk_crypto::SecretBytes {
    if k.len() > cryptblk_format::tcrypt::KEYFILE_MAX {
        cryptblk_crypto::SecretBytes::from_slice(&k[..cryptblk_format::tcrypt::KEYFILE_MAX])
    } else {
        k
    }
}

fn tcrypt_error(device: &Path, e: cryptblk_volume::Error) -> CliError {
    match e {
        cryptblk_volume::Error::Format(cryptblk_format::Error::WrongPassphrase) => CliError::new(
            EXIT_PERMISSION,
            "No device header detected with this passphrase.",
        ),
        e => volume_error(device, e),
    }
}

/// The TCRYPT options and the passphrase (a line of standard input or the terminal;
/// empty allowed with keyfiles).
/// What a TCRYPT open searches with: the options, the passphrase and where the header
/// is (`--header`, or for `--tcrypt-system` on a partition its disk, as cryptsetup reads
/// it; else the device itself).
fn tcrypt_secrets(
    device: &Path,
    a: &VolumeArgs,
) -> CliResult<(TcryptOptions, SecretBytes, Option<std::path::PathBuf>)> {
    let mut tc = a.tcrypt_options()?;
    let mut header = a.header.header.clone();
    // The partition's place on its disk sets the mapping whatever --header names (as
    // cryptsetup decides it from the data device); the disk is the header only by default.
    if tc.system
        && let Some(p) = cryptblk_volume::partition_of(device).map_err(|e| io_err(device, e))?
    {
        tc.partition_start = Some(p.start);
        header.get_or_insert(p.disk);
    }
    let pass = get_tcrypt_passphrase(
        &format!("Enter passphrase for {}: ", device.display()),
        !tc.keyfiles.is_empty(),
    )?;
    Ok((tc, pass, header))
}

/// The decrypted TrueCrypt/VeraCrypt header, nothing mapped; with the data offset in
/// 512-byte sectors (`test-passphrase`, `dump`).
pub fn tcrypt_header(ctx: &Ctx, device: &Path, a: &VolumeArgs) -> CliResult<(TcryptHeader, u64)> {
    let (tc, pass, header) = tcrypt_secrets(device, a)?;
    let devices = ctx.volume_devices();
    let data = devices
        .open(device, true)
        .map_err(|e| volume_error(device, e))?;
    let size = cryptblk_volume::Storage::size(&data).map_err(|e| io_err(device, e))?;
    let h = cryptblk_volume::tcrypt_header(&data, header.as_deref(), &devices, &tc, &pass)
        .map_err(|e| tcrypt_error(device, e))?;
    let offset = h.data_offset(&tc, size);
    Ok((h, offset))
}

/// Unlocks a TrueCrypt/VeraCrypt volume: keyfiles from `--key-file`, the passphrase from
/// a line of standard input or the terminal (empty allowed with keyfiles).
pub fn unlock_tcrypt(ctx: &Ctx, device: &Path, a: &VolumeArgs) -> CliResult<UnlockedTcrypt> {
    let (tc, pass, header) = tcrypt_secrets(device, a)?;
    let opts = OpenOptions {
        devices: ctx.volume_devices(),
        header,
        read_only: a.read_only,
        allow_discards: a.allow_discards,
        key_slot: None,
        io: a.file_io(),
    };
    open_tcrypt(device, &opts, &tc, &pass).map_err(|e| tcrypt_error(device, e))
}

/// What `status` reports about how the volume was opened.
pub struct OpenedVolume {
    pub volume: Volume,
    pub info: VolumeInfo,
    /// The LUKS header's file, for a reencryption while the volume serves (none for
    /// plain and memory volumes).
    pub header_file: Option<cryptblk_volume::DataDevice>,
}

/// How a volume was unlocked, as `status` (and `--recover`) report and check it.
#[derive(Debug, Clone)]
pub struct VolumeInfo {
    /// "LUKS1", "LUKS2" or "PLAIN".
    pub kind: String,
    pub key_bits: usize,
    pub keyslot: Option<u32>,
    /// The LUKS header's UUID (none in plain mode).
    pub uuid: Option<String>,
}

pub(crate) fn volume_error(device: &Path, e: cryptblk_volume::Error) -> CliError {
    match e {
        cryptblk_volume::Error::Format(cryptblk_format::Error::WrongPassphrase) => {
            CliError::new(EXIT_PERMISSION, "No key available with this passphrase.")
        }
        cryptblk_volume::Error::Format(cryptblk_format::Error::NotLuks) => CliError::usage(
            format!("Device {} is not a valid LUKS device.", device.display()),
        ),
        cryptblk_volume::Error::Busy(s) => {
            CliError::new(EXIT_BUSY, format!("{s} is in use by another process"))
        }
        cryptblk_volume::Error::Io(e) => io_err(device, e),
        e => CliError::usage(e.to_string()),
    }
}

pub fn plain_params(a: &VolumeArgs) -> CliResult<PlainParams> {
    let mut p = PlainParams::default();
    if let Some(c) = &a.cipher {
        p.cipher = CipherSpec::parse(c)?;
        p.key_len = p.cipher.default_key_len();
    }
    if let Some(bits) = a.key_size {
        p.key_len = bits / 8;
    }
    if let Some(h) = &a.hash {
        p.set_hash_spec(h)?;
    }
    p.offset = a.offset.unwrap_or(0);
    p.skip = a.skip.unwrap_or(0);
    p.size = a.size;
    if let Some(ss) = a.sector_size {
        p.sector_size = ss;
    }
    p.iv_large_sectors = a.iv_large_sectors;
    p.validate()?;
    Ok(p)
}

/// Parses `mem:SIZE` (K, M, G, T suffixes, powers of 1024).
pub fn parse_mem(device: &Path) -> Option<CliResult<u64>> {
    let s = device.to_str()?.strip_prefix("mem:")?;
    Some(
        crate::units::parse_size(s)
            .ok()
            .filter(|&n| n >= 4096)
            .ok_or_else(|| CliError::usage(format!("bad memory size '{s}' (e.g. mem:1G)"))),
    )
}

/// A RAM-backed plain volume (like brd under dm-crypt): the key is random unless a key
/// file is given, since the contents die with the process anyway.
fn open_memory(size: u64, a: &VolumeArgs) -> CliResult<OpenedVolume> {
    let mut p = plain_params(a)?;
    if a.cipher.is_none() {
        p.cipher = CipherSpec::parse("aes-xts-plain64")?;
        p.key_len = a.key_size.map(|b| b / 8).unwrap_or(64);
    }
    if a.sector_size.is_none() {
        p.sector_size = 4096;
    }
    p.validate()?;
    let key = match a.key.key_file() {
        Some(f) => {
            p.key_from_keyfile(&read_key_file(f, a.key.keyfile_offset, Some(p.key_len))?, 0)?
        }
        None => cryptblk_crypto::SecretBytes::random(p.key_len)?,
    };
    let params = VolumeParams {
        cipher: p.cipher,
        sector_size: p.sector_size,
        iv: p.iv_options(),
        data_offset: 0,
        data_length: None,
        read_only: a.read_only,
        allow_discards: a.allow_discards,
    };
    let storage = Box::new(cryptblk_volume::MemStorage::new(size));
    let volume = cryptblk_volume::volume_from_key(storage, &key, &params)
        .map_err(|e| CliError::usage(e.to_string()))?;
    Ok(OpenedVolume {
        volume,
        info: VolumeInfo {
            kind: "PLAIN (memory)".into(),
            key_bits: p.key_len * 8,
            keyslot: None,
            uuid: None,
        },
        header_file: None,
    })
}

/// A loop-AES volume (`cryptsetup open --type loopaes`): keys from the key file
/// (required), `--key-size` 256 by default (cryptsetup's compiled-in default), `--cipher`
/// aes, `--offset`/`--skip` in 512-byte sectors (the IV offset follows the offset unless
/// `--skip` says otherwise).
fn open_loopaes(ctx: &Ctx, device: &Path, a: &VolumeArgs) -> CliResult<OpenedVolume> {
    let Some(f) = a.key.key_file() else {
        return Err(CliError::usage("Option --key-file is required."));
    };
    let file = read_key_file(f, a.key.keyfile_offset, a.key.keyfile_size)?;
    let cipher = match &a.cipher {
        Some(c) => cryptblk_crypto::BlockCipherAlg::from_name(c)?,
        None => cryptblk_crypto::BlockCipherAlg::Aes,
    };
    let hash = a
        .hash
        .as_deref()
        .map(cryptblk_crypto::HashAlg::from_name)
        .transpose()?;
    let key_len = a.key_size.unwrap_or(256) / 8;
    let k = cryptblk_format::loopaes::parse_keyfile(&file, cipher, key_len, hash)?;
    let offset = a.offset.unwrap_or(0);
    let params = VolumeParams {
        cipher: k.cipher,
        sector_size: 512,
        iv: cryptblk_crypto::IvOptions {
            large_sectors: false,
            offset: a.skip.unwrap_or(offset),
        },
        data_offset: offset * 512,
        data_length: a.size.map(|s| s * 512),
        read_only: a.read_only,
        allow_discards: a.allow_discards,
    };
    let data = ctx
        .volume_devices()
        .open(device, params.read_only)
        .map_err(|e| volume_error(device, e))?;
    let volume =
        open_plain_on(data, &k.key, &params, a.file_io()).map_err(|e| volume_error(device, e))?;
    Ok(OpenedVolume {
        volume,
        info: VolumeInfo {
            kind: "LOOPAES".into(),
            key_bits: key_len * 8,
            keyslot: None,
            uuid: None,
        },
        header_file: None,
    })
}

/// The secret that opens a BitLocker volume: a passphrase or recovery password (key file,
/// a line of standard input, the terminal) or a startup key (`--key-file` with the .BEK
/// file); nothing for a volume whose protection is suspended (its clear key opens it,
/// as Windows itself does).
pub fn bitlk_secret(
    ctx: &Ctx,
    device: &Path,
    a: &VolumeArgs,
) -> CliResult<(BitlkHeader, SecretBytes)> {
    let header = cryptblk_volume::bitlk_header(device, &ctx.volume_devices())
        .map_err(|e| volume_error(device, e))?;
    if header.has_clear_key() && a.key.key_file().is_none() {
        eprintln!(
            "BitLocker protection of {} is suspended: opening it with its clear key.",
            device.display()
        );
        return Ok((header, SecretBytes::zeroed(0)));
    }
    let pass = get_passphrase(
        &a.key.source(),
        &format!("Enter passphrase for {}: ", device.display()),
        false,
    )?;
    Ok((header, pass))
}

/// The options of a BitLocker or FileVault 2 mapping (no header file, no keyslots).
fn foreign_open_options(ctx: &Ctx, a: &VolumeArgs) -> OpenOptions {
    OpenOptions {
        devices: ctx.volume_devices(),
        header: None,
        read_only: a.read_only,
        allow_discards: a.allow_discards,
        key_slot: None,
        io: a.file_io(),
    }
}

/// `--volume-key-file`: exactly `len` bytes of volume key.
fn volume_key_file(a: &VolumeArgs, len: usize) -> CliResult<Option<SecretBytes>> {
    a.volume_key_file
        .as_deref()
        .map(|p| read_key_file(p, 0, Some(len)))
        .transpose()
}

/// A BitLocker volume (`cryptsetup open --type bitlk`).
fn open_bitlk(ctx: &Ctx, device: &Path, a: &VolumeArgs) -> CliResult<OpenedVolume> {
    // The volume's opening refuses what cannot be mapped (before any key search).
    let opts = foreign_open_options(ctx, a);
    let u = match &a.volume_key_file {
        Some(_) => {
            let h = cryptblk_volume::bitlk_header(device, &ctx.volume_devices())
                .map_err(|e| volume_error(device, e))?;
            let key = volume_key_file(a, h.encryption.key_bits() / 8)?.expect("given");
            cryptblk_volume::open_bitlk(device, &opts, Unlock::VolumeKey(&key))
        }
        None => {
            let (_, secret) = bitlk_secret(ctx, device, a)?;
            cryptblk_volume::open_bitlk(device, &opts, Unlock::Passphrase(&secret))
        }
    }
    .map_err(|e| volume_error(device, e))?;
    Ok(OpenedVolume {
        info: VolumeInfo {
            kind: if u.header.togo {
                "BITLK (To Go)"
            } else {
                "BITLK"
            }
            .into(),
            key_bits: u.header.encryption.key_bits(),
            keyslot: None,
            uuid: Some(u.header.guid.clone()),
        },
        volume: u.volume,
        header_file: None,
    })
}

/// The FileVault 2 volume key size: AES-128-XTS.
const FVAULT2_KEY_LEN: usize = 32;

/// A FileVault 2 volume (`cryptsetup open --type fvault2`): a user's passphrase or the
/// recovery key, or `--volume-key-file`.
fn open_fvault2(ctx: &Ctx, device: &Path, a: &VolumeArgs) -> CliResult<OpenedVolume> {
    let opts = foreign_open_options(ctx, a);
    let u = match volume_key_file(a, FVAULT2_KEY_LEN)? {
        Some(key) => cryptblk_volume::open_fvault2(device, &opts, Unlock::VolumeKey(&key)),
        None => {
            // Refuse a device that is not FileVault 2 before asking for a passphrase.
            cryptblk_volume::fvault2_header(device, &ctx.volume_devices())
                .map_err(|e| volume_error(device, e))?;
            let pass = get_passphrase(
                &a.key.source(),
                &format!("Enter passphrase for {}: ", device.display()),
                false,
            )?;
            cryptblk_volume::open_fvault2(device, &opts, Unlock::Passphrase(&pass))
        }
    }
    .map_err(|e| volume_error(device, e))?;
    Ok(OpenedVolume {
        info: VolumeInfo {
            kind: "FVAULT2".into(),
            key_bits: FVAULT2_KEY_LEN * 8,
            keyslot: None,
            uuid: Some(u.header.family_uuid.clone()),
        },
        volume: u.volume,
        header_file: None,
    })
}

/// Unlocks `device` as the options say.
pub fn open_volume(ctx: &Ctx, device: &Path, a: &VolumeArgs) -> CliResult<OpenedVolume> {
    if let Some(size) = parse_mem(device) {
        return open_memory(size?, a);
    }
    if a.volume_key_file.is_some() && !matches!(a.kind.as_str(), "bitlk" | "fvault2") {
        return Err(CliError::usage(
            "--volume-key-file opens only --type bitlk and fvault2 volumes here",
        ));
    }
    match a.kind.as_str() {
        "luks" | "luks1" | "luks2" => {
            let pass = get_passphrase(
                &a.key.source(),
                &format!("Enter passphrase for {}: ", device.display()),
                false,
            )?;
            let opts = OpenOptions {
                devices: ctx.volume_devices(),
                header: a.header.header.clone(),
                read_only: a.read_only,
                allow_discards: a.allow_discards,
                key_slot: a.key_slot,
                io: a.file_io(),
            };
            let u = unlock_luks(device, &opts, &pass).map_err(|e| volume_error(device, e))?;
            Ok(OpenedVolume {
                info: VolumeInfo {
                    kind: format!("LUKS{}", u.header.version()),
                    key_bits: u.header.key_len() * 8,
                    keyslot: Some(u.keyslot),
                    uuid: Some(u.header.uuid().to_string()),
                },
                volume: u.volume,
                header_file: Some(u.header_file),
            })
        }
        "plain" => {
            let p = plain_params(a)?;
            // A key file (not stdin) is the key itself; a passphrase is hashed (cryptsetup).
            let key = match a.key.key_file() {
                Some(f) if f.as_os_str() != "-" => {
                    let raw = read_key_file(f, a.key.keyfile_offset, None)?;
                    p.key_from_keyfile(&raw, 0)?
                }
                _ => {
                    let pass = get_passphrase(
                        &a.key.source(),
                        &format!("Enter passphrase for {}: ", device.display()),
                        false,
                    )?;
                    p.derive_key(&pass)?
                }
            };
            let params = VolumeParams {
                cipher: p.cipher,
                sector_size: p.sector_size,
                iv: p.iv_options(),
                data_offset: p.data_offset_bytes(),
                data_length: p.data_length_bytes(),
                read_only: a.read_only,
                allow_discards: a.allow_discards,
            };
            let data = ctx
                .volume_devices()
                .open(device, params.read_only)
                .map_err(|e| volume_error(device, e))?;
            let volume = open_plain_on(data, &key, &params, a.file_io())
                .map_err(|e| volume_error(device, e))?;
            Ok(OpenedVolume {
                volume,
                info: VolumeInfo {
                    kind: "PLAIN".into(),
                    key_bits: p.key_len * 8,
                    keyslot: None,
                    uuid: None,
                },
                header_file: None,
            })
        }
        "loopaes" => open_loopaes(ctx, device, a),
        "bitlk" => open_bitlk(ctx, device, a),
        "fvault2" => open_fvault2(ctx, device, a),
        "tcrypt" => {
            let u = unlock_tcrypt(ctx, device, a)?;
            Ok(OpenedVolume {
                info: VolumeInfo {
                    kind: if u.header.veracrypt {
                        "VERACRYPT"
                    } else {
                        "TCRYPT"
                    }
                    .into(),
                    key_bits: u.header.key_bits(),
                    keyslot: None,
                    uuid: None,
                },
                volume: u.volume,
                header_file: None,
            })
        }
        other => Err(CliError::usage(format!(
            "unsupported --type {other} (luks, plain, loopaes, tcrypt, bitlk, fvault2)"
        ))),
    }
}
