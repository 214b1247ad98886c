//! LUKS1 (to be written).
pub const MAGIC: &[u8] = b"LUKS\xba\xbe";
#[derive(Debug)]
pub enum Luks1Error {}
impl std::fmt::Display for Luks1Error {
    fn fmt(&self, _f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Ok(())
    }
}

// Scaffold so the crate builds while the real module is written; replaced wholesale.
#[derive(Debug)]
pub struct Luks1Header;
impl Luks1Header {
    pub fn read(_dev: &mut dyn crate::HeaderDevice) -> crate::Result<Self> {
        Err(crate::Error::NotLuks)
    }
}
impl crate::LuksHeader for Luks1Header {
    fn version(&self) -> u8 { unimplemented!() }
    fn uuid(&self) -> &str { unimplemented!() }
    fn cipher(&self) -> cryptblk_crypto::CipherSpec { unimplemented!() }
    fn key_len(&self) -> usize { unimplemented!() }
    fn sector_size(&self) -> u32 { unimplemented!() }
    fn iv_options(&self) -> cryptblk_crypto::IvOptions { unimplemented!() }
    fn data_offset(&self) -> u64 { unimplemented!() }
    fn data_length(&self) -> Option<u64> { unimplemented!() }
    fn header_size(&self) -> u64 { unimplemented!() }
    fn keyslots(&self) -> Vec<crate::KeyslotInfo> { unimplemented!() }
    fn max_keyslots(&self) -> u32 { unimplemented!() }
    fn unlock(&self, _: &mut dyn crate::HeaderDevice, _: &[u8], _: Option<u32>) -> crate::Result<(u32, cryptblk_crypto::SecretBytes)> { unimplemented!() }
    fn verify_volume_key(&self, _: &[u8]) -> crate::Result<bool> { unimplemented!() }
    fn add_keyslot(&mut self, _: &mut dyn crate::HeaderDevice, _: &[u8], _: &[u8], _: Option<u32>, _: &cryptblk_crypto::KdfRequest) -> crate::Result<u32> { unimplemented!() }
    fn kill_keyslot(&mut self, _: &mut dyn crate::HeaderDevice, _: u32) -> crate::Result<()> { unimplemented!() }
}
