//! TrueCrypt and VeraCrypt volumes (cryptsetup's `--type tcrypt`, `tcryptDump`).
//!
//! The 512-byte header is a 64-byte salt and 448 encrypted bytes; nothing in it says
//! which KDF or cipher made it, so every PBKDF2 variant (TrueCrypt's and, unless turned
//! off, VeraCrypt's) is tried with every cipher chain until the decrypted magic reads
//! `TRUE` or `VERA` and both CRC-32s match - cryptsetup's `lib/tcrypt` rules, read from
//! its sources and checked against its test images. Unlike cryptsetup, which stacks one
//! dm-crypt target per cipher and cannot map TrueCrypt 3-4's inner-CBC cascades, the data
//! path here runs every mode itself (`SectorCipher::cascade`, `SectorCipher::tcw_chain`).

use crate::{Error, Result};
use cryptblk_crypto::{
    Argon2Variant, BlockCipherAlg, ChainMode, CipherSpec, HashAlg, IvMode, IvOptions, Kdf,
    SecretBytes, SectorCipher, UnitCipher, crc32, crc32_update,
};
use std::fmt::Write as _;

/// What can be wrong with a TrueCrypt/VeraCrypt volume.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TcryptError {
    /// A header that decrypted (its magic matched) but fails a CRC32: damaged (which).
    CorruptMetadata(String),
    /// A passphrase longer than the pool it goes into (the maximum).
    PassphraseTooLong(usize),
    /// A sector size TrueCrypt/VeraCrypt does not define.
    UnsupportedSectorSize(u32),
    /// One of TrueCrypt's legacy CBC modes, which neither dm-crypt nor cryptblk maps.
    LegacyMode(String),
}

impl std::fmt::Display for TcryptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TcryptError::CorruptMetadata(what) => write!(f, "corrupt metadata: {what}"),
            TcryptError::PassphraseTooLong(max) => {
                write!(f, "maximum TCRYPT passphrase length ({max}) exceeded")
            }
            TcryptError::UnsupportedSectorSize(s) => write!(f, "sector size {s} is not supported"),
            TcryptError::LegacyMode(name) => write!(
                f,
                "TrueCrypt legacy mode {name} cannot be mapped (nor can cryptsetup map it); \
                 copy the data out with TrueCrypt 7.1a"
            ),
        }
    }
}

/// Bytes of the header on disk: salt and encrypted part.
pub const HEADER_LEN: usize = 512;
const SALT_LEN: usize = 64;
/// Bytes the header key derivation produces (enough for three XTS keys).
const HEADER_KEY_LEN: usize = 192;
/// Where the header sits, per cryptsetup's `TCRYPT_read_phdr`.
const HIDDEN_OFFSET: i64 = 65536;
const HIDDEN_OFFSET_OLD: i64 = -1536;
const HIDDEN_OFFSET_BACKUP: i64 = -65536;
const OFFSET_BACKUP: i64 = -131072;
const SYSTEM_OFFSET: i64 = 31744;
/// Keyfile bytes that count (TrueCrypt reads at most 1 MiB of each).
pub const KEYFILE_MAX: usize = 1 << 20;
const POOL_LEN: usize = 64;
const VERA_POOL_LEN: usize = 128;

/// What to look for (cryptsetup's `--tcrypt-*`, `--veracrypt-pim`, `-h`, `-c` options).
#[derive(Debug, Clone, Default)]
pub struct TcryptOptions {
    /// The hidden volume's header (`--tcrypt-hidden`).
    pub hidden: bool,
    /// A system volume's header at sector 62 (`--tcrypt-system`).
    pub system: bool,
    /// `--tcrypt-system` on one partition: where it starts on its disk, in 512-byte
    /// sectors. The header is then the disk's; the partition maps from its first sector,
    /// with IVs counted from the disk's start (as cryptsetup maps it).
    pub partition_start: Option<u64>,
    /// The backup header at the device's end (`--tcrypt-backup`).
    pub backup: bool,
    /// Do not try VeraCrypt's KDFs and magic (`--disable-veracrypt`).
    pub no_veracrypt: bool,
    /// VeraCrypt's PIM (`--veracrypt-pim`): only VeraCrypt KDFs, with iterations from it.
    pub pim: Option<u32>,
    /// Only this KDF (`--hash`: a PBKDF2 hash, or `argon2id`).
    pub kdf: Option<TcryptKdf>,
    /// Only cipher chains whose name contains this (`--cipher`, e.g. `aes` or `serpent-aes`).
    pub cipher: Option<String>,
    /// Keyfiles' contents (first [`KEYFILE_MAX`] bytes each), in the order given.
    pub keyfiles: Vec<SecretBytes>,
}

/// A header KDF to search with (`--hash`): PBKDF2 with one hash, or VeraCrypt's Argon2id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcryptKdf {
    /// PBKDF2-HMAC with this hash (every iteration count TrueCrypt and VeraCrypt used).
    Pbkdf2(HashAlg),
    /// Argon2id, VeraCrypt 1.26.29+ (non-system volumes only).
    Argon2id,
}

