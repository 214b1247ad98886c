//! Runtime choice of the AES implementation, with an override so tests can force each one.

pub(crate) mod generic;
#[allow(unsafe_code)] // CPU intrinsics
pub(crate) mod x86;

use crate::{Error, Result};

/// Environment variable that forces a backend: `vaes512`, `vaes256`, `aesni` or `generic`.
pub const BACKEND_ENV: &str = "CRYPTBLK_CRYPTO_BACKEND";

/// AES implementations, fastest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// AVX-512 + VAES + VPCLMULQDQ: four blocks per instruction, sectors of a request interleaved.
    Vaes512,
    /// VAES + VPCLMULQDQ on 256-bit registers (AVX2 encoding): two blocks per instruction,
    /// for CPUs without the AVX-512 subset (AMD Zen 3, Intel client cores).
    Vaes256,
    /// AES-NI: eight blocks in flight per 128-bit register set.
    AesNi,
    /// The `aes` crate (its own runtime dispatch; bitsliced constant-time software where the
    /// CPU has no AES instructions, or when built with `--cfg aes_backend="soft"`).
    Generic,
}

impl Backend {
    /// Every backend.
    pub const ALL: [Backend; 4] = [
        Backend::Vaes512,
        Backend::Vaes256,
        Backend::AesNi,
        Backend::Generic,
    ];

    /// The backend's name as `CRYPTBLK_CRYPTO_BACKEND` and reports spell it (`vaes512`,
    /// `vaes256`, `aesni`, `generic`).
    pub fn name(self) -> &'static str {
        match self {
            Backend::Vaes512 => "vaes512",
            Backend::Vaes256 => "vaes256",
            Backend::AesNi => "aesni",
            Backend::Generic => "generic",
        }
    }

    /// Parses a name as [`Backend::name`] returns it (exact, lower case).
    ///
    /// Fails with [`Error::BackendUnavailable`] for an unknown name; does not check that
    /// this CPU supports the backend.
    pub fn from_name(name: &str) -> Result<Self> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == name)
            .ok_or_else(|| {
                Error::BackendUnavailable(format!(
                    "unknown backend '{name}' (vaes512, vaes256, aesni, generic)"
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
                    && std::arch::is_x86_feature_detected!("pclmulqdq")
                    && std::arch::is_x86_feature_detected!("sse2")
                    && std::arch::is_x86_feature_detected!("sse4.1")
            }
            #[cfg(target_arch = "x86_64")]
            Backend::Vaes256 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("vaes")
                    && std::arch::is_x86_feature_detected!("vpclmulqdq")
                    && Backend::AesNi.is_supported()
            }
            #[cfg(target_arch = "x86_64")]
            Backend::Vaes512 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("avx512f")
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

    /// How fast the backend is where it runs, as measured (docs/benchmarks.md), per core
    /// at 4 KiB: AES blocks per instruction on the CPUs that have it. Higher is faster;
    /// [`Backend::detect`] picks the highest this CPU supports, whatever order the features
    /// are listed in.
    ///
    /// vaes512 (4 blocks per instruction) matched the kernel's best on Intel with
    /// AVX-512; vaes256 (2) ran at about twice the AES-NI path on AMD Zen 3, which has
    /// no AVX-512; AES-NI (1) is three times the portable code; the portable code is the
    /// floor.
    pub fn speed_class(self) -> u32 {
        match self {
            Backend::Vaes512 => 4,
            Backend::Vaes256 => 2,
            Backend::AesNi => 1,
            Backend::Generic => 0,
        }
    }

    /// The fastest backend this CPU supports (highest [`Backend::speed_class`]).
    pub fn detect() -> Backend {
        Backend::ALL
            .into_iter()
            .filter(|b| b.is_supported())
            .max_by_key(|b| b.speed_class())
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
