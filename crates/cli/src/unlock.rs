//! Opening a volume for the data path, every type the same way: the device checked first
//! (`cryptblk_volume::probe`), then the secret read once as the type wants it (a
//! passphrase, a key file's keys, a volume key), then `cryptblk_volume::open`. With
//! cryptsetup's option names.

use crate::args::VolumeArgs;
use crate::ctx::Ctx;
use crate::error::{CliError, CliResult, EXIT_BUSY, EXIT_PERMISSION, io_err};
use crate::passphrase::{get_passphrase, get_tcrypt_passphrase, read_key_file};
use cryptblk_crypto::CipherSpec;
use cryptblk_crypto::SecretBytes;
use cryptblk_format::bitlk::BitlkHeader;
use cryptblk_format::plain::PlainParams;
use cryptblk_format::tcrypt::TcryptHeader;
use cryptblk_volume::{
    LoopAesOptions, OpenOptions, Opened, Secret, VolumeInfo, VolumeParams, VolumeType,
};
use std::path::Path;

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

/// Plain mode's parameters from cryptsetup's options. As in cryptsetup: the key is 256
/// bits whatever the cipher unless `-s` says otherwise (`-s 0` is the default too), and
/// `--hash` is ignored when the key comes from a key file other than standard input.
pub(crate) fn plain_params(a: &VolumeArgs) -> CliResult<PlainParams> {
    let mut p = PlainParams::default();
    if let Some(c) = &a.cipher {
        p.cipher = CipherSpec::parse(c)?;
        if !p.cipher.valid_key_len(p.key_len) {
            // cryptsetup would refuse; the cipher's own size is friendlier.
            p.key_len = p.cipher.default_key_len();
        }
    }
    if let Some(bits) = a.key_size.filter(|&b| b > 0) {
        p.key_len = bits / 8;
    }
    let key_file_is_key = a.key.key_file().is_some_and(|f| f.as_os_str() != "-");
    match &a.hash {
        Some(_) if key_file_is_key => eprintln!(
            "WARNING: The --hash parameter is being ignored in plain mode with keyfile specified."
        ),
        Some(h) => p.set_hash_spec(h)?,
        None => {}
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
pub(crate) fn parse_mem(device: &Path) -> Option<CliResult<u64>> {
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
fn open_memory(size: u64, a: &VolumeArgs) -> CliResult<Opened> {
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
    Ok(Opened {
        volume,
        info: VolumeInfo {
            kind: "PLAIN (memory)".into(),
            key_bits: p.key_len * 8,
            keyslot: None,
            uuid: None,
            token: None,
        },
        header_file: None,
    })
}

/// The secret that opens a BitLocker volume: a passphrase or recovery password (key file,
/// a line of standard input, the terminal) or a startup key (`--key-file` with the .BEK
/// file); nothing for a volume whose protection is suspended (its clear key opens it,
/// as Windows itself does).
pub(crate) fn bitlk_secret(
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

/// `--volume-key-file`: exactly `len` bytes of volume key.
fn volume_key_file(a: &VolumeArgs, len: usize) -> CliResult<Option<SecretBytes>> {
    a.volume_key_file
        .as_deref()
        .map(|p| read_key_file(p, 0, Some(len)))
        .transpose()
}

impl VolumeArgs {
    /// The options of opening `device` as this type: where the header is, the data path,
    /// and the type's own parameters (plain mode's, loop-AES's, TrueCrypt's with their
    /// keyfiles read).
    pub(crate) fn open_options(&self, ctx: &Ctx, device: &Path) -> CliResult<OpenOptions> {
        let mut opts = OpenOptions {
            devices: ctx.volume_devices(),
            header: None,
            read_only: self.read_only,
            allow_discards: self.allow_discards,
            integrity_no_journal: self.integrity_no_journal,
            integrity_bitmap: self.integrity_bitmap,
            integrity: cryptblk_volume::IntegrityOptions {
                algorithm: self.integrity.clone(),
                journal_mac: self.integrity_key.journal_mac()?,
                journal_crypt: self.integrity_key.journal_crypt()?,
            },
            key_slot: None,
            io: self.file_io(),
            ..Default::default()
        };
        match self.kind {
            VolumeType::Luks | VolumeType::Luks1 | VolumeType::Luks2 => {
                opts.header = self.header.header.clone();
                opts.key_slot = self.key_slot;
            }
            VolumeType::Plain => opts.plain = plain_params(self)?,
            VolumeType::Loopaes => {
                opts.loopaes = LoopAesOptions {
                    cipher: match &self.cipher {
                        Some(c) => cryptblk_crypto::BlockCipherAlg::from_name(c)?,
                        None => cryptblk_crypto::BlockCipherAlg::Aes,
                    },
                    key_len: self.key_size.unwrap_or(256) / 8,
                    hash: self
                        .hash
                        .as_deref()
                        .map(cryptblk_crypto::HashAlg::from_name)
                        .transpose()?,
                    offset: self.offset.unwrap_or(0),
                    skip: self.skip,
                    size: self.size,
                }
            }
            VolumeType::Tcrypt => {
                let mut tc = self.tcrypt_options()?;
                let mut header = self.header.header.clone();
                // The partition's place on its disk sets the mapping whatever --header
                // names (as cryptsetup decides it from the data device); the disk is the
                // header only by default.
                if tc.system
                    && let Some(p) =
                        cryptblk_volume::partition_of(device).map_err(|e| io_err(device, e))?
                {
                    tc.partition_start = Some(p.start);
                    header.get_or_insert(p.disk);
                }
                opts.tcrypt = tc;
                opts.header = header;
            }
            // BitLocker, FileVault 2, and any type without options of its own.
            _ => {}
        }
        Ok(opts)
    }
}

/// The secret this type of volume wants, read once (after `probe` checked the device):
/// a passphrase (key file, a line of standard input, the terminal), a key file's keys
/// (plain mode with a key file, loop-AES), the volume key (`--volume-key-file`), or none
/// (a BitLocker volume whose protection is suspended opens with its clear key, as Windows
/// itself does).
fn read_secret(
    a: &VolumeArgs,
    device: &Path,
    opts: &OpenOptions,
    probe: &cryptblk_volume::Probe,
) -> CliResult<Secret> {
    let prompt = format!("Enter passphrase for {}: ", device.display());
    let passphrase = || get_passphrase(&a.key.source(), &prompt, false).map(Secret::Passphrase);
    let key_len = probe.key_len.unwrap_or(0);
    Ok(match a.kind {
        // A key file (not stdin) is the key itself; a passphrase is hashed (cryptsetup).
        VolumeType::Plain => plain_secret(a, &opts.plain, &prompt)?,
        VolumeType::Loopaes => {
            let Some(f) = a.key.key_file() else {
                return Err(CliError::usage("Option --key-file is required."));
            };
            Secret::KeyFile(read_key_file(f, a.key.keyfile_offset, a.key.keyfile_size)?)
        }
        VolumeType::Integrity => match a.integrity_key.key(opts.integrity.algorithm())? {
            Some(k) => Secret::KeyFile(k),
            None => Secret::None,
        },
        VolumeType::Tcrypt => Secret::Passphrase(get_tcrypt_passphrase(
            &prompt,
            !opts.tcrypt.keyfiles.is_empty(),
            a.key.ask_password,
        )?),
        VolumeType::Bitlk | VolumeType::Fvault2 => match volume_key_file(a, key_len)? {
            Some(k) => Secret::VolumeKey(k),
            None if probe.clear_key && a.key.key_file().is_none() => {
                eprintln!(
                    "BitLocker protection of {} is suspended: opening it with its clear key.",
                    device.display()
                );
                Secret::None
            }
            None => passphrase()?,
        },
        // LUKS: the volume key itself (`--volume-key-file`, of the header's key size, or
        // of --key-size when no keyslot is left to say it), else a passphrase.
        VolumeType::Luks | VolumeType::Luks1 | VolumeType::Luks2 if a.volume_key_file.is_some() => {
            let len = match (key_len, a.key_size) {
                (0, Some(bits)) => bits / 8,
                (len, _) => len,
            };
            match volume_key_file(a, len)? {
                Some(k) if k.len() == len && len > 0 => Secret::VolumeKey(k),
                _ => {
                    return Err(CliError::usage(format!(
                        "Cannot read {len} bytes of volume key from the --volume-key-file."
                    )));
                }
            }
        }
        // Any type that takes nothing but a passphrase.
        _ => passphrase()?,
    })
}

/// What a plain volume's key comes from, read as cryptsetup reads it: a key file is the
/// key itself, exactly the key's size from `--keyfile-offset` on (`/dev/zero` and
/// `/dev/urandom` work); `--key-file -` is a passphrase read to the end of input (no
/// newline handling), exactly the key's size with `--hash plain` and else `-l` bytes
/// (`-l 0` or none: all of it); otherwise a passphrase, from a line of stdin or the
/// terminal.
pub(crate) fn plain_secret(a: &VolumeArgs, p: &PlainParams, prompt: &str) -> CliResult<Secret> {
    match a.key.key_file() {
        Some(f) if f.as_os_str() != "-" => Ok(Secret::KeyFile(read_key_file(
            f,
            a.key.keyfile_offset,
            Some(p.key_len),
        )?)),
        Some(f) => {
            let size = if p.hash.is_none() && p.hash_len.is_none() {
                Some(p.key_len)
            } else {
                a.key.keyfile_size
            };
            Ok(Secret::Passphrase(read_key_file(
                f,
                a.key.keyfile_offset,
                size,
            )?))
        }
        None => Ok(Secret::Passphrase(get_passphrase(
            &a.key.source(),
            prompt,
            false,
        )?)),
    }
}

/// How many bytes of standard input `--key-file -` takes with these options (at most):
/// `-l`, or the key's size in plain mode without a hash, or the 8 MiB maximum.
pub(crate) fn stdin_key_size(a: &VolumeArgs) -> CliResult<usize> {
    if a.kind == VolumeType::Plain {
        let p = plain_params(a)?;
        if p.hash.is_none() && p.hash_len.is_none() {
            return Ok(p.key_len);
        }
    }
    Ok(a.key
        .keyfile_size
        .filter(|&n| n > 0)
        .unwrap_or(crate::passphrase::KEYFILE_MAX))
}

/// Unlocks `device` as the options say: a volume of any type, or `mem:SIZE` (RAM).
pub(crate) fn open_volume(ctx: &Ctx, device: &Path, a: &VolumeArgs) -> CliResult<Opened> {
    if let Some(size) = parse_mem(device) {
        return open_memory(size?, a);
    }
    if a.volume_key_file.is_some()
        && !matches!(
            a.kind,
            VolumeType::Bitlk
                | VolumeType::Fvault2
                | VolumeType::Luks
                | VolumeType::Luks1
                | VolumeType::Luks2
        )
    {
        return Err(CliError::usage(
            "--volume-key-file opens LUKS, BitLocker and FileVault 2 volumes (--type luks, bitlk, fvault2)",
        ));
    }
    let fail = |e: cryptblk_volume::Error| match (a.kind, e) {
        (
            VolumeType::Tcrypt,
            cryptblk_volume::Error::Format(cryptblk_format::Error::WrongPassphrase),
        ) => CliError::new(
            EXIT_PERMISSION,
            "No device header detected with this passphrase.",
        ),
        (_, e) => volume_error(device, e),
    };
    let opts = a.open_options(ctx, device)?;
    // The device first: missing, busy or of another type is said before any prompt.
    let probe = cryptblk_volume::probe(a.kind, device, &opts).map_err(fail)?;
    if let Some(opened) = open_by_token(device, a, &opts)? {
        return Ok(opened);
    }
    // A LUKS passphrase typed at a terminal is asked for again when wrong (-T).
    let interactive = matches!(
        a.kind,
        VolumeType::Luks | VolumeType::Luks1 | VolumeType::Luks2
    ) && a.volume_key_file.is_none()
        && a.key.key_file().is_none()
        && (a.key.ask_password || std::io::IsTerminal::is_terminal(&std::io::stdin()));
    let tries = ctx.tries_for(interactive);
    let mut attempt = 1;
    loop {
        let secret = read_secret(a, device, &opts, &probe)?;
        match cryptblk_volume::open(a.kind, device, &secret, &opts) {
            Err(cryptblk_volume::Error::Format(cryptblk_format::Error::WrongPassphrase))
                if attempt < tries =>
            {
                eprintln!("No key available with this passphrase.");
                attempt += 1;
            }
            r => return r.map_err(fail),
        }
    }
}

/// A LUKS volume opened by one of its tokens (cryptsetup tries them before asking for a
/// passphrase), when no key file or volume key is given; `None` when none did.
fn open_by_token(device: &Path, a: &VolumeArgs, opts: &OpenOptions) -> CliResult<Option<Opened>> {
    let luks = matches!(
        a.kind,
        VolumeType::Luks | VolumeType::Luks1 | VolumeType::Luks2
    );
    if !luks || a.key.key_file().is_some() || a.volume_key_file.is_some() {
        return Ok(None);
    }
    let header = opts.header.as_deref().unwrap_or(device);
    let tokens = opts
        .devices
        .open(header, true)
        .ok()
        .and_then(|mut h| cryptblk_format::load_header(&mut h).ok())
        .map(|h| h.tokens())
        .unwrap_or_default();
    if tokens.is_empty() && !a.tokens.token_only {
        return Ok(None);
    }
    crate::tokens::try_tokens(&tokens, &a.tokens, |pass, slot, token| {
        if a.key_slot.is_some_and(|s| s != slot) {
            return None;
        }
        let mut o = opts.clone();
        o.key_slot = Some(slot);
        let mut opened =
            cryptblk_volume::open(a.kind, device, &Secret::Passphrase(pass.clone()), &o).ok()?;
        opened.info.token = Some(token);
        Some(opened)
    })
}

/// The decrypted TrueCrypt/VeraCrypt header, nothing mapped; with the data offset in
/// 512-byte sectors (`test-passphrase`, `dump`).
pub(crate) fn tcrypt_header(
    ctx: &Ctx,
    device: &Path,
    a: &VolumeArgs,
) -> CliResult<(TcryptHeader, u64)> {
    let opts = a.open_options(ctx, device)?;
    let fail = |e| volume_error(device, e);
    let data = opts.devices.open(device, true).map_err(fail)?;
    let size = cryptblk_volume::Storage::size(&data).map_err(|e| io_err(device, e))?;
    let pass = get_tcrypt_passphrase(
        &format!("Enter passphrase for {}: ", device.display()),
        !opts.tcrypt.keyfiles.is_empty(),
        a.key.ask_password,
    )?;
    let h = cryptblk_volume::tcrypt_header(
        &data,
        opts.header.as_deref(),
        &opts.devices,
        &opts.tcrypt,
        &pass,
    )
    .map_err(|e| match e {
        cryptblk_volume::Error::Format(cryptblk_format::Error::WrongPassphrase) => CliError::new(
            EXIT_PERMISSION,
            "No device header detected with this passphrase.",
        ),
        e => fail(e),
    })?;
    let offset = h.data_offset(&opts.tcrypt, size);
    Ok((h, offset))
}
