//! Other formats' signatures on a device (what blkid's fast probe finds), for the one
//! decision that needs them: cryptsetup will not rebuild a damaged LUKS2 header copy
//! from the other while another signature is on the device (whoever wrote it may own the
//! device now; rebuilding would destroy what they wrote).

use crate::Storage;

/// `(what, byte offset, magic)`: a signature is there when `magic` is at `offset`.
const MAGICS: &[(&str, u64, &[u8])] = &[
    // LVM2 physical volume label ("LABELONE", its type "LVM2 001" 24 bytes on) in the
    // second, third or fourth sector (the first holds LUKS's magic).
    ("LVM2_member", 512, b"LABELONE\x01\0\0\0"),
    ("LVM2_member", 1024, b"LABELONE\x02\0\0\0"),
    ("LVM2_member", 1536, b"LABELONE\x03\0\0\0"),
    // ext2/3/4 superblock magic (0xEF53, little-endian) at 1024 + 56.
    ("ext4", 1080, &[0x53, 0xef]),
    ("btrfs", 65536 + 64, b"_BHRfS_M"),
    ("xfs", 0, b"XFSB"),
    // Linux swap (4 KiB pages), its signature at the end of the first page.
    ("swap", 4096 - 10, b"SWAPSPACE2"),
    // Linux MD RAID superblock 1.1 (at 0) and 1.2 (at 4 KiB), magic a92b4efc LE.
    ("linux_raid_member", 0, &[0xfc, 0x4e, 0x2b, 0xa9]),
    ("linux_raid_member", 4096, &[0xfc, 0x4e, 0x2b, 0xa9]),
    // GPT header in the second sector.
    ("gpt", 512, b"EFI PART"),
];

/// The first other signature found on `dev`, if any.
pub(crate) fn foreign_signature(dev: &dyn Storage) -> Option<&'static str> {
    let size = dev.size().ok()?;
    MAGICS.iter().find_map(|&(what, off, magic)| {
        let end = off.checked_add(magic.len() as u64)?;
        if end > size {
            return None;
        }
        let mut buf = vec![0u8; magic.len()];
        dev.read_at(&mut buf, off).ok()?;
        (buf == magic).then_some(what)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemStorage;

    #[test]
    fn finds_each_magic_and_nothing_on_zeros() {
        let dev = MemStorage::new(1 << 20);
        assert_eq!(foreign_signature(&dev), None);
        for &(what, off, magic) in MAGICS {
            let dev = MemStorage::new(1 << 20);
            dev.write_at(magic, off).unwrap();
            assert_eq!(foreign_signature(&dev), Some(what), "{what} at {off}");
        }
        // A device too small to hold a signature's place is not misread.
        assert_eq!(foreign_signature(&MemStorage::new(100)), None);
    }
}
