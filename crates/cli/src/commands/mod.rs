//! The commands on a device's header and volume, one module per theme; what several of
//! them need (opening the header device, loading the header, the KDF options, unlocking a
//! keyslot) is here.

pub(crate) mod bench;
pub(crate) mod benchmark;
pub(crate) mod convert;
pub(crate) mod crypttab;
pub(crate) mod dump;
pub(crate) mod enroll;
pub(crate) mod format;
pub(crate) mod header;
pub(crate) mod keyslots;
pub(crate) mod luksdump;
pub(crate) mod reencrypt;
pub(crate) mod served;
pub(crate) mod token;
pub(crate) mod transfer;

use crate::args::{HeaderArgs, KdfArgs};
use crate::ctx::Ctx;
use crate::error::{CliError, CliResult, EXIT_PERMISSION, io_err};
use crate::passphrase::{KeySource, get_passphrase};
use cryptblk_crypto::{HashAlg, KdfKind, KdfRequest, SecretBytes};
use cryptblk_format::{LuksHeader, Storage};
use cryptblk_volume::DataDevice;
use std::fs::OpenOptions;
use std::path::Path;
use std::sync::Arc;

/// The file holding the header: `--header` if given, else the device.
pub(crate) fn header_path<'a>(device: &'a Path, h: &'a HeaderArgs) -> &'a Path {
    h.header.as_deref().unwrap_or(device)
}

/// Opens the header device; writers take an exclusive lock so two cryptblk (or a
/// cryptblk and a running `open`) never change metadata at once.
pub(crate) fn open_header(
    ctx: &Ctx,
    device: &Path,
    h: &HeaderArgs,
    write: bool,
) -> CliResult<DataDevice> {
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
pub(crate) fn remote(ctx: &Ctx, path: &Path, read_only: bool) -> CliResult<Option<DataDevice>> {
    ctx.devices
        .open_remote(path, read_only)
        .map_err(|e| crate::unlock::volume_error(path, cryptblk_volume::Error::Io(e)))
}

/// The LUKS header of `path`, one with unknown mandatory requirements included: as in
/// cryptsetup, such a header is inspected, its passphrases checked and its keyslots
/// destroyed; every other change is refused when it is written, and mapping it when the
/// volume opens.
pub(crate) fn load(dev: &mut dyn Storage, path: &Path) -> CliResult<Box<dyn LuksHeader>> {
    cryptblk_format::load_header_with_requirements(dev).map_err(|e| match e {
        cryptblk_format::Error::NotLuks => CliError::usage(format!(
            "Device {} is not a valid LUKS device.",
            path.display()
        )),
        e => CliError::from(e),
    })
}

pub(crate) fn kdf_request(args: &KdfArgs, luks1: bool) -> CliResult<KdfRequest> {
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

/// Unlocks with a passphrase from `src`, mapping a failure to cryptsetup's message.
pub(crate) fn unlock(
    hdr: &dyn LuksHeader,
    dev: &mut dyn Storage,
    src: &KeySource,
    prompt: &str,
    slot: Option<u32>,
) -> CliResult<(u32, SecretBytes)> {
    let pass = get_passphrase(src, prompt, false)?;
    hdr.unlock(dev, &pass, slot).map_err(wrong_passphrase)
}

/// As [`unlock`], tokens first when the token options ask for them (`--token-only`,
/// `--token-id`, `--token-type`), as cryptsetup's commands that change a header (luksAddKey)
/// take them: a script that pipes two passphrases in keeps working on a volume with
/// tokens. The keyslot a token's passphrase opened, or the one the passphrase opens.
pub(crate) fn unlock_or_token(
    hdr: &dyn LuksHeader,
    dev: &mut dyn Storage,
    key: &crate::args::KeyArgs,
    tokens: &crate::tokens::TokenArgs,
    prompt: &str,
    slot: Option<u32>,
) -> CliResult<(u32, SecretBytes)> {
    if tokens.asked() && key.key_file().is_none() {
        let by_token = crate::tokens::try_tokens(&hdr.tokens(), tokens, |pass, s, _| {
            if slot.is_some_and(|want| want != s) {
                return None;
            }
            hdr.unlock(dev, pass, Some(s)).ok()
        })?;
        if let Some(found) = by_token {
            return Ok(found);
        }
    }
    unlock(hdr, dev, &key.source(), prompt, slot)
}

/// The passphrase a token gives when the token options ask for one (and no key file is
/// given), else the one typed or read: for commands that need the passphrase itself
/// (reencrypt gives the new keyslot the same one), not just the volume key.
pub(crate) fn passphrase_or_token(
    hdr: &dyn LuksHeader,
    dev: &mut dyn Storage,
    key: &crate::args::KeyArgs,
    tokens: &crate::tokens::TokenArgs,
    prompt: &str,
) -> CliResult<SecretBytes> {
    if tokens.asked() && key.key_file().is_none() {
        let by_token = crate::tokens::try_tokens(&hdr.tokens(), tokens, |pass, s, _| {
            hdr.unlock(dev, pass, Some(s)).ok().map(|_| pass.clone())
        })?;
        if let Some(pass) = by_token {
            return Ok(pass);
        }
    }
    get_passphrase(&key.source(), prompt, false)
}

/// The LUKS2 header of `path` (what unbound keys and keyslot ciphers need).
pub(crate) fn luks2_header(
    dev: &mut dyn Storage,
    path: &std::path::Path,
) -> CliResult<cryptblk_format::luks2::Luks2Header> {
    if cryptblk_format::load_header_with_requirements(dev)
        .map(|h| h.version())
        .ok()
        != Some(2)
    {
        return Err(CliError::usage(format!(
            "Device {} is not a valid LUKS2 device.",
            path.display()
        )));
    }
    Ok(cryptblk_format::luks2::Luks2Header::read_ignoring_requirements(dev)?)
}

/// A wrong passphrase as cryptsetup reports it (exit code 2).
pub(crate) fn wrong_passphrase(e: cryptblk_format::Error) -> CliError {
    match e {
        cryptblk_format::Error::WrongPassphrase => {
            CliError::new(EXIT_PERMISSION, "No key available with this passphrase.")
        }
        e => e.into(),
    }
}
