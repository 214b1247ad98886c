//! Key material of one LUKS1 keyslot: PBKDF2 of the passphrase, the AF-split volume key
//! encrypted with the volume cipher (512-byte sectors, IV sector 0 at the area start).

use super::{SECTOR_SIZE, af_sectors};
use crate::Result;
use crate::Storage;
use cryptblk_crypto::{
    CipherSpec, HashAlg, IvOptions, Kdf, SecretBytes, SectorCipher, af_merge, af_split,
};

/// Everything needed to read or write one slot's material.
pub(crate) struct SlotCrypto<'a> {
    pub cipher: CipherSpec,
    pub hash: HashAlg,
    pub key_bytes: usize,
    pub iterations: u32,
    pub salt: &'a [u8],
    pub stripes: u32,
    /// Start of the area, in 512-byte sectors.
    pub offset_sectors: u32,
}

impl SlotCrypto<'_> {
    fn area_len(&self) -> usize {
        (af_sectors(self.key_bytes, self.stripes) * SECTOR_SIZE) as usize
    }

    fn area_offset(&self) -> u64 {
        u64::from(self.offset_sectors) * SECTOR_SIZE
    }

    /// The keyslot's key: PBKDF2(hash, passphrase, salt, iterations), `key_bytes` long.
    fn slot_cipher(&self, passphrase: &[u8]) -> Result<SectorCipher> {
        let kdf = Kdf::Pbkdf2 {
            hash: self.hash,
            iterations: self.iterations,
        };
        let mut derived = SecretBytes::zeroed(self.key_bytes);
        kdf.derive(passphrase, self.salt, &mut derived)?;
        Ok(SectorCipher::new(
            self.cipher,
            &derived,
            SECTOR_SIZE as u32,
            IvOptions::default(),
        )?)
    }

    /// Decrypts the area and merges the stripes: the candidate volume key.
    pub(super) fn open(&self, dev: &mut dyn Storage, passphrase: &[u8]) -> Result<SecretBytes> {
        let cipher = self.slot_cipher(passphrase)?;
        let mut material = SecretBytes::zeroed(self.area_len());
        dev.read_at(&mut material, self.area_offset())?;
        cipher.decrypt(0, &mut material)?;
        Ok(af_merge(
            &material,
            self.key_bytes,
            self.stripes,
            self.hash,
        )?)
    }

    /// Splits, encrypts and writes `volume_key` into the area, then syncs.
    pub(super) fn store(
        &self,
        dev: &mut dyn Storage,
        volume_key: &[u8],
        passphrase: &[u8],
    ) -> Result<()> {
        let cipher = self.slot_cipher(passphrase)?;
        let split = af_split(volume_key, self.stripes, self.hash)?;
        // The tail of the last sector stays zero before encryption, as in cryptsetup.
        let mut material = SecretBytes::zeroed(self.area_len());
        material[..split.len()].copy_from_slice(&split);
        cipher.encrypt(0, &mut material)?;
        dev.write_at(&material, self.area_offset())?;
        dev.sync()?;
        Ok(())
    }
}

/// Overwrites `len` bytes at `offset` with random data, 1 MiB at a time.
pub(crate) fn wipe_random(dev: &mut dyn Storage, offset: u64, len: u64) -> Result<()> {
    wipe(dev, offset, len, true)
}

/// Overwrites `len` bytes at `offset` with zeros, 1 MiB at a time.
pub(crate) fn wipe_zero(dev: &mut dyn Storage, offset: u64, len: u64) -> Result<()> {
    wipe(dev, offset, len, false)
}

fn wipe(dev: &mut dyn Storage, offset: u64, len: u64, random: bool) -> Result<()> {
    const BLOCK: u64 = 1024 * 1024;
    let mut buf = vec![0u8; BLOCK.min(len) as usize];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(BLOCK) as usize;
        if random {
            cryptblk_crypto::random_bytes(&mut buf[..n])?;
        }
        dev.write_at(&buf[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}