impl TcryptKdf {
    /// `--hash` as cryptsetup takes it (`sha512`, `ripemd160`, ...), or `argon2id`. As
    /// cryptsetup matches it (a part of the name), a name that is not a hash's own but part
    /// of exactly one header KDF's hash picks that one: `blake2s` is VeraCrypt's
    /// `blake2s-256`.
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "argon2id" | "argon2" => Ok(TcryptKdf::Argon2id),
            h => match HashAlg::from_name(h) {
                Ok(hash) => Ok(TcryptKdf::Pbkdf2(hash)),
                Err(e) => {
                    let mut found = KDFS.iter().filter_map(|k| match k.kind {
                        TcryptKdf::Pbkdf2(hash) if !h.is_empty() && hash.name().contains(h) => {
                            Some(hash)
                        }
                        _ => None,
                    });
                    let first = found.next().ok_or(e)?;
                    if found.all(|other| other == first) {
                        Ok(TcryptKdf::Pbkdf2(first))
                    } else {
                        Err(crate::Error::InvalidOption(format!(
                            "--hash {h} names more than one TrueCrypt/VeraCrypt KDF hash"
                        )))
                    }
                }
            },
        }
    }
}

/// One header KDF TrueCrypt or VeraCrypt used.
struct KdfVariant {
    veracrypt: bool,
    kind: TcryptKdf,
    /// PBKDF2 iterations without a PIM (0 for Argon2id: from the PIM alone).
    iterations: u32,
    pim_const: u32,
    pim_mult: u32,
}

const fn kdf(
    veracrypt: bool,
    hash: HashAlg,
    iterations: u32,
    pim_const: u32,
    pim_mult: u32,
) -> KdfVariant {
    KdfVariant {
        veracrypt,
        kind: TcryptKdf::Pbkdf2(hash),
        iterations,
        pim_const,
        pim_mult,
    }
}

/// VeraCrypt's Argon2id header key: always 192 bytes (its `ARGON2_HEADER_KEYDATA_SIZE`,
/// whatever the chain needs; Argon2's output depends on its length), one lane, version
/// 1.3, the header's 64-byte salt, no secret or associated data.
const ARGON2_LANES: u32 = 1;

/// VeraCrypt's `get_argon2_params`: the PIM (none or 0: 12) gives the memory, 64 MiB plus
/// 32 MiB per step up to 1 GiB, and the passes, 3 plus one every three steps up to PIM 31
/// and one per step beyond. PIM 12 (the default): 416 MiB, 6 passes. Returns (passes, KiB).
pub fn veracrypt_argon2_costs(pim: Option<u32>) -> (u32, u32) {
    let pim = match pim {
        None | Some(0) => 12,
        Some(p) => p,
    };
    let memory_mib = 64u32.saturating_add((pim - 1).saturating_mul(32)).min(1024);
    let passes = if pim <= 31 {
        3 + (pim - 1) / 3
    } else {
        13u32.saturating_add(pim - 31)
    };
    (passes, memory_mib * 1024)
}

/// PBKDF2 this cheap (TrueCrypt's iterations) is derived before the rest, all at once.
const CHEAP_ITERATIONS: u32 = 2000;

/// cryptsetup's order, which is also the order of likelihood (SHA-1 is TrueCrypt 1-4's).
const KDFS: [KdfVariant; 15] = [
    kdf(false, HashAlg::Ripemd160, 2000, 0, 0),
    kdf(false, HashAlg::Ripemd160, 1000, 0, 0),
    kdf(false, HashAlg::Sha512, 1000, 0, 0),
    kdf(false, HashAlg::Whirlpool, 1000, 0, 0),
    kdf(false, HashAlg::Sha1, 2000, 0, 0),
    kdf(true, HashAlg::Sha512, 500_000, 15000, 1000),
    kdf(true, HashAlg::Whirlpool, 500_000, 15000, 1000),
    kdf(true, HashAlg::Sha256, 500_000, 15000, 1000),
    // System (boot) volumes.
    kdf(true, HashAlg::Sha256, 200_000, 0, 2048),
    // VeraCrypt 1.26.2 on (in place of RIPEMD-160), and its system volumes.
    kdf(true, HashAlg::Blake2s256, 500_000, 15000, 1000),
    kdf(true, HashAlg::Blake2s256, 200_000, 0, 2048),
    kdf(true, HashAlg::Ripemd160, 655_331, 15000, 1000),
    kdf(true, HashAlg::Ripemd160, 327_661, 0, 2048),
    kdf(true, HashAlg::Stribog512, 500_000, 15000, 1000),
    // VeraCrypt tries it last, and never for system volumes (no pre-boot support).
    KdfVariant {
        veracrypt: true,
        kind: TcryptKdf::Argon2id,
        iterations: 0,
        pim_const: 0,
        pim_mult: 0,
    },
];

/// One cipher of a chain and where its keys sit in the 256 key bytes of the header (for
/// the header key: in the derived key). cryptsetup's `struct tcrypt_alg`.
#[derive(Debug, Clone, Copy)]
struct ChainCipher {
    alg: BlockCipherAlg,
    /// Key bytes (XTS: both halves; LRW: with the 16-byte tweak key; CBC: the cipher key).
    key_size: usize,
    iv_size: usize,
    key_offset: usize,
    /// XTS: the tweak key's offset; CBC: the IV seed's.
    iv_offset: usize,
    /// CBC: IV seed and whitening bytes after the key.
    key_extra_size: usize,
}

