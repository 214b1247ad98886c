//! Hand-written AES-NI and VAES/AVX-512 sector code.
//!
//! The point of these paths is batching: every sector of a request goes through one call,
//! tweaks are computed in vector registers, and several blocks (and, for CBC encryption,
//! several sectors) are in flight at once so the AES units never wait on one chain.
//! Only 128- and 256-bit AES keys have fast paths; AES-192 uses the generic backend.

// Vector code indexes parallel register arrays (blocks, tweaks, keys) by position.
#![allow(clippy::needless_range_loop)]

use crate::Backend;
use crate::secret::LockedBox;

#[cfg(target_arch = "x86_64")]
mod keys;
#[cfg(target_arch = "x86_64")]
mod ni;
#[cfg(target_arch = "x86_64")]
mod vaes;

#[cfg(target_arch = "x86_64")]
use keys::RoundKeys;

/// Round keys of both XTS halves for the vector paths.
pub(crate) struct XtsKeys {
    #[cfg(target_arch = "x86_64")]
    data: RoundKeys,
    #[cfg(target_arch = "x86_64")]
    tweak: RoundKeys,
}

/// Round keys of one AES key (CBC) for the vector paths.
pub(crate) struct AesKeys {
    #[cfg(target_arch = "x86_64")]
    key: RoundKeys,
}

#[cfg(target_arch = "x86_64")]
impl XtsKeys {
    /// `None` when the CPU lacks AES-NI or the key size has no fast path. Expanded in place
    /// on locked pages of their own.
    pub(crate) fn new(k1: &[u8], k2: &[u8]) -> Option<LockedBox<Self>> {
        let blank = XtsKeys {
            data: RoundKeys::blank(),
            tweak: RoundKeys::blank(),
        };
        LockedBox::new_with(blank, |k| {
            k.data.expand(k1)?;
            k.tweak.expand(k2)
        })
        .ok()
    }

    /// XTS over whole data units of `unit` bytes; `ivs` holds one IV per unit and is
    /// overwritten with the encrypted tweaks.
    pub(crate) fn xts(
        &self,
        backend: Backend,
        ivs: &mut [[u8; 16]],
        data: &mut [u8],
        unit: usize,
        enc: bool,
    ) {
        debug_assert_eq!(data.len(), ivs.len() * unit);
        match backend {
            // SAFETY: SectorCipher only passes a backend whose CPU features it has checked
            // (`Backend::is_supported`), and RoundKeys exist only on CPUs with AES-NI.
            Backend::Vaes512 => unsafe { vaes::xts(&self.data, &self.tweak, ivs, data, unit, enc) },
            // SAFETY: as above; AES-NI presence was checked when the keys were expanded.
            _ => unsafe { ni::xts(&self.data, &self.tweak, ivs, data, unit, enc) },
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl AesKeys {
    pub(crate) fn new(k: &[u8]) -> Option<LockedBox<Self>> {
        let blank = AesKeys {
            key: RoundKeys::blank(),
        };
        LockedBox::new_with(blank, |x| x.key.expand(k)).ok()
    }

    /// CBC over whole data units, one IV each.
    pub(crate) fn cbc(
        &self,
        _backend: Backend,
        ivs: &[[u8; 16]],
        data: &mut [u8],
        unit: usize,
        enc: bool,
    ) {
        debug_assert_eq!(data.len(), ivs.len() * unit);
        // SAFETY: RoundKeys exist only on CPUs with AES-NI (checked in RoundKeys::new).
        unsafe { ni::cbc(&self.key, ivs, data, unit, enc) }
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl XtsKeys {
    pub(crate) fn new(_k1: &[u8], _k2: &[u8]) -> Option<LockedBox<Self>> {
        None
    }
    pub(crate) fn xts(&self, _: Backend, _: &mut [[u8; 16]], _: &mut [u8], _: usize, _: bool) {
        unreachable!("never constructed off x86_64")
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl AesKeys {
    pub(crate) fn new(_k: &[u8]) -> Option<LockedBox<Self>> {
        None
    }
    pub(crate) fn cbc(&self, _: Backend, _: &[[u8; 16]], _: &mut [u8], _: usize, _: bool) {
        unreachable!("never constructed off x86_64")
    }
}
