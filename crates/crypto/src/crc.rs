//! CRC-32 and CRC-32C, table-driven (headers' checksums: TrueCrypt, BitLocker, FileVault 2;
//! the dm-crypt `tcw` IV).

/// CRC-32 (IEEE 802.3, as zlib computes it).
pub fn crc32(data: &[u8]) -> u32 {
    !crc32_update(!0, data)
}

/// The CRC-32 register after `data`, from `crc`, without the usual inversions (the
/// kernel's `crc32_le`, cryptsetup's `crypt_crc32`).
pub fn crc32_update(crc: u32, data: &[u8]) -> u32 {
    crc_reflected(&CRC32_TABLE, crc, data)
}

/// The CRC-32C (Castagnoli) register after `data`, from `crc`, without inversions
/// (cryptsetup's `crypt_crc32c`; Core Storage seeds it with 0xffffffff).
pub fn crc32c_update(crc: u32, data: &[u8]) -> u32 {
    crc_reflected(&CRC32C_TABLE, crc, data)
}

const CRC32_TABLE: [u32; 256] = crc_table(0xedb8_8320);
const CRC32C_TABLE: [u32; 256] = crc_table(0x82f6_3b78);

/// The byte-at-a-time table of a reflected CRC-32 with polynomial `poly`.
const fn crc_table(poly: u32) -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = (c >> 1) ^ (poly & 0u32.wrapping_sub(c & 1));
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

fn crc_reflected(table: &[u32; 256], mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc = table[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_check_value() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        // CRC-32C's check value (RFC 3720, iSCSI): inverted in and out.
        assert_eq!(!crc32c_update(!0, b"123456789"), 0xe306_9283);
    }
}