/// How the chain's modes work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TcryptMode {
    Xts,
    Lrw,
    /// One cipher, CBC with TrueCrypt's IV and whitening (dm-crypt's `tcw`).
    CbcTcw,
    /// Outer CBC of each cipher in turn (`cbc-tcrypt`; Blowfish chains).
    CbcOuter,
    /// Inner CBC: the chain applied to each block (`cbci-tcrypt`).
    CbcInner,
}

/// A cipher chain TrueCrypt or VeraCrypt offered.
#[derive(Debug)]
pub struct Chain {
    legacy: bool,
    /// cryptsetup's name of the chain (`serpent-twofish-aes`).
    name: &'static str,
    /// cryptsetup's name of the mode (`xts-plain64`, `lrw-benbi`, `cbc-tcw`, ...).
    mode_name: &'static str,
    mode: TcryptMode,
    /// Volume key bytes of the chain (cryptsetup's `chain_key_size`).
    key_size: usize,
    ciphers: &'static [ChainCipher],
}

const fn c(
    alg: BlockCipherAlg,
    key_size: usize,
    iv_size: usize,
    key_offset: usize,
    iv_offset: usize,
    key_extra_size: usize,
) -> ChainCipher {
    ChainCipher {
        alg,
        key_size,
        iv_size,
        key_offset,
        iv_offset,
        key_extra_size,
    }
}

use BlockCipherAlg::{Aes, BlowfishLe, Camellia, Cast5, Des3Ede, Kuznyechik, Serpent, Twofish};
use TcryptMode::{CbcInner, CbcOuter, CbcTcw, Lrw, Xts};

macro_rules! chain {
    ($legacy:expr, $key:expr, $name:expr, $mode_name:expr, $mode:expr, [$($c:expr),*]) => {
        Chain {
            legacy: $legacy,
            key_size: $key,
            name: $name,
            mode_name: $mode_name,
            mode: $mode,
            ciphers: &[$($c),*],
        }
    };
}

