//! Plain dm-crypt mode (`cryptsetup open --type plain`): no header, the volume key comes
//! from the passphrase (hashed as cryptsetup's `crypt_plain_hash`) or straight from a key file.

use crate::{Error, Result};
use cryptblk_crypto::{CipherSpec, HashAlg, IvOptions, SecretBytes};

/// Passphrase hashes plain mode accepts: the crypto layer's (RIPEMD-160, cryptsetup's
/// compiled-in default for plain mode, among them).
pub type PlainHash = HashAlg;

/// Largest key cryptsetup accepts for plain mode, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// Parameters of a plain mapping, in cryptsetup's units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainParams {
    /// Data cipher (`--cipher`, e.g. aes-cbc-essiv:sha256).
    pub cipher: CipherSpec,
    /// Volume key length in bytes (`--key-size` / 8).
    pub key_len: usize,
    /// Passphrase hash; `None` is `--hash plain` (the passphrase is the key).
    pub hash: Option<PlainHash>,
    /// The `:len` of `--hash name:len`: only the first `len` key bytes come from the
    /// passphrase, the rest are zero. `None` = the whole key.
    pub hash_len: Option<usize>,
    /// Start of the data, in 512-byte sectors (`--offset`).
    pub offset: u64,
    /// IV offset, in 512-byte sectors (`--skip`).
    pub skip: u64,
    /// Mapping size in 512-byte sectors (`--size`); `None` = to the end of the device.
    pub size: Option<u64>,
    /// Encryption sector size (`--sector-size`).
    pub sector_size: u32,
    /// `--iv-large-sectors`.
    pub iv_large_sectors: bool,
}

impl Default for PlainParams {
    /// cryptsetup 2.6's compiled-in plain defaults (`cryptsetup --help`):
    /// aes-cbc-essiv:sha256, 256-bit key, passphrase hashed with ripemd160.
    fn default() -> Self {
        PlainParams {
            cipher: CipherSpec::parse("aes-cbc-essiv:sha256").expect("built-in spec parses"),
            key_len: 32,
            hash: Some(HashAlg::Ripemd160),
            hash_len: None,
            offset: 0,
            skip: 0,
            size: None,
            sector_size: 512,
            iv_large_sectors: false,
        }
    }
}

