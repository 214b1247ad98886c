//! `dump`: what cryptsetup luksDump shows, in its layout (`luksdump.rs`) or as JSON.

use super::{load, open_header};
use crate::args::{HeaderArgs, KeyArgs, TypeSelect};
use crate::ctx::Ctx;
use crate::error::CliResult;
use clap::Args;
use cryptblk_crypto::Kdf;
use cryptblk_format::bitlk::BitlkHeader;
use cryptblk_format::fvault2::Fvault2Header;
use cryptblk_format::luks1::Luks1Header;
use cryptblk_format::luks2::Luks2Header;
use cryptblk_format::{KeyslotInfo, LuksHeader};
use serde_json::{Value, json};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(crate) struct DumpArgs {
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
    /// With --dump-volume-key or --unbound: write the key to this new file (mode 0400)
    /// instead of printing it.
    #[arg(long = "volume-key-file", alias = "master-key-file")]
    pub volume_key_file: Option<PathBuf>,
    /// LUKS2: show the unbound key of keyslot -S (its passphrase is asked).
    #[arg(long, requires = "key_slot")]
    pub unbound: bool,
    /// With --unbound: the keyslot holding the unbound key.
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
    #[arg(long = "dump-json-metadata")]
    pub dump_json_metadata: bool,
    /// --dump-volume-key: unlock with a token (--token-id, --token-type, --token-only).
    #[command(flatten)]
    pub tokens: crate::tokens::TokenArgs,
    /// --type plain: the key size in bits (as `open --type plain -s`).
    #[arg(short = 's', long = "key-size")]
    pub key_size: Option<usize>,
    #[command(flatten)]
    pub key: KeyArgs,
    #[command(flatten)]
    pub select: TypeSelect,
}

fn kdf_json(k: &Kdf) -> Value {
    match k {
        Kdf::Pbkdf2 { hash, iterations } => {
            json!({"type": "pbkdf2", "hash": hash.name(), "iterations": iterations})
        }
        Kdf::Argon2 {
            variant,
            time,
            memory_kib,
            parallel,
        } => {
            json!({"type": variant.name(), "time": time, "memory": memory_kib, "cpus": parallel})
        }
    }
}

fn slot_json(s: &KeyslotInfo) -> Value {
    json!({
        "id": s.id,
        "kdf": s.kdf.as_ref().map(kdf_json),
        "salt": hex::encode(&s.salt),
        "af_stripes": s.stripes,
        "af_hash": s.af_hash.name(),
        "area_offset": s.area_offset,
        "area_size": s.area_size,
    })
}

/// The header as one JSON document (stable field names, for scripts and tests).
pub(crate) fn header_json(h: &dyn LuksHeader) -> Value {
    let slots: Vec<Value> = h
        .keyslots()
        .iter()
        .filter(|s| s.active)
        .map(slot_json)
        .collect();
    json!({
        "version": h.version(),
        "uuid": h.uuid(),
        "cipher": h.cipher().to_string(),
        "key_bits": h.key_len() * 8,
        "sector_size": h.sector_size(),
        "data_offset": h.data_offset(),
        "data_length": h.data_length(),
        "iv_large_sectors": h.iv_options().large_sectors,
        "header_size": h.header_size(),
        "keyslots": slots,
    })
}

/// `tcryptDump`: the decrypted header, or with `--dump-volume-key` the volume key.
fn dump_tcrypt(ctx: &Ctx, a: &DumpArgs) -> CliResult<()> {
    if a.dump_volume_key {
        crate::passphrase::confirm(
            ctx.batch,
            "Header dump with volume key is sensitive information\n\
             which allows access to encrypted partition without passphrase.\n\
             This dump should be always stored encrypted on safe place.",
        )?;
    }
    let v = a.select.tcrypt_args(&a.header, &a.key);
    let (header, data_offset) = crate::unlock::tcrypt_header(ctx, &a.device, &v)?;
    let shown = a.device.display().to_string();
    if a.dump_volume_key {
        out!("{}", header.dump_volume_key(&shown, data_offset));
    } else {
        out!("{}", header.dump(&shown));
    }
    Ok(())
}

/// cryptsetup's question before a BITLK or FVAULT2 dump with the volume key.
const VOLUME_KEY_WARNING: &str = "The header dump with volume key is sensitive information\n\
     that allows access to encrypted partition without a passphrase.\n\
     This dump should be stored encrypted in a safe place.";

