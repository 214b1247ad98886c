//! Runtime choice of the AES implementation, with an override so tests can force each one.

use crate::{Error, Result};

/// Environment variable that forces a backend: `vaes512`, `aesni` or `generic`.
pub const BACKEND_ENV: &str = "CRYPTBLK_CRYPTO_BACKEND";

/// AES implementations, fastest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// AVX-512 + VAES + VPCLMULQDQ: four blocks per instruction, sectors of a request interleaved.
    Vaes512,
    /// AES-NI: eight blocks in flight per 128-bit register set.
    AesNi,
    /// The `aes` crate (its own runtime dispatch; bitsliced constant-time software where the
    /// CPU has no AES instructions, or when built with `--cfg aes_backend="soft"`).
    Generic,
}

impl Backend {
    pub const ALL: [Backend; 3] = [Backend::Vaes512, Backend::AesNi, Backend::Generic];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Vaes512 => "vaes512",
            Backend::AesNi => "aesni",
            Backend::Generic => "generic",
        }
    }

    pub fn from_name(name: &str) -> Result<Self> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == name)
            .ok_or_else(|| {
                Error::BackendUnavailable(format!(
                    "unknown backend '{name}' (vaes512, aesni, generic)"
                ))
            })
    }

    /// Whether this CPU can run the backend.
    pub fn is_supported(self) -> bool {
        match self {
            Backend::Generic => true,
            #[cfg(target_arch = "x86_64")]
            Backend::AesNi => {
                std::arch::is_x86_feature_detected!("aes")
                    && std::arch::is_x86_feature_detected!("sse2")
                    && std::arch::is_x86_feature_detected!("sse4.1")
            }
            #[cfg(target_arch = "x86_64")]
            Backend::Vaes512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("vaes")
                    && std::arch::is_x86_feature_detected!("vpclmulqdq")
                    && Backend::AesNi.is_supported()
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest backend this CPU supports.
    pub fn detect() -> Backend {
        Backend::ALL
            .into_iter()
            .find(|b| b.is_supported())
            .unwrap_or(Backend::Generic)
    }

    /// The backend to use: the one named in `CRYPTBLK_CRYPTO_BACKEND` if set, else detected.
    pub fn current() -> Result<Backend> {
        match std::env::var(BACKEND_ENV) {
            Ok(name) if !name.is_empty() => {
                let b = Backend::from_name(&name)?;
                if b.is_supported() {
                    Ok(b)
                } else {
                    Err(Error::BackendUnavailable(format!(
                        "{name} is not supported by this CPU"
                    )))
                }
            }
            _ => Ok(Backend::detect()),
        }
    }

    /// Backends this CPU can run.
    pub fn supported() -> Vec<Backend> {
        Backend::ALL
            .into_iter()
            .filter(|b| b.is_supported())
            .collect()
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