/// cryptsetup's `tcrypt_cipher` table, in its order.
static CHAINS: &[Chain] = &[
    chain!(
        false,
        64,
        "aes",
        "xts-plain64",
        Xts,
        [c(Aes, 64, 16, 0, 32, 0)]
    ),
    chain!(
        false,
        64,
        "serpent",
        "xts-plain64",
        Xts,
        [c(Serpent, 64, 16, 0, 32, 0)]
    ),
    chain!(
        false,
        64,
        "twofish",
        "xts-plain64",
        Xts,
        [c(Twofish, 64, 16, 0, 32, 0)]
    ),
    chain!(
        false,
        128,
        "twofish-aes",
        "xts-plain64",
        Xts,
        [c(Twofish, 64, 16, 0, 64, 0), c(Aes, 64, 16, 32, 96, 0)]
    ),
    chain!(
        false,
        192,
        "serpent-twofish-aes",
        "xts-plain64",
        Xts,
        [
            c(Serpent, 64, 16, 0, 96, 0),
            c(Twofish, 64, 16, 32, 128, 0),
            c(Aes, 64, 16, 64, 160, 0)
        ]
    ),
    chain!(
        false,
        128,
        "aes-serpent",
        "xts-plain64",
        Xts,
        [c(Aes, 64, 16, 0, 64, 0), c(Serpent, 64, 16, 32, 96, 0)]
    ),
    chain!(
        false,
        192,
        "aes-twofish-serpent",
        "xts-plain64",
        Xts,
        [
            c(Aes, 64, 16, 0, 96, 0),
            c(Twofish, 64, 16, 32, 128, 0),
            c(Serpent, 64, 16, 64, 160, 0)
        ]
    ),
    chain!(
        false,
        128,
        "serpent-twofish",
        "xts-plain64",
        Xts,
        [c(Serpent, 64, 16, 0, 64, 0), c(Twofish, 64, 16, 32, 96, 0)]
    ),
    chain!(
        false,
        64,
        "camellia",
        "xts-plain64",
        Xts,
        [c(Camellia, 64, 16, 0, 32, 0)]
    ),
    chain!(
        false,
        64,
        "kuznyechik",
        "xts-plain64",
        Xts,
        [c(Kuznyechik, 64, 16, 0, 32, 0)]
    ),
    chain!(
        false,
        128,
        "kuznyechik-camellia",
        "xts-plain64",
        Xts,
        [
            c(Kuznyechik, 64, 16, 0, 64, 0),
            c(Camellia, 64, 16, 32, 96, 0)
        ]
    ),
    chain!(
        false,
        128,
        "twofish-kuznyechik",
        "xts-plain64",
        Xts,
        [
            c(Twofish, 64, 16, 0, 64, 0),
            c(Kuznyechik, 64, 16, 32, 96, 0)
        ]
    ),
    chain!(
        false,
        128,
        "serpent-camellia",
        "xts-plain64",
        Xts,
        [c(Serpent, 64, 16, 0, 64, 0), c(Camellia, 64, 16, 32, 96, 0)]
    ),
    chain!(
        false,
        128,
        "aes-kuznyechik",
        "xts-plain64",
        Xts,
        [c(Aes, 64, 16, 0, 64, 0), c(Kuznyechik, 64, 16, 32, 96, 0)]
    ),
    chain!(
        false,
        192,
        "camellia-serpent-kuznyechik",
        "xts-plain64",
        Xts,
        [
            c(Camellia, 64, 16, 0, 96, 0),
            c(Serpent, 64, 16, 32, 128, 0),
            c(Kuznyechik, 64, 16, 64, 160, 0)
        ]
    ),
    chain!(
        false,
        48,
        "aes",
        "lrw-benbi",
        Lrw,
        [c(Aes, 48, 16, 32, 0, 0)]
    ),
    chain!(
        false,
        48,
        "serpent",
        "lrw-benbi",
        Lrw,
        [c(Serpent, 48, 16, 32, 0, 0)]
    ),
    chain!(
        false,
        48,
        "twofish",
        "lrw-benbi",
        Lrw,
        [c(Twofish, 48, 16, 32, 0, 0)]
    ),
    chain!(
        false,
        96,
        "twofish-aes",
        "lrw-benbi",
        Lrw,
        [c(Twofish, 48, 16, 32, 0, 0), c(Aes, 48, 16, 64, 0, 0)]
    ),
    chain!(
        false,
        144,
        "serpent-twofish-aes",
        "lrw-benbi",
        Lrw,
        [
            c(Serpent, 48, 16, 32, 0, 0),
            c(Twofish, 48, 16, 64, 0, 0),
            c(Aes, 48, 16, 96, 0, 0)
        ]
    ),
    chain!(
        false,
        96,
        "aes-serpent",
        "lrw-benbi",
        Lrw,
        [c(Aes, 48, 16, 32, 0, 0), c(Serpent, 48, 16, 64, 0, 0)]
    ),
    chain!(
        false,
        144,
        "aes-twofish-serpent",
        "lrw-benbi",
        Lrw,
        [
            c(Aes, 48, 16, 32, 0, 0),
            c(Twofish, 48, 16, 64, 0, 0),
            c(Serpent, 48, 16, 96, 0, 0)
        ]
    ),
    chain!(
        false,
        96,
        "serpent-twofish",
        "lrw-benbi",
        Lrw,
        [c(Serpent, 48, 16, 32, 0, 0), c(Twofish, 48, 16, 64, 0, 0)]
    ),
    chain!(
        true,
        64,
        "aes",
        "cbc-tcw",
        CbcTcw,
        [c(Aes, 32, 16, 32, 0, 32)]
    ),
    chain!(
        true,
        64,
        "serpent",
        "cbc-tcw",
        CbcTcw,
        [c(Serpent, 32, 16, 32, 0, 32)]
    ),
    chain!(
        true,
        64,
        "twofish",
        "cbc-tcw",
        CbcTcw,
        [c(Twofish, 32, 16, 32, 0, 32)]
    ),
    chain!(
        true,
        96,
        "twofish-aes",
        "cbci-tcrypt",
        CbcInner,
        [c(Twofish, 32, 16, 32, 0, 0), c(Aes, 32, 16, 64, 0, 32)]
    ),
    chain!(
        true,
        128,
        "serpent-twofish-aes",
        "cbci-tcrypt",
        CbcInner,
        [
            c(Serpent, 32, 16, 32, 0, 0),
            c(Twofish, 32, 16, 64, 0, 0),
            c(Aes, 32, 16, 96, 0, 32)
        ]
    ),
    chain!(
        true,
        96,
        "aes-serpent",
        "cbci-tcrypt",
        CbcInner,
        [c(Aes, 32, 16, 32, 0, 0), c(Serpent, 32, 16, 64, 0, 32)]
    ),
    chain!(
        true,
        128,
        "aes-twofish-serpent",
        "cbci-tcrypt",
        CbcInner,
        [
            c(Aes, 32, 16, 32, 0, 0),
            c(Twofish, 32, 16, 64, 0, 0),
            c(Serpent, 32, 16, 96, 0, 32)
        ]
    ),
    chain!(
        true,
        96,
        "serpent-twofish",
        "cbci-tcrypt",
        CbcInner,
        [c(Serpent, 32, 16, 32, 0, 0), c(Twofish, 32, 16, 64, 0, 32)]
    ),
    chain!(
        true,
        40,
        "cast5",
        "cbc-tcw",
        CbcTcw,
        [c(Cast5, 16, 8, 32, 0, 24)]
    ),
    chain!(
        true,
        48,
        "des3_ede",
        "cbc-tcw",
        CbcTcw,
        [c(Des3Ede, 24, 8, 32, 0, 24)]
    ),
    chain!(
        true,
        80,
        "blowfish_le",
        "cbc-tcrypt",
        CbcTcw,
        [c(BlowfishLe, 56, 8, 32, 0, 24)]
    ),
    chain!(
        true,
        120,
        "blowfish_le-aes",
        "cbc-tcrypt",
        CbcOuter,
        [c(BlowfishLe, 56, 8, 32, 0, 0), c(Aes, 32, 16, 88, 0, 32)]
    ),
    chain!(
        true,
        152,
        "serpent-blowfish_le-aes",
        "cbc-tcrypt",
        CbcOuter,
        [
            c(Serpent, 32, 16, 32, 0, 0),
            c(BlowfishLe, 56, 8, 64, 0, 0),
            c(Aes, 32, 16, 120, 0, 32)
        ]
    ),
];

