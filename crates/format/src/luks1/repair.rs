//! `repair` of a LUKS1 header, as cryptsetup's (`LUKS_read_phdr` with repair,
//! `_keyslot_repair` in lib/luks1/keymanage.c): a header whose keyslot layout is broken,
//! whose cipher mode is `ecb-…` or whose hash name is not lowercase gets its free
//! keyslots' offsets and stripes back to the standard layout (their salt wiped), the
//! mode and hash fixed, and is written again only if the result is a valid header.
//! Active keyslots are never touched.

use super::header::Phdr;
use super::{
    ALIGN_KEYSLOTS_SECTORS, KEY_DISABLED, KEY_ENABLED, Luks1Header, MAGIC, NUM_KEYSLOTS,
    PHDR_DISK_SIZE, PHDR_SIZE, SALT_SIZE, STRIPES, af_sectors,
};
use crate::{Error, Result, Storage};
use cryptblk_crypto::{CipherSpec, HashAlg};

/// What a repair found and did, in cryptsetup's words.
#[derive(Debug, Default)]
pub struct Luks1Repair {
    /// One line per problem found or change made.
    pub messages: Vec<String>,
    /// Whether the header was written.
    pub written: bool,
}

/// Offset of keyslot `i`'s state word in the phdr.
fn state_at(i: usize) -> usize {
    208 + i * 48
}

fn manual(why: &str) -> Error {
    Error::InvalidOption(format!("{why}, manual repair required."))
}

