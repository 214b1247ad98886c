//! The LUKS2 JSON metadata loader: the input is the JSON text; this target wraps it in two
//! valid binary headers with correct checksums (16 KiB copies, or larger if needed) and a
//! keyslots area, so every input reaches the JSON parser and validator.
#![no_main]

use cryptblk_format::luks2::HDR_SIZES;
use libfuzzer_sys::fuzz_target;

fn bin_header(secondary: bool, hdr_size: u64, seqid: u64) -> [u8; 4096] {
    let mut b = [0u8; 4096];
    b[..6].copy_from_slice(if secondary {
        b"SKUL\xba\xbe"
    } else {
        b"LUKS\xba\xbe"
    });
    b[6..8].copy_from_slice(&2u16.to_be_bytes());
    b[8..16].copy_from_slice(&hdr_size.to_be_bytes());
    b[16..24].copy_from_slice(&seqid.to_be_bytes());
    b[72..78].copy_from_slice(b"sha256");
    b[168..204].copy_from_slice(b"a3b2c5d4-0000-4000-8000-000000000001");
    let off = if secondary { hdr_size } else { 0 };
    b[256..264].copy_from_slice(&off.to_be_bytes());
    b
}

fuzz_target!(|data: &[u8]| {
    // The JSON ends at the first NUL; what follows a NUL would be ignored anyway.
    let text = &data[..data.iter().position(|&c| c == 0).unwrap_or(data.len())];
    let Some(&hdr_size) = HDR_SIZES.iter().find(|&&s| (text.len() as u64) < s - 4096) else {
        return;
    };
    let hs = hdr_size as usize;
    // Keyslot material of the seeds lies right after the two copies; give it 256 KiB.
    let mut img = vec![0u8; 2 * hs + (256 << 10)];
    for (i, off) in [0, hs].into_iter().enumerate() {
        img[off..off + 4096].copy_from_slice(&bin_header(i == 1, hdr_size, 7));
        img[off + 4096..off + 4096 + text.len()].copy_from_slice(text);
        cryptblk_fuzz::fix_luks2_checksum(&mut img, off);
    }
    cryptblk_fuzz::luks2_image(img);
});