/// The FVEK of a BitLocker volume from the secret `key` names (or its clear key).
pub(crate) fn bitlk_volume_key(
    ctx: &Ctx,
    device: &std::path::Path,
    key: &crate::args::KeyArgs,
) -> CliResult<(BitlkHeader, cryptblk_crypto::SecretBytes)> {
    let v = crate::args::VolumeArgs {
        key: key.clone(),
        kind: cryptblk_volume::VolumeType::Bitlk,
        read_only: true,
        ..Default::default()
    };
    let (header, secret) = crate::unlock::bitlk_secret(ctx, device, &v)?;
    let vk = header
        .volume_key(&secret)
        .map_err(|e| crate::unlock::volume_error(device, cryptblk_volume::Error::Format(e)))?;
    Ok((header, vk))
}

/// `bitlkDump`: the metadata, or with `--dump-volume-key` the volume key.
fn dump_bitlk(ctx: &Ctx, a: &DumpArgs) -> CliResult<()> {
    let shown = a.device.display().to_string();
    if !a.dump_volume_key {
        let h = cryptblk_volume::bitlk_header(&a.device, &ctx.volume_devices())
            .map_err(|e| crate::unlock::volume_error(&a.device, e))?;
        out!("{}", h.dump(&shown));
        return Ok(());
    }
    crate::passphrase::confirm(ctx.batch, VOLUME_KEY_WARNING)?;
    let (h, vk) = bitlk_volume_key(ctx, &a.device, &a.key)?;
    out!("{}", h.dump_volume_key(&shown, &vk));
    Ok(())
}

/// The volume key of a FileVault 2 volume from a passphrase (key file, a line of standard
/// input, the terminal).
pub(crate) fn fvault2_volume_key(
    ctx: &Ctx,
    device: &std::path::Path,
    key: &crate::args::KeyArgs,
) -> CliResult<(Fvault2Header, cryptblk_crypto::SecretBytes)> {
    let fail = |e| crate::unlock::volume_error(device, e);
    let header = cryptblk_volume::fvault2_header(device, &ctx.volume_devices()).map_err(fail)?;
    let pass = crate::passphrase::get_passphrase(
        &key.source(),
        &format!("Enter passphrase for {}: ", device.display()),
        false,
    )?;
    let vk = header
        .volume_key(&pass)
        .map_err(|e| fail(cryptblk_volume::Error::Format(e)))?;
    Ok((header, vk))
}

/// `fvault2Dump`: the metadata, with `--dump-volume-key` followed by the volume key.
fn dump_fvault2(ctx: &Ctx, a: &DumpArgs) -> CliResult<()> {
    let shown = a.device.display().to_string();
    if !a.dump_volume_key {
        let h = cryptblk_volume::fvault2_header(&a.device, &ctx.volume_devices())
            .map_err(|e| crate::unlock::volume_error(&a.device, e))?;
        out!("{}", h.dump(&shown));
        return Ok(());
    }
    crate::passphrase::confirm(ctx.batch, VOLUME_KEY_WARNING)?;
    let (h, vk) = fvault2_volume_key(ctx, &a.device, &a.key)?;
    out!("{}", h.dump_volume_key(&shown, &vk));
    Ok(())
}

/// Whether the device starts with a dm-integrity superblock (a standalone integrity
/// volume: `dump` then prints what `integritysetup dump` does).
fn is_integrity(ctx: &Ctx, a: &DumpArgs) -> bool {
    let mut b = [0u8; 8];
    ctx.volume_devices()
        .open(&a.device, true)
        .and_then(|d| Ok(cryptblk_format::Storage::read_at(&d, &mut b, 0)?))
        .is_ok_and(|()| b == cryptblk_format::integrity::MAGIC)
}

/// `dump` of a standalone integrity volume: its superblock, as `integritysetup dump`.
fn dump_integrity(ctx: &Ctx, a: &DumpArgs) -> CliResult<()> {
    let err = |e: String| crate::error::CliError::usage(format!("{}: {e}", a.device.display()));
    let dev = ctx
        .volume_devices()
        .open(&a.device, true)
        .map_err(|e| err(e.to_string()))?;
    let mut b = [0u8; 512];
    cryptblk_format::Storage::read_at(&dev, &mut b, 0).map_err(|e| err(e.to_string()))?;
    let sb = cryptblk_format::integrity::Superblock::parse(&b).map_err(|e| err(e.to_string()))?;
    out!("{}", sb.dump(&a.device.display().to_string()));
    Ok(())
}