/// A decrypted TrueCrypt/VeraCrypt header.
pub struct TcryptHeader {
    /// `VERA` rather than `TRUE`.
    pub veracrypt: bool,
    /// Header format version.
    pub version: u16,
    /// Minimum program version to open it (`Driver req.`).
    pub version_tc: u16,
    /// Hidden volume size in bytes (0 if none, or in a hidden volume's own header its size).
    pub hidden_volume_size: u64,
    /// Volume size in bytes.
    pub volume_size: u64,
    /// Start of the encrypted area in bytes (`MK offset`).
    pub mk_offset: u64,
    /// Encrypted area size in bytes.
    pub mk_size: u64,
    /// Header flags (bit 0: system encryption).
    pub flags: u32,
    /// Encryption sector size.
    pub sector_size: u32,
    /// The KDF and costs that opened it (PBKDF2 with a hash and iterations, or Argon2id).
    pub kdf: Kdf,
    chain: &'static Chain,
    /// The 256 key bytes.
    keys: SecretBytes,
}

impl std::fmt::Debug for TcryptHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcryptHeader")
            .field("veracrypt", &self.veracrypt)
            .field("version", &self.version)
            .field("chain", &self.chain.name)
            .field("mode", &self.chain.mode_name)
            .field("kdf", &self.kdf)
            .finish_non_exhaustive()
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Where the header to try sits: byte offsets (negative from the end), in order.
fn header_offsets(o: &TcryptOptions) -> Vec<i64> {
    if o.system {
        vec![SYSTEM_OFFSET]
    } else if o.hidden && o.backup {
        vec![HIDDEN_OFFSET_BACKUP]
    } else if o.hidden {
        vec![HIDDEN_OFFSET, HIDDEN_OFFSET_OLD]
    } else if o.backup {
        vec![OFFSET_BACKUP]
    } else {
        vec![0]
    }
}

/// The password TrueCrypt hashes: keyfiles mixed into a pool by CRC-32, the passphrase
/// added on top; `None` when the passphrase is too long.
fn password_pool(o: &TcryptOptions, passphrase: &[u8]) -> Result<SecretBytes> {
    // VeraCrypt: a passphrase over 64 bytes takes a 128-byte pool (and keyfiles with it).
    let vera_long = !o.no_veracrypt && passphrase.len() > POOL_LEN;
    let max = if vera_long { VERA_POOL_LEN } else { POOL_LEN };
    if passphrase.len() > max {
        return Err(TcryptError::PassphraseTooLong(max).into());
    }
    let mut pool = SecretBytes::zeroed(max);
    for kf in &o.keyfiles {
        let mut crc = !0u32;
        let mut j = 0;
        for b in kf.iter().take(KEYFILE_MAX) {
            crc = crc32_update(crc, std::slice::from_ref(b));
            for byte in crc.to_be_bytes() {
                pool[j] = pool[j].wrapping_add(byte);
                j += 1;
            }
            j %= max;
        }
    }
    for (p, b) in pool.iter_mut().zip(passphrase) {
        *p = p.wrapping_add(*b);
    }
    let used = if o.keyfiles.is_empty() {
        passphrase.len()
    } else {
        max
    };
    Ok(SecretBytes::from_slice(&pool[..used]))
}

/// One cipher's key in its mode's layout, from `keys` (the header's 256 key bytes, or the
/// derived header key): cryptsetup's `TCRYPT_copy_key`. XTS: data then tweak half; LRW:
/// the cipher key then the 16-byte tweak key from the start; CBC: the key, then the IV
/// seed and whitening.
fn copy_key(mode: TcryptMode, cc: &ChainCipher, keys: &[u8]) -> SecretBytes {
    let (first, second): (std::ops::Range<usize>, std::ops::Range<usize>) = match mode {
        Xts => {
            let half = cc.key_size / 2;
            (
                cc.key_offset..cc.key_offset + half,
                cc.iv_offset..cc.iv_offset + half,
            )
        }
        Lrw => (cc.key_offset..cc.key_offset + cc.key_size - 16, 0..16),
        _ => (
            cc.key_offset..cc.key_offset + cc.key_size,
            cc.iv_offset..cc.iv_offset + cc.key_extra_size,
        ),
    };
    let mut k = SecretBytes::zeroed(first.len() + second.len());
    let split = first.len();
    k[..split].copy_from_slice(&keys[first]);
    k[split..].copy_from_slice(&keys[second]);
    k
}

