//! In-process cipher speed measurement (what `cryptblk benchmark` reports).

use crate::{Backend, CipherSpec, IvOptions, Result, SectorCipher};
use std::time::{Duration, Instant};

/// One measured figure.
#[derive(Debug, Clone, PartialEq)]
pub struct CipherSpeed {
    /// The cipher specification measured, e.g. `aes-xts-plain64`.
    pub cipher: String,
    /// Key size in bits (for XTS, both halves together: 512 means AES-256).
    pub key_bits: usize,
    /// Encryption sector size in bytes (512, 1024, 2048 or 4096).
    pub sector_size: u32,
    /// Bytes handed to one encrypt/decrypt call (the I/O request size), rounded down to a
    /// whole number of sectors and at least one sector.
    pub request_size: usize,
    /// The AES implementation that ran.
    pub backend: Backend,
    /// Encryption throughput in MB/s, MB = 10^6 bytes.
    pub encrypt_mb_s: f64,
    /// Decryption throughput in MB/s, MB = 10^6 bytes.
    pub decrypt_mb_s: f64,
}

/// Measures encryption and decryption speed on one core for `duration` each, processing a
/// 1 MiB buffer in calls of `request_size` bytes, as the data path would issue them.
pub fn cipher_speed(
    spec: CipherSpec,
    key_len: usize,
    sector_size: u32,
    request_size: usize,
    backend: Backend,
    duration: Duration,
) -> Result<CipherSpeed> {
    let mut key = crate::SecretBytes::zeroed(key_len);
    crate::random_bytes(&mut key)?;
    let cipher =
        SectorCipher::with_backend(spec, &key, sector_size, IvOptions::default(), backend)?;
    let request_size =
        request_size.max(sector_size as usize) / sector_size as usize * sector_size as usize;
    let total = (1 << 20) / request_size * request_size;
    let mut buf = vec![0x5au8; total.max(request_size)];
    let sectors_per_req = (request_size / sector_size as usize) as u64;
    let mut run = |enc: bool| -> Result<f64> {
        // Warm up caches and frequency before timing.
        for (i, chunk) in buf.chunks_mut(request_size).enumerate() {
            cipher.encrypt(i as u64 * sectors_per_req, chunk)?;
        }
        let start = Instant::now();
        let mut bytes = 0u64;
        while start.elapsed() < duration {
            for (i, chunk) in buf.chunks_mut(request_size).enumerate() {
                let s = i as u64 * sectors_per_req;
                if enc {
                    cipher.encrypt(s, chunk)?
                } else {
                    cipher.decrypt(s, chunk)?
                }
            }
            bytes += buf.len() as u64;
        }
        Ok(bytes as f64 / start.elapsed().as_secs_f64() / 1e6)
    };
    let encrypt_mb_s = run(true)?;
    let decrypt_mb_s = run(false)?;
    Ok(CipherSpeed {
        cipher: spec.to_string(),
        key_bits: key_len * 8,
        sector_size,
        request_size,
        backend,
        encrypt_mb_s,
        decrypt_mb_s,
    })
}