/// `dump --type plain --dump-volume-key`: the key a plain mapping with these options
/// would use (`-c`, `-h`, `-s` and the key options as `open --type plain` takes them).
/// Plain mode has no header to dump; this is what `dmsetup table --showkeys` gives for a
/// mapping, without one: what converting a plain volume to LUKS in place needs.
fn dump_plain(ctx: &Ctx, a: &DumpArgs) -> CliResult<()> {
    if !a.dump_volume_key {
        return Err(crate::error::CliError::usage(
            "a plain volume has no header: dump --type plain needs --dump-volume-key",
        ));
    }
    let v = crate::args::VolumeArgs {
        key: a.key.clone(),
        kind: cryptblk_volume::VolumeType::Plain,
        cipher: a.select.cipher.clone(),
        hash: a.select.hash.clone(),
        key_size: a.key_size,
        read_only: true,
        ..Default::default()
    };
    let p = crate::unlock::plain_params(&v)?;
    crate::passphrase::confirm(ctx.batch, VOLUME_KEY_WARNING)?;
    let prompt = format!("Enter passphrase for {}: ", a.device.display());
    let key = match crate::unlock::plain_secret(&v, &p, &prompt)? {
        cryptblk_volume::Secret::KeyFile(raw) => p.key_from_keyfile(&raw, 0)?,
        cryptblk_volume::Secret::Passphrase(pass) => p.derive_key(&pass)?,
        _ => unreachable!("plain_secret gives a key file or a passphrase"),
    };
    let mut o = format!(
        "Plain dm-crypt key for {}\nCipher:        \t{}\nHash:          \t{}\nMK bits:       \t{}\n",
        a.device.display(),
        p.cipher,
        if a.key.key_file().is_some_and(|f| f.as_os_str() != "-") {
            "(none: the key file is the key)".to_string()
        } else {
            p.hash_spec()
        },
        key.len() * 8
    );
    match &a.volume_key_file {
        Some(f) => {
            write_volume_key_file(f, &key)?;
            o.push_str(&format!("Key stored to file {}.\n", f.display()));
        }
        None => o.push_str(&crate::commands::luksdump::key_lines("MK dump:", &key)),
    }
    out!("{o}");
    Ok(())
}

pub(crate) fn dump(ctx: &Ctx, a: DumpArgs) -> CliResult<()> {
    if a.select.kind == Some(cryptblk_volume::VolumeType::Plain) {
        return dump_plain(ctx, &a);
    }
    if a.select.is_bitlk() {
        return dump_bitlk(ctx, &a);
    }
    if a.select.is_fvault2() {
        return dump_fvault2(ctx, &a);
    }
    if a.select.kind == Some(cryptblk_volume::VolumeType::Integrity)
        || (a.select.kind.is_none() && a.header.header.is_none() && is_integrity(ctx, &a))
    {
        return dump_integrity(ctx, &a);
    }
    if a.select.is_tcrypt()? {
        return dump_tcrypt(ctx, &a);
    }
    let path = a
        .header
        .header
        .as_deref()
        .unwrap_or(&a.device)
        .to_path_buf();
    let mut dev = open_header(ctx, &a.device, &a.header, false)?;
    if a.unbound {
        return dump_unbound(ctx, &a, &mut dev, &path);
    }
    if a.volume_key_file.is_some() && !a.dump_volume_key {
        return Err(crate::error::CliError::usage(
            "--volume-key-file with dump needs --dump-volume-key or --unbound",
        ));
    }
    let hdr = load(&mut dev, &path)?;
    let volume_key = if a.dump_volume_key {
        // cryptsetup's question, before the passphrase is even asked for.
        crate::passphrase::confirm(
            ctx.batch,
            "Header dump with volume key is sensitive information\n\
             that allows access to encrypted partition without a passphrase.\n\
             This dump should be stored encrypted in a safe place.",
        )?;
        Some(
            super::unlock_or_token(
                &*hdr,
                &mut dev,
                &a.key,
                &a.tokens,
                &format!("Enter passphrase for {}: ", a.device.display()),
                None,
            )?
            .1,
        )
    } else {
        None
    };
    if a.json {
        let mut v = header_json(&*hdr);
        if let Some(vk) = &volume_key {
            v["volume_key"] = Value::String(hex::encode(&vk[..]));
        }
        outln!(
            "{}",
            serde_json::to_string_pretty(&v).expect("JSON serializes")
        );
        return Ok(());
    }
    let shown = path.display().to_string();
    if a.dump_json_metadata {
        if hdr.version() != 2 {
            return Err(crate::error::CliError::usage(
                "--dump-json-metadata: only LUKS2 has JSON metadata",
            ));
        }
        let h = Luks2Header::read_ignoring_requirements(&mut dev)?;
        // As cryptsetup: no newline after the closing brace.
        out!("{}", crate::commands::luksdump::json_c_pretty(h.json()));
        return Ok(());
    }
    if let Some(vk) = &volume_key {
        let mut text = crate::commands::luksdump::volume_key(
            &a.device.display().to_string(),
            &hdr.cipher().to_string(),
            hdr.data_offset() / 512,
            hdr.uuid(),
            vk,
        );
        if let Some(f) = &a.volume_key_file {
            write_volume_key_file(f, vk)?;
            // The same lines, the key itself replaced by where it went (as cryptsetup).
            let cut = text.find("MK dump:").unwrap_or(text.len());
            text.truncate(cut);
            text.push_str(&format!("Key stored to file {}.\n", f.display()));
        }
        out!("{text}");
        return Ok(());
    }
    let text = if hdr.version() == 1 {
        crate::commands::luksdump::luks1(&Luks1Header::read(&mut dev)?, &shown)
    } else {
        crate::commands::luksdump::luks2(&Luks2Header::read_ignoring_requirements(&mut dev)?)
    };
    out!("{text}");
    Ok(())
}