impl PlainParams {
    /// Sets `hash`/`hash_len` from a `--hash` value: `sha256`, `plain`, `sha256:16`, `plain:16`.
    pub fn set_hash_spec(&mut self, spec: &str) -> Result<()> {
        let (name, len) = match spec.split_once(':') {
            Some((n, l)) => {
                // cryptsetup reads the length with sscanf("%zd"); we accept plain digits only.
                if l.is_empty() || !l.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(Error::InvalidOption(format!(
                        "hash length in '{spec}' is not a number"
                    )));
                }
                let len = l.parse::<usize>().map_err(|_| {
                    Error::InvalidOption(format!("hash length in '{spec}' is too large"))
                })?;
                (n, Some(len))
            }
            None => (spec, None),
        };
        self.hash = if name == "plain" {
            None
        } else {
            Some(PlainHash::from_name(name)?)
        };
        self.hash_len = len;
        Ok(())
    }

    /// The `--hash` value these parameters correspond to.
    pub fn hash_spec(&self) -> String {
        let name = self.hash.map_or("plain", PlainHash::name);
        match self.hash_len {
            Some(l) => format!("{name}:{l}"),
            None => name.to_string(),
        }
    }

    /// Checks what cryptsetup checks when it sets up a plain device.
    pub fn validate(&self) -> Result<()> {
        if self.key_len == 0
            || self.key_len > MAX_KEY_LEN
            || !self.cipher.valid_key_len(self.key_len)
        {
            return Err(Error::InvalidOption(format!(
                "key size {} bits is invalid for {}",
                self.key_len * 8,
                self.cipher
            )));
        }
        if !matches!(self.sector_size, 512 | 1024 | 2048 | 4096) {
            return Err(Error::InvalidOption(format!(
                "unsupported sector size {}",
                self.sector_size
            )));
        }
        if let Some(l) = self.hash_len
            && l > self.key_len
        {
            return Err(Error::InvalidOption(format!(
                "hash length {l} is larger than the key length {}",
                self.key_len
            )));
        }
        if self.offset.checked_mul(512).is_none() {
            return Err(Error::InvalidOption(format!(
                "offset {} sectors is too large",
                self.offset
            )));
        }
        if self.size.is_some_and(|s| s.checked_mul(512).is_none()) {
            return Err(Error::InvalidOption("size is too large".into()));
        }
        Ok(())
    }

    /// The volume key for a passphrase, as cryptsetup derives it (`process_key` and
    /// `crypt_plain_hash` in lib/setup.c and lib/crypt_plain.c):
    ///
    /// - hash `plain` without length: the passphrase itself, truncated or zero-padded to the
    ///   key length;
    /// - `plain:len`: the first `len` passphrase bytes (an error if it is shorter), zeros after;
    /// - a hash: round `r` (from 0) hashes `r` bytes `'A'` followed by the passphrase and
    ///   contributes the next `min(digest size, remaining)` key bytes, until `len` (or the
    ///   whole key) is filled; the remaining bytes are zero.
    pub fn derive_key(&self, passphrase: &[u8]) -> Result<SecretBytes> {
        self.validate()?;
        let mut key = SecretBytes::zeroed(self.key_len);
        match (self.hash, self.hash_len) {
            (None, None) => {
                let n = passphrase.len().min(self.key_len);
                key[..n].copy_from_slice(&passphrase[..n]);
            }
            (None, Some(len)) => {
                if passphrase.len() < len {
                    return Err(Error::InvalidOption(format!(
                        "passphrase is shorter than the {len} bytes hash 'plain:{len}' takes"
                    )));
                }
                key[..len].copy_from_slice(&passphrase[..len]);
            }
            (Some(h), len) => {
                let len = len.unwrap_or(self.key_len);
                let dlen = h.output_len();
                let mut digest = SecretBytes::zeroed(dlen);
                let mut prefix = Vec::new();
                let mut done = 0;
                while done < len {
                    h.digest_parts(&[&prefix, passphrase], &mut digest);
                    let n = dlen.min(len - done);
                    key[done..done + n].copy_from_slice(&digest[..n]);
                    done += n;
                    prefix.push(b'A');
                }
            }
        }
        Ok(key)
    }

    /// The volume key from a key file (`--key-file`, not stdin), as cryptsetup reads it:
    /// the hash is ignored and exactly `key_len` bytes are taken from `keyfile_offset` on;
    /// a shorter file is an error. cryptsetup ignores `--keyfile-size` here (it warns), so
    /// there is no size parameter. For `--key-file -` (stdin) cryptsetup instead treats the
    /// input as a passphrase: use [`PlainParams::derive_key`].
    pub fn key_from_keyfile(&self, keyfile: &[u8], keyfile_offset: u64) -> Result<SecretBytes> {
        self.validate()?;
        let start = usize::try_from(keyfile_offset)
            .ok()
            .filter(|&o| o <= keyfile.len())
            .ok_or_else(|| {
                Error::InvalidOption("cannot seek to the requested keyfile offset".into())
            })?;
        let data = &keyfile[start..];
        if data.len() < self.key_len {
            return Err(Error::InvalidOption(format!(
                "key file has {} bytes after the offset, the key needs {}",
                data.len(),
                self.key_len
            )));
        }
        Ok(SecretBytes::from_slice(&data[..self.key_len]))
    }

    /// IV numbering for the data path.
    pub fn iv_options(&self) -> IvOptions {
        IvOptions {
            large_sectors: self.iv_large_sectors,
            offset: self.skip,
        }
    }

    /// Start of the data on the device, in bytes.
    pub fn data_offset_bytes(&self) -> u64 {
        self.offset.saturating_mul(512)
    }

    /// Length of the mapping in bytes; `None` = to the end of the device.
    pub fn data_length_bytes(&self) -> Option<u64> {
        self.size.map(|s| s.saturating_mul(512))
    }
}

#[cfg(test)]
mod tests;