/// Checks the LUKS1 header at the start of `dev` and repairs it as cryptsetup does.
pub fn repair(dev: &mut dyn Storage) -> Result<Luks1Repair> {
    let mut raw = [0u8; PHDR_SIZE];
    if dev.size()? < PHDR_SIZE as u64 {
        return Err(Error::NotLuks);
    }
    dev.read_at(&mut raw, 0)?;
    if &raw[..MAGIC.len()] != MAGIC {
        return Err(Error::NotLuks);
    }
    let mut out = Luks1Repair::default();
    // A state word other than ENABLED counts as a free slot, as cryptsetup reads it; one
    // that is not DISABLED either is left as it is unless the slot is repaired (as
    // cryptsetup leaves it), though this crate's loader refuses such a header.
    let mut bad_state = [false; NUM_KEYSLOTS];
    let mut parsed = raw;
    for (i, bad) in bad_state.iter_mut().enumerate() {
        let o = state_at(i);
        let state = u32::from_be_bytes(parsed[o..o + 4].try_into().expect("4"));
        if state != KEY_ENABLED && state != KEY_DISABLED {
            *bad = true;
            parsed[o..o + 4].copy_from_slice(&KEY_DISABLED.to_be_bytes());
        }
    }
    let mut phdr = Phdr::parse(&parsed)?;
    let mut problems = false;
    if phdr.cipher_mode.starts_with("ecb-") {
        out.messages
            .push(format!("LUKS cipher mode {} is invalid.", phdr.cipher_mode));
        problems = true;
    }
    if phdr.hash_spec.chars().any(|c| c.is_ascii_uppercase()) {
        out.messages
            .push(format!("LUKS hash {} is invalid.", phdr.hash_spec));
        problems = true;
    }
    if let Err(e) = phdr.validate() {
        out.messages.push(format!("{e}."));
        problems = true;
    }
    if !problems {
        // Nothing to repair, but a device too small for its keyslots is still an error
        // (cryptsetup checks the size after the header, repairing or not).
        let need = crate::LuksHeader::header_size(&super::Luks1Header::from_phdr(phdr)?);
        let have = dev.size()?;
        if have < need {
            return Err(Error::Truncated { need, have });
        }
        out.messages
            .push("No known problems detected for LUKS header.".into());
        return Ok(out);
    }
    if ![16, 32, 64].contains(&phdr.key_bytes) {
        return Err(manual("Non standard key size"));
    }
    if u64::from(phdr.slots[0].key_material_offset) < ALIGN_KEYSLOTS_SECTORS {
        return Err(manual("Non standard keyslots alignment"));
    }
    if phdr.cipher_mode.starts_with("ecb-") {
        out.messages.push(format!(
            "Cipher mode repaired ({} -> ecb).",
            phdr.cipher_mode
        ));
        phdr.cipher_mode = "ecb".into();
    }
    if phdr.hash_spec.chars().any(|c| c.is_ascii_uppercase()) {
        phdr.hash_spec = phdr.hash_spec.to_ascii_lowercase();
        out.messages.push(format!(
            "Cipher hash repaired to lowercase ({}).",
            phdr.hash_spec
        ));
        HashAlg::from_name(&phdr.hash_spec).map_err(|_| {
            Error::InvalidOption(format!(
                "Requested LUKS hash {} is not supported.",
                phdr.hash_spec
            ))
        })?;
    }
    let cipher = CipherSpec::from_parts(&phdr.cipher_name, &phdr.cipher_mode)
        .ok()
        .filter(|c| c.valid_key_len(phdr.key_bytes as usize))
        .ok_or_else(|| {
            Error::InvalidOption(format!(
                "cipher {}-{} with a {}-byte key cannot be used, repair failed.",
                phdr.cipher_name, phdr.cipher_mode, phdr.key_bytes
            ))
        })?;
    let _ = cipher;
    out.messages.push("Repairing keyslots.".into());
    // The standard layout for this key size (cryptsetup builds a second header with the
    // same parameters to compare with).
    let slot_sectors = af_sectors(phdr.key_bytes as usize, STRIPES);
    let mut standard = [0u32; NUM_KEYSLOTS];
    let mut end = ALIGN_KEYSLOTS_SECTORS;
    for o in standard.iter_mut() {
        *o = end as u32;
        end = (end + slot_sectors).next_multiple_of(ALIGN_KEYSLOTS_SECTORS);
    }
    for (i, slot) in phdr.slots.iter_mut().enumerate() {
        if slot.active {
            continue;
        }
        let mut bad = false;
        if slot.key_material_offset != standard[i] {
            out.messages.push(format!(
                "Keyslot {i}: offset repaired ({} -> {}).",
                slot.key_material_offset, standard[i]
            ));
            slot.key_material_offset = standard[i];
            bad = true;
        }
        if slot.stripes != STRIPES {
            out.messages.push(format!(
                "Keyslot {i}: stripes repaired ({} -> {STRIPES}).",
                slot.stripes
            ));
            slot.stripes = STRIPES;
            bad = true;
        }
        // A DOS partition table's signature over keyslot 6 (a known accident).
        if i == 6 && raw[0x1fe] == 0x55 && raw[0x1ff] == 0xaa {
            out.messages
                .push(format!("Keyslot {i}: bogus partition signature."));
            bad = true;
        }
        if bad {
            out.messages.push(format!("Keyslot {i}: salt wiped."));
            slot.salt = [0; SALT_SIZE];
            slot.iterations = 0;
            bad_state[i] = false;
        }
    }
    // Checked before writing: a repair cannot fix out-of-order areas and must not write
    // a header that is still broken.
    let mut bytes = phdr.to_bytes();
    Luks1Header::from_bytes(&bytes).map_err(|e| {
        Error::InvalidOption(format!("Repair failed: the header is still invalid ({e})."))
    })?;
    for (i, _) in bad_state.iter().enumerate().filter(|(_, b)| **b) {
        let o = state_at(i);
        bytes[o..o + 4].copy_from_slice(&raw[o..o + 4]);
    }
    if bytes != raw {
        out.messages.push("Writing LUKS header to disk.".into());
        let mut buf = [0u8; PHDR_DISK_SIZE as usize];
        dev.read_at(&mut buf, 0)?;
        buf[..PHDR_SIZE].copy_from_slice(&bytes);
        dev.write_at(&buf, 0)?;
        dev.sync()?;
        out.written = true;
    }
    Ok(out)
}