/// Writes a volume key to a new file, readable by its owner only; an existing file is
/// never overwritten (cryptsetup's rule: O_EXCL, mode 0400).
fn write_volume_key_file(path: &std::path::Path, key: &[u8]) -> CliResult<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| {
            crate::error::CliError::usage(format!(
                "Cannot open keyfile {} for write: {e}",
                path.display()
            ))
        })?;
    f.write_all(key).map_err(|e| crate::error::io_err(path, e))
}

/// `dump --unbound -S N`: the unbound key of keyslot N, as cryptsetup prints it.
fn dump_unbound(
    ctx: &Ctx,
    a: &DumpArgs,
    dev: &mut dyn cryptblk_format::Storage,
    path: &std::path::Path,
) -> CliResult<()> {
    let slot = a.key_slot.expect("clap requires -S with --unbound");
    let h = crate::commands::luks2_header(dev, path)?;
    if !h.unbound_keyslots().contains(&slot) {
        return Err(crate::error::CliError::usage(format!(
            "Keyslot {slot} does not contain unbound key."
        )));
    }
    let pass = confirm_then_passphrase(
        ctx,
        a,
        "The header dump with unbound key is sensitive information.\n\
         This dump should be stored encrypted in a safe place.",
    )?;
    let (_, key) = h
        .open_unbound(dev, &pass, Some(slot))
        .map_err(crate::commands::wrong_passphrase)?;
    if let Some(f) = &a.volume_key_file {
        write_volume_key_file(f, &key)?;
    }
    let mut o = format!(
        "LUKS header information for {}\nUUID:    \t{}\nKeyslot: \t{slot}\nKey bits:\t{}\n",
        a.device.display(),
        h.uuid(),
        key.len() * 8
    );
    match &a.volume_key_file {
        Some(f) => o.push_str(&format!("Key stored to file {}.\n", f.display())),
        None => o.push_str(&crate::commands::luksdump::unbound_key(&key)),
    }
    out!("{o}");
    Ok(())
}

/// cryptsetup's question before a key is shown (asked before the passphrase is even
/// read), then the passphrase.
fn confirm_then_passphrase(
    ctx: &Ctx,
    a: &DumpArgs,
    warning: &str,
) -> CliResult<cryptblk_crypto::SecretBytes> {
    crate::passphrase::confirm(ctx.batch, warning)?;
    crate::passphrase::get_passphrase(
        &a.key.source(),
        &format!("Enter passphrase for {}: ", a.device.display()),
        false,
    )
}
