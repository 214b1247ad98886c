//! The FileVault 2 (Core Storage) metadata parser. The input is a flag byte and an image
//! laid out as the seeds are: volume header at 0, disk label at 4096, volume groups
//! descriptor at 12288, encrypted metadata from 16384 in 8 KiB blocks. Flag bits make the
//! volume header and the disk label valid (magic, sizes, offsets, CRC-32C) and treat the
//! metadata blocks as plaintext to checksum and encrypt under the header's key, so the
//! fuzzer reaches the plist parser; seeds are the decrypted metadata of cryptsetup's test
//! image. `read`, `dump`, and (for cheap PBKDF2 counts only) the key search must give an
//! answer or an error, never a panic.
#![no_main]

use cryptblk_crypto::{BlockCipherAlg, ChainMode, UnitCipher, crc32c_update};
use cryptblk_format::MemStorage;
use cryptblk_format::fvault2::Fvault2Header;
use libfuzzer_sys::fuzz_target;

const BS: usize = 4096;
const BLOCK: usize = 8192;
const META: usize = 4 * BS;

fn seal(b: &mut [u8]) {
    b[4..8].copy_from_slice(&0xffff_ffffu32.to_le_bytes());
    let crc = crc32c_update(!0, &b[8..]);
    b[..4].copy_from_slice(&crc.to_le_bytes());
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut image = rest.to_vec();
    let blocks = (flags >> 4) as usize & 7;
    if image.len() < META + blocks * BLOCK {
        image.resize(META + blocks * BLOCK, 0);
    }
    if flags & 1 != 0 {
        image[8..10].copy_from_slice(&1u16.to_le_bytes());
        image[88..90].copy_from_slice(b"CS");
        image[96..100].copy_from_slice(&(BS as u32).to_le_bytes());
        image[104..112].copy_from_slice(&1u64.to_le_bytes());
        image[168..172].copy_from_slice(&16u32.to_le_bytes());
        seal(&mut image[..512]);
    }
    if flags & 2 != 0 {
        image[BS + 220..BS + 224].copy_from_slice(&(BLOCK as u32).to_le_bytes());
        seal(&mut image[BS..BS + BLOCK]);
        let vg = BS + BLOCK;
        image[vg + 8..vg + 16].copy_from_slice(&(blocks as u64).to_le_bytes());
        image[vg + 32..vg + 40].copy_from_slice(&4u64.to_le_bytes());
    }
    if flags & 4 != 0 {
        let key = [&image[176..192], &image[304..320]].concat();
        let xts = UnitCipher::new(BlockCipherAlg::Aes, ChainMode::Xts, &key).expect("32-byte key");
        for i in 0..blocks {
            let b = &mut image[META + i * BLOCK..META + (i + 1) * BLOCK];
            seal(b);
            let mut tweak = [0u8; 16];
            tweak[0] = i as u8;
            xts.encrypt(&tweak, b).expect("whole blocks");
        }
    }
    let dev = MemStorage::from_vec(image);
    let Ok(h) = Fvault2Header::read(&dev) else {
        return;
    };
    let _ = h.dump("fuzz");
    let _ = h.sector_cipher(&[0u8; 32]);
    if h.passphrase_keks.iter().all(|k| k.iterations <= 16) {
        let _ = h.volume_key(b"fuzz");
    }
});
