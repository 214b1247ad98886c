//! `dump`: what cryptsetup luksDump shows, as text or JSON.

use crate::commands::{Ctx, DumpArgs, load, open_header};
use crate::error::CliResult;
use cryptblk_crypto::Kdf;
use cryptblk_format::{KeyslotInfo, LuksHeader};
use serde_json::{Value, json};

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

fn kdf_text(k: &Kdf) -> String {
    match k {
        Kdf::Pbkdf2 { hash, iterations } => {
            format!("pbkdf2\n\tHash:       {hash}\n\tIterations: {iterations}")
        }
        Kdf::Argon2 {
            variant,
            time,
            memory_kib,
            parallel,
        } => format!(
            "{}\n\tTime cost:  {time}\n\tMemory:     {memory_kib}\n\tThreads:    {parallel}",
            variant.name()
        ),
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
pub fn header_json(h: &dyn LuksHeader) -> Value {
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

pub fn dump(ctx: &Ctx, a: DumpArgs) -> CliResult<()> {
    let path = a
        .header
        .header
        .as_deref()
        .unwrap_or(&a.device)
        .to_path_buf();
    let mut dev = open_header(&a.device, &a.header, false)?;
    let hdr = load(&mut dev, &path)?;
    let volume_key = if a.dump_volume_key {
        // cryptsetup's question, before the passphrase is even asked for.
        crate::passphrase::confirm(
            ctx.batch,
            "Header dump with volume key is sensitive information\n\
             that allows access to encrypted partition without a passphrase.\n\
             This dump should be stored encrypted in a safe place.",
        )?;
        let pass = crate::passphrase::get_passphrase(
            &a.key.source(),
            &format!("Enter passphrase for {}: ", a.device.display()),
            false,
        )?;
        Some(
            hdr.unlock(&mut dev, &pass, None)
                .map_err(|e| match e {
                    cryptblk_format::Error::WrongPassphrase => crate::error::CliError::new(
                        crate::error::EXIT_PERMISSION,
                        "No key available with this passphrase.",
                    ),
                    e => e.into(),
                })?
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
        println!(
            "{}",
            serde_json::to_string_pretty(&v).expect("JSON serializes")
        );
        return Ok(());
    }
    println!("LUKS header information for {}\n", path.display());
    println!("Version:       \t{}", hdr.version());
    println!("UUID:          \t{}", hdr.uuid());
    println!("Cipher:        \t{}", hdr.cipher());
    println!("Key size:      \t{} bits", hdr.key_len() * 8);
    println!("Sector size:   \t{}", hdr.sector_size());
    println!("Data offset:   \t{} [bytes]", hdr.data_offset());
    match hdr.data_length() {
        Some(n) => println!("Data length:   \t{n} [bytes]"),
        None => println!("Data length:   \t(whole device)"),
    }
    println!("\nKeyslots:");
    for s in hdr.keyslots() {
        if !s.active {
            if hdr.version() == 1 {
                println!("  {}: DISABLED", s.id);
            }
            continue;
        }
        println!("  {}: ENABLED", s.id);
        if let Some(k) = &s.kdf {
            println!("\tPBKDF:      {}", kdf_text(k));
        }
        println!("\tSalt:       {}", hex::encode(&s.salt));
        println!("\tAF stripes: {}", s.stripes);
        println!("\tAF hash:    {}", s.af_hash);
        println!("\tArea offset:{} [bytes]", s.area_offset);
        println!("\tArea length:{} [bytes]", s.area_size);
    }
    if let Some(vk) = &volume_key {
        println!("\nVolume key:    \t{}", hex::encode(&vk[..]));
    }
    Ok(())
}
