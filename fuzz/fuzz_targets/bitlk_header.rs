//! The BitLocker metadata parser: the input is a flag byte and an image (boot sector,
//! FVE metadata at the offsets it names). Flag bits make the boot signature, the
//! superblock's offsets (all 4096) and the FVE block signature valid so that the entry
//! lists are reached; seeds are the real metadata of cryptsetup's test images moved to
//! 4096. `read`, `dump`, `segments`, and the key search with no secret (clear keys) and
//! with the input as a startup key file must give an answer or an error, never a panic.
//! No passphrase is ever tried (its key stretching takes 0.1 s).
#![no_main]

use cryptblk_format::MemStorage;
use cryptblk_format::bitlk::BitlkHeader;
use libfuzzer_sys::fuzz_target;

const META: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut image = rest.to_vec();
    if image.len() < META + 112 {
        image.resize(META + 112, 0);
    }
    if flags & 1 != 0 {
        image[..3].copy_from_slice(b"\xeb\x58\x90");
        image[3..11].copy_from_slice(b"-FVE-FS-");
        image[11..13].copy_from_slice(&512u16.to_le_bytes());
    }
    if flags & 2 != 0 {
        for i in 0..3 {
            image[160 + 16 + 8 * i..160 + 24 + 8 * i].copy_from_slice(&(META as u64).to_le_bytes());
        }
    }
    if flags & 4 != 0 {
        image[META..META + 8].copy_from_slice(b"-FVE-FS-");
        image[META + 10..META + 12].copy_from_slice(&2u16.to_le_bytes());
    }
    let dev = MemStorage::from_vec(image);
    let Ok(h) = BitlkHeader::read(&dev) else {
        return;
    };
    let _ = h.dump("fuzz");
    let _ = h.check_mappable();
    let _ = h.segments(rest.len() as u64);
    let _ = h.segments(1 << 30);
    let _ = h.volume_key(b"");
    // Not UTF-8, so never a passphrase or recovery password: only startup key parsing.
    if std::str::from_utf8(rest).is_err() {
        let _ = h.volume_key(rest);
    }
});
