//! `UnitCipher`: one data unit of any length with an explicit IV, for on-disk headers
//! encrypted outside the sector scheme (TrueCrypt/VeraCrypt's 448-byte header).

use crate::block::BlockKey;
use crate::modes::{LrwTable, cbc_generic_n, lrw, xts_generic};
use crate::secret::LockedBox;
use crate::spec::{BlockCipherAlg, ChainMode};
use crate::{Error, Result};

/// A block cipher in a chaining mode over one unit.
pub struct UnitCipher {
    mode: ChainMode,
    key: BlockKey,
    /// XTS's tweak key.
    tweak: Option<BlockKey>,
    /// LRW's tweak table.
    lrw: Option<LockedBox<LrwTable>>,
}

impl std::fmt::Debug for UnitCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnitCipher")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl UnitCipher {
    /// `alg` in `mode` with `key`: for XTS two cipher keys (data, tweak), for LRW the
    /// cipher key then 16 bytes of tweak key, otherwise the cipher key.
    pub fn new(alg: BlockCipherAlg, mode: ChainMode, key: &[u8]) -> Result<Self> {
        // Key schedules are built on this thread's stack: in frames of their own, wiped
        // after.
        crate::secret::scrubbed(|| Self::build(alg, mode, key))
    }

    fn build(alg: BlockCipherAlg, mode: ChainMode, key: &[u8]) -> Result<Self> {
        let bad = || Error::InvalidKeyLength {
            cipher: format!("{}-{mode:?}", alg.name()),
            len: key.len(),
        };
        let c = match mode {
            ChainMode::Xts => {
                if alg.block_size() != 16 || !key.len().is_multiple_of(2) {
                    return Err(bad());
                }
                let (k1, k2) = key.split_at(key.len() / 2);
                UnitCipher {
                    mode,
                    key: BlockKey::new(alg, k1)?,
                    tweak: Some(BlockKey::new(alg, k2)?),
                    lrw: None,
                }
            }
            ChainMode::Lrw => {
                if alg.block_size() != 16 || key.len() <= 16 {
                    return Err(bad());
                }
                let (k, t) = key.split_at(key.len() - 16);
                UnitCipher {
                    mode,
                    key: BlockKey::new(alg, k)?,
                    tweak: None,
                    lrw: Some(LrwTable::locked(t.try_into().expect("16 bytes"))?),
                }
            }
            ChainMode::Cbc | ChainMode::Ecb => UnitCipher {
                mode,
                key: BlockKey::new(alg, key)?,
                tweak: None,
                lrw: None,
            },
        };
        Ok(c)
    }

    /// CBC over a chain of ciphers applied to each block in turn (TrueCrypt's "inner"
    /// cascades): `layers[0]` encrypts first.
    pub fn cbc_chain(layers: &[(BlockCipherAlg, &[u8])]) -> Result<Self> {
        let keys = crate::secret::scrubbed(|| {
            layers
                .iter()
                .map(|(alg, k)| BlockKey::new(*alg, k))
                .collect::<Result<Vec<_>>>()
        })?;
        Ok(UnitCipher {
            mode: ChainMode::Cbc,
            key: BlockKey::Chain(keys),
            tweak: None,
            lrw: None,
        })
    }

    /// Block size in bytes (the IV's length for CBC).
    pub fn block_size(&self) -> usize {
        self.key.block_size()
    }

    /// Encrypts `data` (whole blocks) in place with `iv` (XTS: the tweak input; LRW: the
    /// first block's index, big-endian; CBC: the IV, one block; ECB: ignored).
    pub fn encrypt(&self, iv: &[u8], data: &mut [u8]) -> Result<()> {
        self.process(iv, data, true)
    }

    /// Decrypts `data` (whole blocks) in place; see [`UnitCipher::encrypt`].
    pub fn decrypt(&self, iv: &[u8], data: &mut [u8]) -> Result<()> {
        self.process(iv, data, false)
    }

    fn process(&self, iv: &[u8], data: &mut [u8], enc: bool) -> Result<()> {
        crate::secret::guard_stack();
        let bs = self.block_size();
        if data.is_empty() || !data.len().is_multiple_of(bs) {
            return Err(Error::UnalignedLength {
                len: data.len(),
                sector_size: bs as u32,
            });
        }
        let mut ivs = [[0u8; 16]];
        if self.mode != ChainMode::Ecb {
            if iv.len() != bs {
                return Err(Error::InvalidKeyLength {
                    cipher: "IV".into(),
                    len: iv.len(),
                });
            }
            ivs[0][..bs].copy_from_slice(iv);
        }
        let unit = data.len();
        match (&self.mode, &self.tweak, &self.lrw) {
            (ChainMode::Xts, Some(t), _) => xts_generic(&self.key, t, &mut ivs, data, unit, enc),
            (ChainMode::Lrw, _, Some(table)) => lrw(&self.key, table, &ivs, data, unit, enc),
            (ChainMode::Cbc, _, _) => cbc_generic_n(&self.key, bs, &ivs, data, unit, enc),
            _ if enc => self.key.encrypt_blocks(data),
            _ => self.key.decrypt_blocks(data),
        }
        crate::secret::wipe_blocks(&mut ivs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A unit of 448 bytes (TCRYPT's header) through XTS with tweak 0 equals the first
    /// 448 bytes of a 512-byte `aes-xts-plain64` sector 0 (XTS is prefix-preserving for
    /// whole blocks).
    #[test]
    fn xts_unit_matches_sector_prefix() {
        let key: Vec<u8> = (0..64u8).collect();
        let pt: Vec<u8> = (0..512u32).map(|i| (i * 7) as u8).collect();
        let spec = crate::CipherSpec::parse("serpent-xts-plain64").unwrap();
        let c = crate::SectorCipher::new(spec, &key, 512, Default::default()).unwrap();
        let mut sector = pt.clone();
        c.encrypt(0, &mut sector).unwrap();
        let u = UnitCipher::new(BlockCipherAlg::Serpent, ChainMode::Xts, &key).unwrap();
        let mut unit = pt[..448].to_vec();
        u.encrypt(&[0; 16], &mut unit).unwrap();
        assert_eq!(unit, sector[..448]);
        u.decrypt(&[0; 16], &mut unit).unwrap();
        assert_eq!(unit, pt[..448]);
    }
}
