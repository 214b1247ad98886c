//! CLI errors and the exit codes they map to (cryptsetup's, see README "Exit codes").

use std::fmt;

/// Exit codes, as cryptsetup documents them.
pub(crate) const EXIT_OK: i32 = 0;
pub(crate) const EXIT_USAGE: i32 = 1;
pub(crate) const EXIT_PERMISSION: i32 = 2;
pub(crate) const EXIT_NO_MEMORY: i32 = 3;
pub(crate) const EXIT_NO_DEVICE: i32 = 4;
pub(crate) const EXIT_BUSY: i32 = 5;

#[derive(Debug)]
pub(crate) struct CliError {
    pub code: i32,
    pub message: String,
}

impl CliError {
    pub(crate) fn new(code: i32, message: impl Into<String>) -> Self {
        CliError {
            code,
            message: message.into(),
        }
    }
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self::new(EXIT_USAGE, message)
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<cryptblk_format::Error> for CliError {
    fn from(e: cryptblk_format::Error) -> Self {
        use cryptblk_format::Error as E;
        let code = match &e {
            E::WrongPassphrase => EXIT_PERMISSION,
            E::Io(io) if io.kind() == std::io::ErrorKind::NotFound => EXIT_NO_DEVICE,
            E::Io(io) if io.kind() == std::io::ErrorKind::OutOfMemory => EXIT_NO_MEMORY,
            _ => EXIT_USAGE,
        };
        CliError::new(code, e.to_string())
    }
}

impl From<cryptblk_crypto::Error> for CliError {
    fn from(e: cryptblk_crypto::Error) -> Self {
        CliError::usage(e.to_string())
    }
}

pub(crate) type CliResult<T> = Result<T, CliError>;

/// Attaches the path to an I/O error and picks the exit code.
pub(crate) fn io_err(path: &std::path::Path, e: std::io::Error) -> CliError {
    let code = match e.kind() {
        std::io::ErrorKind::NotFound => EXIT_NO_DEVICE,
        std::io::ErrorKind::PermissionDenied => EXIT_NO_DEVICE,
        // Remote storage that cannot be reached is a missing device too.
        std::io::ErrorKind::ConnectionRefused
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::ConnectionAborted
        | std::io::ErrorKind::HostUnreachable
        | std::io::ErrorKind::NetworkUnreachable
        | std::io::ErrorKind::TimedOut => EXIT_NO_DEVICE,
        std::io::ErrorKind::ResourceBusy | std::io::ErrorKind::WouldBlock => EXIT_BUSY,
        _ => EXIT_USAGE,
    };
    CliError::new(code, format!("{}: {e}", path.display()))
}
