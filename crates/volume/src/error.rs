use std::fmt;

/// Errors opening or setting up a volume (I/O errors of running volumes are `io::Error`s).
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    Io(std::io::Error),
    Format(cryptblk_format::Error),
    Crypto(cryptblk_crypto::Error),
    /// The storage is smaller than the data segment needs.
    TooSmall {
        need: u64,
        have: u64,
    },
    /// Another process has the volume open.
    Busy(String),
    Invalid(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "I/O error: {e}"),
            Error::Format(e) => write!(f, "{e}"),
            Error::Crypto(e) => write!(f, "{e}"),
            Error::TooSmall { need, have } => {
                write!(
                    f,
                    "backing storage too small: need {need} bytes, have {have}"
                )
            }
            Error::Busy(s) => write!(f, "{s} is in use by another process"),
            Error::Invalid(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}
impl From<cryptblk_format::Error> for Error {
    fn from(e: cryptblk_format::Error) -> Self {
        Error::Format(e)
    }
}
impl From<cryptblk_crypto::Error> for Error {
    fn from(e: cryptblk_crypto::Error) -> Self {
        Error::Crypto(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;
