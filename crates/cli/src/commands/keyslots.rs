//! Keyslots: `add-key`, `change-key`, `convert-key`, `remove-key`, `kill-slot`,
//! `test-passphrase` (cryptsetup luksAddKey, luksChangeKey, luksConvertKey, luksRemoveKey,
//! luksKillSlot, open --test-passphrase).

use super::{header_path, kdf_request, load, luks2_header, open_header, unlock, wrong_passphrase};
use crate::args::{HeaderArgs, KdfArgs, KeyArgs, TypeSelect};
use crate::ctx::Ctx;
use crate::error::{CliError, CliResult, EXIT_PERMISSION};
use crate::passphrase::{KeySource, confirm, get_passphrase, read_passphrase};
use clap::Args;
use cryptblk_crypto::SecretBytes;
use cryptblk_format::{LuksHeader, Storage, load_header};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(crate) struct AddKeyArgs {
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
    /// Keyslot for the new passphrase; with --new-key-slot, the keyslot the existing
    /// passphrase opens (as cryptsetup).
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
    /// Keyslot for the new passphrase (-S then names the existing one).
    #[arg(long = "new-key-slot")]
    pub new_key_slot: Option<u32>,
    /// File holding the new passphrase (as the positional NEW_KEY_FILE, which wins).
    #[arg(long = "new-keyfile")]
    pub new_keyfile: Option<PathBuf>,
    /// Take the volume key from this file (raw bytes, the volume's key size) instead of
    /// unlocking with an existing passphrase; checked against the header's digest.
    #[arg(long = "volume-key-file", alias = "master-key-file")]
    pub volume_key_file: Option<PathBuf>,
    /// With --volume-key-file: the key's size in bits (must be the volume's); with
    /// --unbound: the unbound key's size.
    #[arg(short = 's', long = "key-size")]
    pub key_size: Option<usize>,
    /// LUKS2: add a keyslot for a key of its own, not the volume's (an unbound key:
    /// random, or from --volume-key-file; -s gives its size). No existing passphrase is
    /// needed.
    #[arg(long)]
    pub unbound: bool,
    #[command(flatten)]
    pub kdf: KdfArgs,
    /// add-key: unlock with a token (--token-id, --token-type, --token-only).
    #[command(flatten)]
    pub tokens: crate::tokens::TokenArgs,
}

#[derive(Args, Debug)]
pub(crate) struct RemoveKeyArgs {
    pub device: PathBuf,
    /// File holding the passphrase to remove.
    pub remove_key_file: Option<PathBuf>,
    #[command(flatten)]
    pub header: HeaderArgs,
    #[command(flatten)]
    pub key: KeyArgs,
}

