//! LUKS2 binary headers + JSON areas + keyslot areas: the input is a whole header image.
//! The first byte chooses whether the checksums are recomputed (bit 0: primary, bit 1:
//! secondary), so the fuzzer explores both the checksum checks and what lies behind them.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, img)) = data.split_first() else {
        return;
    };
    let mut img = img.to_vec();
    if flags & 1 != 0 {
        cryptblk_fuzz::fix_luks2_checksum(&mut img, 0);
    }
    if flags & 2 != 0 && img.len() >= 16 {
        // The secondary copy sits at the primary's hdr_size (or any valid size if the
        // primary is gone).
        let size = u64::from_be_bytes(img[8..16].try_into().unwrap());
        let off = if cryptblk_format::luks2::HDR_SIZES.contains(&size) {
            size as usize
        } else {
            0x4000
        };
        cryptblk_fuzz::fix_luks2_checksum(&mut img, off);
    }
    cryptblk_fuzz::luks2_image(img);
});
