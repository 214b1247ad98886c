use std::fmt;

use crate::bitlk::BitlkError;
use crate::fvault2::Fvault2Error;
use crate::integrity::IntegrityError;
use crate::loopaes::LoopAesError;
use crate::luks1::Luks1Error;
use crate::luks2::Luks2Error;
use crate::tcrypt::TcryptError;

/// Every error of the on-disk format layer.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Reading, writing or syncing the header or data device failed.
    Io(std::io::Error),
    /// A cipher, hash or KDF operation failed or was given parameters it cannot use.
    Crypto(cryptblk_crypto::Error),
    /// No LUKS magic at the start of the header device.
    NotLuks,
    /// The header is shorter than its format needs (truncated file or device).
    Truncated {
        /// Bytes needed: the header, or once it is parsed, the header with its keyslot areas.
        need: u64,
        /// Bytes the device or buffer actually has.
        have: u64,
    },
    /// No keyslot accepted the passphrase.
    WrongPassphrase,
    /// Keyslot number out of range or not in the state the operation needs.
    Keyslot(String),
    /// No keyslot could be tried: none is active (an erased header), or all are set
    /// to be ignored.
    NoUsableKeyslot,
    /// All keyslots are in use.
    NoFreeKeyslot,
    /// Options that do not fit together or the format (e.g. LUKS1 with 4096-byte sectors).
    InvalidOption(String),
    /// A LUKS1 phdr is invalid or a LUKS1 operation was refused.
    Luks1(Luks1Error),
    /// LUKS2 binary header or JSON metadata is invalid or a LUKS2 operation was refused.
    Luks2(Luks2Error),
    /// A TrueCrypt/VeraCrypt header is damaged or uses what cannot be mapped.
    Tcrypt(TcryptError),
    /// BitLocker metadata or a startup key is damaged, unsupported or not mappable.
    Bitlk(BitlkError),
    /// FileVault 2 (Core Storage) metadata is damaged or unsupported.
    Fvault2(Fvault2Error),
    /// A loop-AES key file is not one.
    LoopAes(LoopAesError),
    /// A dm-integrity superblock is damaged or its layout unsupported.
    Integrity(IntegrityError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "I/O error: {e}"),
            Error::Crypto(e) => write!(f, "{e}"),
            Error::NotLuks => write!(f, "device is not a valid LUKS device"),
            Error::Truncated { need, have } => {
                write!(f, "header truncated: need {need} bytes, device has {have}")
            }
            Error::WrongPassphrase => write!(f, "no key available with this passphrase"),
            Error::Keyslot(s) => write!(f, "keyslot: {s}"),
            Error::NoUsableKeyslot => write!(f, "No usable keyslot is available."),
            Error::NoFreeKeyslot => write!(f, "all keyslots are in use"),
            Error::InvalidOption(s) => write!(f, "invalid option: {s}"),
            Error::Luks1(e) => write!(f, "LUKS1: {e}"),
            Error::Luks2(e) => write!(f, "LUKS2: {e}"),
            Error::Tcrypt(e) => write!(f, "TCRYPT: {e}"),
            Error::Bitlk(e) => write!(f, "BITLK: {e}"),
            Error::Fvault2(e) => write!(f, "FVAULT2: {e}"),
            Error::LoopAes(e) => write!(f, "loop-AES: {e}"),
            Error::Integrity(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            Error::Crypto(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

impl From<cryptblk_crypto::Error> for Error {
    fn from(e: cryptblk_crypto::Error) -> Self {
        Error::Crypto(e)
    }
}

impl From<Luks1Error> for Error {
    fn from(e: Luks1Error) -> Self {
        Error::Luks1(e)
    }
}

impl From<Luks2Error> for Error {
    fn from(e: Luks2Error) -> Self {
        Error::Luks2(e)
    }
}

/// Each format's error goes into [`Error`] by `?`.
macro_rules! from_format_error {
    ($($variant:ident($ty:ty)),*) => {$(
        impl From<$ty> for Error {
            fn from(e: $ty) -> Self {
                Error::$variant(e)
            }
        }
    )*};
}
from_format_error!(
    Tcrypt(TcryptError),
    Bitlk(BitlkError),
    Fvault2(Fvault2Error),
    LoopAes(LoopAesError),
    Integrity(IntegrityError)
);

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