#[derive(Args, Debug)]
pub(crate) struct ConvertKeyArgs {
    pub device: PathBuf,
    /// Further arguments, ignored as cryptsetup ignores them (its test scripts give the
    /// device twice).
    #[arg(hide = true)]
    pub ignored: Vec<std::ffi::OsString>,
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
pub(crate) struct KillSlotArgs {
    pub device: PathBuf,
    pub slot: u32,
    #[command(flatten)]
    pub header: HeaderArgs,
    /// A remaining passphrase (required unless --batch-mode).
    #[command(flatten)]
    pub key: KeyArgs,
}

#[derive(Args, Debug)]
pub(crate) struct TestArgs {
    pub device: PathBuf,
    /// LUKS2: check the passphrase against the unbound keys' keyslots.
    #[arg(long)]
    pub unbound: bool,
    /// LUKS: check this volume key (raw bytes) against the header instead of a passphrase.
    #[arg(long = "volume-key-file", alias = "master-key-file")]
    pub volume_key_file: Option<PathBuf>,
    /// With --volume-key-file: the key's size in bits (must be the volume's).
    #[arg(short = 's', long = "key-size", requires = "volume_key_file")]
    pub key_size: Option<usize>,
    #[command(flatten)]
    pub header: HeaderArgs,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Only try this keyslot.
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
    #[command(flatten)]
    pub tokens: crate::tokens::TokenArgs,
    #[command(flatten)]
    pub select: TypeSelect,
}

fn new_passphrase_source(a: &AddKeyArgs) -> KeySource {
    KeySource {
        key_file: a.new_key_file.clone().or_else(|| a.new_keyfile.clone()),
        extra_key_files: 0,
        keyfile_size: a.new_keyfile_size,
        keyfile_offset: a.new_keyfile_offset,
        verify: a.key.verify_passphrase,
        ask_password: false,
    }
}

pub(crate) fn add_key(ctx: &Ctx, a: AddKeyArgs) -> CliResult<()> {
    if a.unbound {
        // No existing passphrase: -S is the new keyslot, as cryptsetup's.
        return add_unbound_key(ctx, &a, a.new_key_slot.or(a.key_slot));
    }
    let mut dev = open_header(ctx, &a.device, &a.header, true)?;
    let mut hdr = load(&mut dev, header_path(&a.device, &a.header))?;
    // cryptsetup's rule: -S alone names the new keyslot; with --new-key-slot it names the
    // keyslot the existing passphrase must open.
    let (old_slot, new_slot) = match a.new_key_slot {
        Some(n) => (a.key_slot, Some(n)),
        None => (None, a.key_slot),
    };
    let vk = match &a.volume_key_file {
        Some(p) => volume_key_from_file(&*hdr, p, a.key_size)?,
        None => {
            super::unlock_or_token(
                &*hdr,
                &mut dev,
                &a.key,
                &a.tokens,
                "Enter any existing passphrase: ",
                old_slot,
            )?
            .1
        }
    };
    let new = get_passphrase(
        &new_passphrase_source(&a),
        "Enter new passphrase for key slot: ",
        true,
    )?;
    let kdf = kdf_request(&a.kdf, hdr.version() == 1)?;
    a.kdf.apply_keyslot_encryption(&mut *hdr)?;
    let slot = hdr.add_keyslot(&mut dev, &vk, &new, new_slot, &kdf)?;
    eprintln!("Key slot {slot} created.");
    Ok(())
}

/// `add-key --unbound`: a LUKS2 keyslot for a key of its own (random, or from
/// --volume-key-file), of -s bits.
fn add_unbound_key(ctx: &Ctx, a: &AddKeyArgs, slot: Option<u32>) -> CliResult<()> {
    let mut dev = open_header(ctx, &a.device, &a.header, true)?;
    let mut hdr = luks2_header(&mut dev, header_path(&a.device, &a.header))?;
    // At most 4096 bits: cryptsetup's largest keys are 512 bits; the cap keeps a typo
    // from asking for gigabytes.
    let bits = a
        .key_size
        .filter(|b| *b > 0 && b % 8 == 0 && *b <= 4096)
        .ok_or_else(|| {
            CliError::usage(
                "Option --unbound needs --key-size (bits: a multiple of 8, at most 4096).",
            )
        })?;
    let key = match &a.volume_key_file {
        Some(p) => {
            let k = crate::passphrase::read_key_file(p, 0, Some(bits / 8))?;
            if k.len() != bits / 8 {
                return Err(CliError::usage(format!(
                    "Cannot read {} bytes from volume key file {}.",
                    bits / 8,
                    p.display()
                )));
            }
            SecretBytes::from_slice(&k)
        }
        None => SecretBytes::random(bits / 8)?,
    };
    let new = get_passphrase(
        &new_passphrase_source(a),
        "Enter new passphrase for key slot: ",
        true,
    )?;
    let kdf = kdf_request(&a.kdf, false)?;
    a.kdf.apply_keyslot_encryption(&mut hdr)?;
    let slot = hdr.add_unbound_keyslot(&mut dev, &key, &new, slot, &kdf)?;
    eprintln!("Key slot {slot} created.");
    Ok(())
}

/// Whether keyslot `slot` of a LUKS2 header holds an unbound key.
fn is_unbound(dev: &mut dyn Storage, slot: Option<u32>) -> bool {
    let Some(s) = slot else { return false };
    cryptblk_format::luks2::Luks2Header::read(dev).is_ok_and(|h| h.unbound_keyslots().contains(&s))
}

/// `--volume-key-file`: the volume key, exactly the header's key size, checked against
/// its digest.
pub(crate) fn volume_key_from_file(
    hdr: &dyn LuksHeader,
    path: &std::path::Path,
    key_size_bits: Option<usize>,
) -> CliResult<SecretBytes> {
    // A LUKS2 header with no keyslot left (after `erase`) does not say the key's size:
    // then --key-size does, as with cryptsetup.
    let len = match (hdr.key_len(), key_size_bits) {
        (0, Some(bits)) if bits > 0 && bits % 8 == 0 => bits / 8,
        (0, _) => {
            return Err(CliError::usage(
                "The volume has no keyslot to tell the key size: give --key-size.",
            ));
        }
        (len, Some(bits)) if bits != len * 8 => {
            return Err(CliError::usage(format!(
                "Volume key size is {} bits, not {bits}.",
                len * 8
            )));
        }
        (len, _) => len,
    };
    let k = crate::passphrase::read_key_file(path, 0, Some(len))?;
    if k.len() != len {
        return Err(CliError::usage(format!(
            "Cannot read {len} bytes from volume key file {}.",
            path.display()
        )));
    }
    let vk = SecretBytes::from_slice(&k);
    if !hdr.verify_volume_key(&vk)? {
        return Err(CliError::new(
            EXIT_PERMISSION,
            "Volume key does not match the volume.",
        ));
    }
    Ok(vk)
}

pub(crate) fn change_key(ctx: &Ctx, a: AddKeyArgs) -> CliResult<()> {
    for (set, opt) in [
        (a.new_key_slot.is_some(), "--new-key-slot"),
        (a.volume_key_file.is_some(), "--volume-key-file"),
        // A token's keyslot changed to another passphrase would leave the token broken.
        (a.tokens.asked(), "--token-*"),
    ] {
        if set {
            return Err(CliError::usage(format!(
                "Option {opt} is not allowed for luksChangeKey."
            )));
        }
    }
    let mut dev = open_header(ctx, &a.device, &a.header, true)?;
    if is_unbound(&mut dev, a.key_slot) {
        // An unbound key's keyslot: the new passphrase protects the same key, unbound.
        let mut h = luks2_header(&mut dev, header_path(&a.device, &a.header))?;
        let old = get_passphrase(&a.key.source(), "Enter passphrase to be changed: ", false)?;
        let new = get_passphrase(&new_passphrase_source(&a), "Enter new passphrase: ", true)?;
        let kdf = kdf_request(&a.kdf, false)?;
        a.kdf.apply_keyslot_encryption(&mut h)?;
        let slot_in = a.key_slot.expect("checked by is_unbound");
        let slot = h
            .change_unbound_keyslot(&mut dev, &old, &new, slot_in, a.key_slot, &kdf)
            .map_err(wrong_passphrase)?;
        eprintln!("Key slot {slot_in} changed (new passphrase in key slot {slot}).");
        return Ok(());
    }
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
    a.kdf.apply_keyslot_encryption(&mut *hdr)?;
    // Each format does it as crash-safely as its layout allows (see `replace_keyslot`).
    // cryptsetup: with -S the passphrase stays in that keyslot number.
    let slot = hdr.replace_keyslot(&mut dev, old_slot, &vk, &new, a.key_slot, &kdf)?;
    eprintln!("Key slot {old_slot} changed (new passphrase in key slot {slot}).");
    Ok(())
}

pub(crate) fn convert_key(ctx: &Ctx, a: ConvertKeyArgs) -> CliResult<()> {
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
    a.kdf.apply_keyslot_encryption(&mut hdr)?;
    let pass = get_passphrase(
        &a.key.source(),
        "Enter passphrase for keyslot to be converted: ",
        false,
    )?;
    let unbound = a.key_slot.filter(|s| hdr.unbound_keyslots().contains(s));
    let changed = match unbound {
        Some(s) => hdr.change_unbound_keyslot(&mut dev, &pass, &pass, s, Some(s), &kdf),
        None => hdr.change_keyslot(&mut dev, &pass, &pass, a.key_slot, a.key_slot, &kdf),
    };
    let slot = changed.map_err(|e| match e {
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

pub(crate) fn remove_key(ctx: &Ctx, a: RemoveKeyArgs) -> CliResult<()> {
    let mut dev = open_header(ctx, &a.device, &a.header, true)?;
    let mut hdr = load(&mut dev, header_path(&a.device, &a.header))?;
    let src = match &a.remove_key_file {
        Some(p) => KeySource {
            key_file: Some(p.clone()),
            extra_key_files: 0,
            keyfile_size: a.key.keyfile_size,
            keyfile_offset: a.key.keyfile_offset,
            verify: false,
            ask_password: false,
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

pub(crate) fn kill_slot(ctx: &Ctx, a: KillSlotArgs) -> CliResult<()> {
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
    // Only keyslots of the volume's key count as a way in that remains (an unbound
    // key's keyslot opens nothing of the data).
    let unbound = if hdr.version() == 2 {
        cryptblk_format::luks2::Luks2Header::read(&mut dev)
            .map(|h| h.unbound_keyslots())
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let bound: Vec<u32> = active
        .iter()
        .copied()
        .filter(|s| !unbound.contains(s))
        .collect();
    let active = if unbound.contains(&a.slot) {
        // Killing an unbound key's keyslot: any keyslot of the volume's key vouches.
        let mut v = bound.clone();
        v.push(a.slot);
        v
    } else {
        bound.clone()
    };
    // The last way in: asked first, before any passphrase, as cryptsetup asks.
    if bound == [a.slot] {
        confirm(
            ctx.batch,
            "This is the last keyslot. Device will become unusable after purging this key.",
        )
        .map_err(|_| CliError::usage("Operation aborted, the keyslot was NOT wiped."))?;
    }
    // As cryptsetup: a passphrase is checked unless in batch mode with none supplied (no
    // key file, standard input a terminal); one that was supplied and is wrong refuses,
    // wrong or not batch. Nothing at all on a standard input that is not a terminal
    // counts as none supplied (cryptsetup ignores the failed read), batch or not.
    let src = a.key.source();
    let supplied = src.key_file.is_some() || !std::io::stdin().is_terminal();
    if !ctx.batch || supplied {
        let pass = if src.key_file.is_none() && !std::io::stdin().is_terminal() {
            Some(read_passphrase(
                &src,
                "Enter any remaining passphrase: ",
                false,
            )?)
            .filter(|p| !p.is_empty())
        } else {
            match get_passphrase(&src, "Enter any remaining passphrase: ", false) {
                Ok(p) => Some(p),
                Err(_) if ctx.batch && src.key_file.is_none() => None,
                Err(e) => return Err(e),
            }
        };
        if let Some(pass) = pass {
            verify_remaining(&*hdr, &mut dev, &pass, a.slot, &active)?;
        }
    }
    hdr.kill_keyslot(&mut dev, a.slot)?;
    eprintln!("Key slot {} removed.", a.slot);
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

pub(crate) fn test_passphrase(ctx: &Ctx, a: TestArgs) -> CliResult<()> {
    if a.select.is_bitlk() {
        crate::commands::dump::bitlk_volume_key(ctx, &a.device, &a.key)?;
        return Ok(());
    }
    if a.select.is_fvault2() {
        crate::commands::dump::fvault2_volume_key(ctx, &a.device, &a.key)?;
        return Ok(());
    }
    if a.select.is_tcrypt()? {
        crate::unlock::tcrypt_header(ctx, &a.device, &a.select.tcrypt_args(&a.header, &a.key))?;
        return Ok(());
    }
    let mut dev = open_header(ctx, &a.device, &a.header, false)?;
    let hdr = load(&mut dev, header_path(&a.device, &a.header))?;
    if let Some(p) = &a.volume_key_file {
        volume_key_from_file(&*hdr, p, a.key_size)?;
        eprintln!("Volume key matches the volume.");
        return Ok(());
    }
    if a.unbound || is_unbound(&mut dev, a.key_slot) {
        // An unbound key's keyslot is checked against its own digest (cryptsetup's
        // `open --test-passphrase --unbound`, or -S naming such a keyslot).
        let h = luks2_header(&mut dev, header_path(&a.device, &a.header))?;
        let pass = get_passphrase(
            &a.key.source(),
            &format!("Enter passphrase for {}: ", a.device.display()),
            false,
        )?;
        let (slot, _) = h
            .open_unbound(&mut dev, &pass, a.key_slot)
            .map_err(wrong_passphrase)?;
        eprintln!("Key slot {slot} unlocked.");
        return Ok(());
    }
    // Tokens first (no key file given), as cryptsetup tries them.
    if a.key.key_file().is_none() {
        let by_token = crate::tokens::try_tokens(&hdr.tokens(), &a.tokens, |pass, slot, _| {
            if a.key_slot.is_some_and(|s| s != slot) {
                return None;
            }
            hdr.unlock(&mut dev, pass, Some(slot)).ok().map(|(s, _)| s)
        })?;
        if let Some(slot) = by_token {
            eprintln!("Key slot {slot} unlocked.");
            return Ok(());
        }
    }
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
