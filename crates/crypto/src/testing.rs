//! Entry points for known-answer tests whose data units are not dm-crypt sectors.

use crate::block::BlockKey;
use crate::spec::BlockCipherAlg;
use crate::{Backend, Error, Result};

/// XTS-AES over one data unit of any multiple of 16 bytes, with a raw 16-byte tweak input
/// `iv` (IEEE 1619's i), on the given backend. For NIST XTSVS / IEEE 1619 vectors.
pub fn xts_data_unit(
    backend: Backend,
    key: &[u8],
    iv: [u8; 16],
    data: &mut [u8],
    encrypt: bool,
) -> Result<()> {
    if !matches!(key.len(), 32 | 48 | 64) {
        return Err(Error::InvalidKeyLength {
            cipher: "aes-xts".into(),
            len: key.len(),
        });
    }
    if data.is_empty() || !data.len().is_multiple_of(16) {
        return Err(Error::UnalignedLength {
            len: data.len(),
            sector_size: 16,
        });
    }
    if !backend.is_supported() {
        return Err(Error::BackendUnavailable(backend.to_string()));
    }
    let (k1, k2) = key.split_at(key.len() / 2);
    let mut ivs = [iv];
    let unit = data.len();
    if let Some(fast) =
        crate::backend::x86::XtsKeys::new(k1, k2).filter(|_| backend != Backend::Generic)
    {
        fast.xts(backend, &mut ivs, data, unit, encrypt);
        return Ok(());
    }
    crate::modes::xts_generic(
        &BlockKey::new(BlockCipherAlg::Aes, k1)?,
        &BlockKey::new(BlockCipherAlg::Aes, k2)?,
        &mut ivs,
        data,
        unit,
        encrypt,
    );
    Ok(())
}