/// Decrypts the 448 bytes in `enc` with `chain`'s header keys taken from `key` (the
/// derived header key), in place; cryptsetup's `TCRYPT_decrypt_hdr`.
fn decrypt_header(chain: &Chain, key: &[u8], enc: &mut [u8]) -> Result<()> {
    let whiten = |buf: &mut [u8]| {
        for (j, b) in buf.iter_mut().enumerate() {
            *b ^= key[8 + j % 8];
        }
    };
    match chain.mode {
        CbcInner => {
            whiten(enc);
            let layers: Vec<(BlockCipherAlg, &[u8])> = chain
                .ciphers
                .iter()
                .map(|c| (c.alg, &key[c.key_offset..c.key_offset + c.key_size]))
                .collect();
            let u = UnitCipher::cbc_chain(&layers)?;
            let bs = u.block_size();
            let iv = &key[chain.ciphers[0].iv_offset..chain.ciphers[0].iv_offset + bs];
            u.decrypt(iv, enc)?;
        }
        _ => {
            for cc in chain.ciphers.iter().rev() {
                let k = copy_key(chain.mode, cc, key);
                let (u, iv) = match chain.mode {
                    Xts => (UnitCipher::new(cc.alg, ChainMode::Xts, &k)?, [0u8; 16]),
                    Lrw => {
                        let mut iv = [0u8; 16];
                        iv[cc.iv_size - 1] = 1;
                        (UnitCipher::new(cc.alg, ChainMode::Lrw, &k)?, iv)
                    }
                    _ => {
                        whiten(enc);
                        let mut iv = [0u8; 16];
                        iv[..cc.iv_size]
                            .copy_from_slice(&key[cc.iv_offset..cc.iv_offset + cc.iv_size]);
                        let k = &k[..cc.key_size];
                        (UnitCipher::new(cc.alg, ChainMode::Cbc, k)?, iv)
                    }
                };
                let bs = u.block_size();
                u.decrypt(&iv[..bs], enc)?;
            }
        }
    }
    Ok(())
}

