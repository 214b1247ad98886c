//! Helpers shared by the fuzz targets: what to do with a header that parsed, and how to
//! give the fuzzer valid LUKS2 checksums so that it gets past them.

use cryptblk_crypto::{HashAlg, Kdf};
use cryptblk_format::luks2::{HDR_SIZES, Luks2Header};
use cryptblk_format::{LuksHeader, MemStorage, Storage};
use serde_json::Value;

/// The passphrase of every seed image (fuzz/seed.sh), so the fuzzer can reach the
/// "passphrase accepted" paths.
pub const PASSPHRASE: &[u8] = b"fuzz";

/// Highest KDF costs the targets still pay for an unlock attempt (the seeds use the
/// minimum); anything dearer is only parsed, so the fuzzer is not stuck in PBKDF2.
const MAX_ITERATIONS: u32 = 4000;
const MAX_ARGON2_KIB: u32 = 256;

fn cheap(kdf: &Kdf) -> bool {
    match *kdf {
        Kdf::Pbkdf2 { iterations, .. } => iterations <= MAX_ITERATIONS,
        Kdf::Argon2 {
            time,
            memory_kib,
            parallel,
            ..
        } => time <= 4 && memory_kib <= MAX_ARGON2_KIB && parallel <= 4,
    }
}

/// Everything read-only a caller may do with a loaded header, plus an unlock attempt when
/// it is cheap. Must never panic.
pub fn exercise(h: &dyn LuksHeader, dev: &mut MemStorage, digest_iterations: Option<u32>) {
    let _ = format!("{h:?}");
    let _ = (
        h.uuid(),
        h.cipher().to_string(),
        h.key_len(),
        h.sector_size(),
    );
    let _ = (
        h.iv_options(),
        h.data_offset(),
        h.data_length(),
        h.header_size(),
    );
    let slots = h.keyslots();
    let dev_len = dev.len();
    let affordable = digest_iterations.is_some_and(|i| i <= MAX_ITERATIONS)
        && slots.iter().filter(|k| k.active).all(|k| {
            k.kdf.as_ref().is_none_or(cheap)
                && k.area_offset
                    .checked_add(k.area_size)
                    .is_some_and(|e| e <= dev_len)
        });
    if affordable {
        let _ = h.unlock(dev, PASSPHRASE, None);
        if let Some(k) = slots.iter().find(|k| k.active) {
            let _ = h.unlock(dev, b"wrong", Some(k.id));
        }
        let _ = h.verify_volume_key(&[0u8; 64]);
    }
}

/// Largest PBKDF2 iteration count among the LUKS2 digests (None if there is none).
pub fn luks2_digest_iterations(h: &Luks2Header) -> Option<u32> {
    let digests = h.json().get("digests")?.as_object()?;
    digests
        .values()
        .map(|d| {
            d.get("iterations")
                .and_then(Value::as_u64)
                .unwrap_or(u64::MAX)
        })
        .max()
        .map(|i| u32::try_from(i).unwrap_or(u32::MAX))
}

/// Changes a header we accepted and checks that we accept what we wrote: killing a slot
/// and changing the label must leave a readable header that says so.
pub fn luks2_roundtrip(h: &Luks2Header, dev: &MemStorage) {
    if let Some(k) = h.keyslots().first() {
        let mut d = dev.clone();
        let mut h2 = h.clone();
        if h2.kill_keyslot(&mut d, k.id).is_ok() {
            let r = Luks2Header::read(&mut d).expect("header we wrote after kill must read back");
            assert!(
                !r.keyslots().iter().any(|s| s.id == k.id),
                "killed slot still listed"
            );
            assert_eq!(r.seqid(), h.seqid() + 1);
        }
    }
    let mut d = dev.clone();
    let mut h2 = h.clone();
    if h2.set_label(&mut d, Some("fuzz-label")).is_ok() {
        let r = Luks2Header::read(&mut d).expect("header we wrote after set_label must read back");
        assert_eq!(r.label(), "fuzz-label");
        assert_eq!(r.json(), h.json(), "label change altered the JSON");
    }
}

const OFF_CSUM: usize = 448;

/// Recomputes the sha256 checksum of a LUKS2 header copy at `off` whose binary header
/// names a valid size and the sha256 algorithm (so mutated JSON is actually parsed).
pub fn fix_luks2_checksum(img: &mut [u8], off: usize) {
    let Some(b) = img.get(off..off + 4096) else {
        return;
    };
    let size = u64::from_be_bytes(b[8..16].try_into().unwrap());
    if !HDR_SIZES.contains(&size) || &b[72..79] != b"sha256\0" {
        return;
    }
    let Some(area) = img.get_mut(off..off + size as usize) else {
        return;
    };
    area[OFF_CSUM..OFF_CSUM + 64].fill(0);
    let mut sum = [0u8; 32];
    HashAlg::Sha256.digest_parts(&[area], &mut sum);
    area[OFF_CSUM..OFF_CSUM + 32].copy_from_slice(&sum);
}

/// Runs a LUKS2 image through the reader and, if accepted, everything above.
pub fn luks2_image(img: Vec<u8>) {
    let mut dev = MemStorage::from_vec(img);
    let _ = cryptblk_format::load_header(&mut dev);
    match Luks2Header::read_ignoring_requirements(&mut dev) {
        Ok(h) => {
            let _ = (
                h.tokens(),
                h.copy_status(),
                h.copies_in_sync(),
                h.requirements(),
            );
            exercise(&h, &mut dev, luks2_digest_iterations(&h));
            if h.requirements().is_empty() {
                luks2_roundtrip(&h, &dev);
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    // Reading must never write.
    let _ = dev.size();
}
