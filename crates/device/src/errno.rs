//! The one mapping from a device error to the Linux errno a frontend reports.

use std::io;

/// The Linux errno for `e`: the OS error itself when there is one (the backend is a file
/// or a block device), otherwise one chosen by the error's kind. Frontends narrow it to
/// what their protocol can carry (NBD has only a few error values).
pub fn errno_of(e: &io::Error) -> i32 {
    if let Some(code) = e.raw_os_error() {
        return code;
    }
    use io::ErrorKind::*;
    match e.kind() {
        InvalidInput => EINVAL,
        Unsupported => EOPNOTSUPP,
        // Without an OS error, a volume refusing a write: it is read-only.
        PermissionDenied | ReadOnlyFilesystem => EROFS,
        StorageFull => ENOSPC,
        QuotaExceeded => EDQUOT,
        FileTooLarge => EFBIG,
        OutOfMemory => ENOMEM,
        _ => EIO,
    }
}

// Linux values (asm-generic/errno-base.h, errno.h).
/// Linux `EPERM`: operation not permitted.
pub const EPERM: i32 = 1;
/// Linux `EIO`: I/O error; the fallback for errors without a better match.
pub const EIO: i32 = 5;
/// Linux `ENOMEM`: out of memory.
pub const ENOMEM: i32 = 12;
/// Linux `EACCES`: permission denied.
pub const EACCES: i32 = 13;
/// Linux `EINVAL`: invalid argument (e.g. a request out of bounds or misaligned).
pub const EINVAL: i32 = 22;
/// Linux `EFBIG`: file too large.
pub const EFBIG: i32 = 27;
/// Linux `ENOSPC`: no space left on the device.
pub const ENOSPC: i32 = 28;
/// Linux `EROFS`: read-only file system; a write to a read-only device.
pub const EROFS: i32 = 30;
/// Linux `EOPNOTSUPP`: operation not supported (e.g. a discard where discards are off).
pub const EOPNOTSUPP: i32 = 95;
/// Linux `EDQUOT`: disk quota exceeded.
pub const EDQUOT: i32 = 122;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_errors_pass_through_and_kinds_map() {
        assert_eq!(errno_of(&io::Error::from_raw_os_error(ENOSPC)), ENOSPC);
        assert_eq!(errno_of(&io::Error::from_raw_os_error(71)), 71);
        let k = |k| errno_of(&io::Error::from(k));
        assert_eq!(k(io::ErrorKind::PermissionDenied), EROFS);
        assert_eq!(k(io::ErrorKind::StorageFull), ENOSPC);
        assert_eq!(k(io::ErrorKind::Unsupported), EOPNOTSUPP);
        assert_eq!(k(io::ErrorKind::InvalidInput), EINVAL);
        assert_eq!(k(io::ErrorKind::UnexpectedEof), EIO);
    }
}