impl TcryptHeader {
    /// Reads and decrypts the header `o` selects from `dev` (`size` bytes long) with
    /// `passphrase` and the keyfiles; [`Error::WrongPassphrase`] when no KDF and chain
    /// opens it.
    pub fn open(
        dev: &dyn crate::Storage,
        size: u64,
        o: &TcryptOptions,
        passphrase: &[u8],
    ) -> Result<TcryptHeader> {
        if o.pim.is_some() && o.no_veracrypt {
            return Err(Error::InvalidOption(
                "--veracrypt-pim needs VeraCrypt support".into(),
            ));
        }
        if o.pim == Some(0) {
            return Err(Error::InvalidOption("invalid PIM value: 0".into()));
        }
        let pool = password_pool(o, passphrase)?;
        let mut last = Error::WrongPassphrase;
        for off in header_offsets(o) {
            let at = if off < 0 {
                match size.checked_sub(off.unsigned_abs()) {
                    Some(a) => a,
                    None => continue,
                }
            } else {
                off as u64
            };
            if at + HEADER_LEN as u64 > size {
                last = Error::Truncated {
                    need: at + HEADER_LEN as u64,
                    have: size,
                };
                continue;
            }
            let mut raw = SecretBytes::zeroed(HEADER_LEN);
            dev.read_at(&mut raw, at)?;
            match Self::try_header(&raw, o, &pool) {
                Ok(h) => return Ok(h),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The KDFs `o` allows, with the costs each runs, in the order they are tried.
    fn kdf_candidates(o: &TcryptOptions) -> Vec<Kdf> {
        KDFS.iter()
            .filter(|k| o.kdf.is_none_or(|want| want == k.kind))
            .filter(|k| !(o.no_veracrypt && k.veracrypt))
            .filter(|k| o.pim.is_none() || k.veracrypt)
            .filter(|k| !(o.system && k.kind == TcryptKdf::Argon2id))
            .map(|k| match k.kind {
                TcryptKdf::Pbkdf2(hash) => Kdf::Pbkdf2 {
                    hash,
                    iterations: match o.pim {
                        Some(p) => k.pim_const.saturating_add(k.pim_mult.saturating_mul(p)),
                        None => k.iterations,
                    },
                },
                TcryptKdf::Argon2id => {
                    let (time, memory_kib) = veracrypt_argon2_costs(o.pim);
                    Kdf::Argon2 {
                        variant: Argon2Variant::Argon2id,
                        time,
                        memory_kib,
                        parallel: ARGON2_LANES,
                    }
                }
            })
            .collect()
    }

    /// The candidates in the groups derived at once. The KDFs are the cost (VeraCrypt's
    /// run 200,000 to 655,331 iterations, or Argon2id over 416 MiB): as many at once as
    /// there are cores (`workers`), every chain tried on each in order. TrueCrypt's (1,000
    /// or 2,000 iterations: milliseconds) all come first: a group waits for its slowest
    /// KDF, and a TrueCrypt volume must not wait a VeraCrypt one's second. Argon2id
    /// (hundreds of MiB, seconds) only once every PBKDF2 variant has failed, however many
    /// cores there are.
    fn kdf_waves(candidates: &[Kdf], workers: usize) -> Vec<Vec<Kdf>> {
        let cheap = |k: &&Kdf| matches!(k, Kdf::Pbkdf2 { iterations, .. } if *iterations <= CHEAP_ITERATIONS);
        let pbkdf2 = |k: &&Kdf| matches!(k, Kdf::Pbkdf2 { .. });
        let fast: Vec<Kdf> = candidates.iter().filter(cheap).cloned().collect();
        let slow: Vec<Kdf> = candidates
            .iter()
            .filter(|k| pbkdf2(k) && !cheap(k))
            .cloned()
            .collect();
        let argon2: Vec<Kdf> = candidates.iter().filter(|k| !pbkdf2(k)).cloned().collect();
        let workers = workers.max(1);
        std::iter::once(fast)
            .filter(|w| !w.is_empty())
            .chain(slow.chunks(workers).map(<[Kdf]>::to_vec))
            .chain(argon2.chunks(workers).map(<[Kdf]>::to_vec))
            .collect()
    }

    fn try_header(raw: &[u8], o: &TcryptOptions, pool: &[u8]) -> Result<TcryptHeader> {
        let salt = &raw[..SALT_LEN];
        let candidates = Self::kdf_candidates(o);
        if candidates.is_empty() {
            return Err(Error::InvalidOption(
                "no TrueCrypt/VeraCrypt KDF uses that hash (Argon2id: not for system volumes)"
                    .into(),
            ));
        }
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        for wave in Self::kdf_waves(&candidates, workers) {
            let keys: Vec<Result<SecretBytes>> = std::thread::scope(|s| {
                let handles: Vec<_> = wave
                    .iter()
                    .map(|k| {
                        s.spawn(move || -> Result<SecretBytes> {
                            let mut key = SecretBytes::zeroed(HEADER_KEY_LEN);
                            k.derive(pool, salt, &mut key)?;
                            Ok(key)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("KDF thread"))
                    .collect()
            });
            for (k, key) in wave.iter().zip(keys) {
                if let Some(h) = Self::try_chains(raw, o, &key?, k)? {
                    return Ok(h);
                }
            }
        }
        Err(Error::WrongPassphrase)
    }

    fn try_chains(
        raw: &[u8],
        o: &TcryptOptions,
        key: &[u8],
        kdf: &Kdf,
    ) -> Result<Option<TcryptHeader>> {
        for chain in CHAINS {
            if o.cipher.as_deref().is_some_and(|c| !chain.name.contains(c)) {
                continue;
            }
            let mut d = SecretBytes::from_slice(&raw[SALT_LEN..]);
            decrypt_header(chain, key, &mut d)?;
            let veracrypt = match &d[..4] {
                b"TRUE" => false,
                b"VERA" if !o.no_veracrypt => true,
                _ => continue,
            };
            let version = be16(&d, 4);
            // The magic matched: a CRC mismatch now is a damaged header, not a wrong guess.
            if version > 3 && crc32(&d[..188]) != be32(&d, 188) {
                return Err(TcryptError::CorruptMetadata("header CRC32 mismatch".into()).into());
            }
            if crc32(&d[192..448]) != be32(&d, 8) {
                return Err(TcryptError::CorruptMetadata("keys CRC32 mismatch".into()).into());
            }
            let mk_offset = match be64(&d, 44) {
                0 => 512,
                v => v,
            };
            let sector_size = match be32(&d, 64) {
                0 => 512,
                v => v,
            };
            if sector_size % 512 != 0 || !sector_size.is_power_of_two() || sector_size > 4096 {
                return Err(TcryptError::UnsupportedSectorSize(sector_size).into());
            }
            return Ok(Some(TcryptHeader {
                veracrypt,
                version,
                version_tc: be16(&d, 6),
                hidden_volume_size: be64(&d, 28),
                volume_size: be64(&d, 36),
                mk_offset,
                mk_size: be64(&d, 52),
                flags: be32(&d, 60),
                sector_size,
                kdf: kdf.clone(),
                chain,
                keys: SecretBytes::from_slice(&d[192..448]),
            }));
        }
        Ok(None)
    }

    /// The chain's name as cryptsetup prints it (`serpent-twofish-aes`).
    pub fn cipher_chain(&self) -> &'static str {
        self.chain.name
    }

    /// The mode as cryptsetup prints it (`xts-plain64`, `lrw-benbi`, `cbc-tcw`, ...).
    pub fn cipher_mode(&self) -> &'static str {
        self.chain.mode_name
    }

    /// Volume key bits (`MK bits`).
    pub fn key_bits(&self) -> usize {
        self.chain.key_size * 8
    }

    /// Start of the data in 512-byte sectors for a device of `size` bytes (cryptsetup's
    /// `TCRYPT_get_data_offset`; `partition` for a system volume opened as a partition).
    pub fn data_offset(&self, o: &TcryptOptions, size: u64) -> u64 {
        let old_hidden = || {
            size.saturating_sub(self.hidden_volume_size)
                .saturating_sub(HIDDEN_OFFSET_OLD.unsigned_abs())
                / 512
        };
        if o.system {
            return if o.partition_start.is_some() {
                0
            } else {
                self.mk_offset / 512
            };
        }
        if self.chain.mode == Xts {
            if self.version < 3 {
                return 1;
            }
            if o.hidden {
                return if self.version > 3 {
                    self.mk_offset / 512
                } else {
                    old_hidden()
                };
            }
        } else if o.hidden {
            return old_hidden();
        }
        self.mk_offset / 512
    }

    /// IV offset in 512-byte sectors (`TCRYPT_get_iv_offset`).
    pub fn iv_offset(&self, o: &TcryptOptions, size: u64) -> u64 {
        let iv = match self.chain.mode {
            Xts => self.data_offset(o, size),
            Lrw => 0,
            _ => self.mk_offset / 512,
        };
        match o.partition_start {
            Some(start) if o.system => iv + start,
            _ => iv,
        }
    }

    /// Bytes of data the volume maps: the hidden or outer volume's size, or for a system
    /// volume and headers that give no size (TrueCrypt 1-4) all from the data offset to
    /// the end, as cryptsetup maps them.
    pub fn data_len(&self, o: &TcryptOptions, size: u64) -> u64 {
        let stated = if o.system {
            0
        } else if o.hidden {
            self.hidden_volume_size
        } else {
            self.volume_size
        };
        match stated {
            0 => size.saturating_sub(self.data_offset(o, size) * 512),
            n => n,
        }
    }

    /// The volume key as cryptsetup's `--dump-volume-key` shows it (each cipher's keys in
    /// chain order, in its mode's layout).
    pub fn volume_key(&self) -> SecretBytes {
        let mut vk = SecretBytes::zeroed(self.chain.key_size);
        let mut at = 0;
        for cc in self.chain.ciphers {
            let k = self.cipher_key(cc);
            vk[at..at + k.len()].copy_from_slice(&k);
            at += cc.key_size;
        }
        vk
    }

    /// One cipher's dm-crypt key (cryptsetup's `TCRYPT_copy_key`).
    fn cipher_key(&self, cc: &ChainCipher) -> SecretBytes {
        copy_key(self.chain.mode, cc, &self.keys)
    }

    /// The data cipher, numbering IVs from `iv_offset` (512-byte sectors).
    pub fn sector_cipher(&self, iv_offset: u64) -> Result<SectorCipher> {
        let iv = IvOptions {
            large_sectors: false,
            offset: iv_offset,
        };
        let ss = self.sector_size;
        let name = format!("{}-{}", self.chain.name, self.chain.mode_name);
        let layer = |cc: &ChainCipher, iv_mode: IvMode, mode: ChainMode, key: &[u8]| {
            let spec = CipherSpec {
                cipher: cc.alg,
                mode,
                iv: iv_mode,
                key_count: 1,
            };
            SectorCipher::new(spec, key, ss, iv).map_err(Error::from)
        };
        let (mode, iv_mode) = match self.chain.mode {
            Xts => (ChainMode::Xts, IvMode::Plain64),
            Lrw => (ChainMode::Lrw, IvMode::Benbi),
            // TrueCrypt's modes dm-crypt has no target for (cryptsetup's `-tcrypt` modes:
            // CBC cascades, inner or outer, and little-endian Blowfish). cryptsetup cannot
            // map them either, and its test images keep only their headers, so there is
            // no data to check an implementation against: refused rather than guessed.
            // Their headers open (dump, test-passphrase).
            _ if self.chain.mode_name.ends_with("-tcrypt") => {
                return Err(TcryptError::LegacyMode(name.to_string()).into());
            }
            CbcTcw => (ChainMode::Cbc, IvMode::Tcw),
            CbcInner | CbcOuter => unreachable!("-tcrypt modes, refused above"),
        };
        let mut layers = Vec::with_capacity(self.chain.ciphers.len());
        for cc in self.chain.ciphers {
            layers.push(layer(cc, iv_mode, mode, &self.cipher_key(cc))?);
        }
        if layers.len() == 1 {
            return Ok(layers.pop().expect("one layer"));
        }
        Ok(SectorCipher::cascade(layers, &name)?)
    }

    /// cryptsetup's `tcryptDump` text.
    pub fn dump(&self, device: &str) -> String {
        let mut s = String::new();
        let kind = if self.veracrypt {
            "VERACRYPT"
        } else {
            "TCRYPT"
        };
        let _ = writeln!(s, "{kind} header information for {device}");
        let _ = writeln!(s, "Version:       \t{}", self.version);
        let _ = writeln!(
            s,
            "Driver req.:\t{:x}.{:x}",
            self.version_tc >> 8,
            self.version_tc & 0xff
        );
        let _ = writeln!(s, "Sector size:\t{}", self.sector_size);
        let _ = writeln!(s, "MK offset:\t{}", self.mk_offset);
        match self.kdf {
            Kdf::Pbkdf2 { hash, .. } => {
                let _ = writeln!(s, "PBKDF2 hash:\t{hash}");
            }
            // Not in cryptsetup's tcryptDump (it has no Argon2id for TCRYPT).
            Kdf::Argon2 {
                time, memory_kib, ..
            } => {
                let _ = writeln!(s, "Argon2id:\ttime {time}, memory {memory_kib} KiB, 1 lane");
            }
        }
        let _ = writeln!(s, "Cipher chain:\t{}", self.chain.name);
        let _ = writeln!(s, "Cipher mode:\t{}", self.chain.mode_name);
        let _ = writeln!(s, "MK bits:       \t{}", self.key_bits());
        s
    }

    /// cryptsetup's `tcryptDump --dump-volume-key` text; `payload` in 512-byte sectors.
    pub fn dump_volume_key(&self, device: &str, payload: u64) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "TCRYPT header information for {device}");
        let _ = writeln!(s, "Cipher chain:  \t{}", self.chain.name);
        let _ = writeln!(s, "Cipher mode:   \t{}", self.chain.mode_name);
        let _ = writeln!(s, "Payload offset:\t{payload}");
        let _ = writeln!(s, "MK bits:       \t{}", self.key_bits());
        let _ = writeln!(s, "MK dump:\t{}", crate::key_dump_hex(&self.volume_key()));
        s
    }

    /// Whether the chain is one of TrueCrypt's legacy (1-4.x) modes.
    pub fn is_legacy(&self) -> bool {
        self.chain.legacy
    }
}

#[cfg(test)]
mod tests;
