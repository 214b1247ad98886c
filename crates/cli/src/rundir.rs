//! The run directory and the files and sockets cryptblk creates, safe against other local
//! users: nothing here trusts the umask, follows a link another user could have planted,
//! or reuses a directory someone else owns or can write to.
//!
//! The rules (ssh's for key directories, applied to every path we create things in):
//! - a run directory is created 0700; an existing one must be a real directory (not a
//!   link), owned by us, and writable by nobody else;
//! - every directory above it must belong to root or to us, and any that others can write
//!   to must be sticky (like /tmp), so nobody can swap the entries we rely on;
//! - files are created 0600 with `O_NOFOLLOW | O_EXCL` (a stale one of ours is unlinked
//!   first); sockets are bound under a 0177 umask and then set to their final mode.

#![allow(unsafe_code)]

use crate::error::{CliError, CliResult, EXIT_PERMISSION, io_err};
use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use crate::process::euid;

fn unsafe_path(path: &Path, why: impl std::fmt::Display) -> CliError {
    CliError::new(
        EXIT_PERMISSION,
        format!(
            "refusing to use {}: {why} (another user could read or replace what cryptblk keeps there)",
            path.display()
        ),
    )
}

/// Checks that no other user can replace `path` or any directory on the way to it.
fn check_ancestors(path: &Path) -> CliResult<()> {
    let me = euid();
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| io_err(path, e))?
            .join(path)
    };
    for dir in abs.ancestors().skip(1) {
        // A link on the way must be root's or ours: whoever owns it can re-point it.
        if let Ok(l) = std::fs::symlink_metadata(dir)
            && l.file_type().is_symlink()
            && l.uid() != 0
            && l.uid() != me
        {
            return Err(unsafe_path(
                path,
                format!("{} is a link owned by uid {}", dir.display(), l.uid()),
            ));
        }
        let Ok(m) = std::fs::metadata(dir) else {
            continue; // not there yet: created by us below, then checked again
        };
        if m.uid() != 0 && m.uid() != me {
            return Err(unsafe_path(
                path,
                format!("{} belongs to uid {}", dir.display(), m.uid()),
            ));
        }
        if m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0 {
            return Err(unsafe_path(
                path,
                format!(
                    "{} is writable by other users and not sticky (mode {:o})",
                    dir.display(),
                    m.mode() & 0o7777
                ),
            ));
        }
    }
    Ok(())
}

/// Checks an existing directory we are to keep private things in.
fn check_private_dir(dir: &Path) -> CliResult<()> {
    let m = std::fs::symlink_metadata(dir).map_err(|e| io_err(dir, e))?;
    if m.file_type().is_symlink() {
        return Err(unsafe_path(dir, "it is a symbolic link"));
    }
    if !m.is_dir() {
        return Err(unsafe_path(dir, "it is not a directory"));
    }
    if m.uid() != euid() {
        return Err(unsafe_path(dir, format!("it belongs to uid {}", m.uid())));
    }
    if m.mode() & 0o022 != 0 {
        return Err(unsafe_path(
            dir,
            format!(
                "it is writable by other users (mode {:o})",
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Creates `dir` (0700, whatever the umask) or checks the existing one; every directory
/// above it is checked too. Returns `dir`.
pub(crate) fn ensure_private_dir(dir: &Path) -> CliResult<PathBuf> {
    check_ancestors(dir)?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty())
        && !parent.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| io_err(parent, e))?;
        // Someone may have made a missing directory first, with their modes.
        check_ancestors(dir)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {
            // The umask may have taken bits we need (0700 & !umask): set them exactly.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| io_err(dir, e))?;
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err(dir, e)),
    }
    check_private_dir(dir)?;
    Ok(dir.to_path_buf())
}

/// Checks a run directory before trusting what answers in it (`close`, `status`, `list`).
/// `Ok(false)` when it does not exist (then nothing is open).
pub(crate) fn check_existing(dir: &Path) -> CliResult<bool> {
    if std::fs::symlink_metadata(dir).is_err() {
        return Ok(false);
    }
    check_ancestors(dir)?;
    check_private_dir(dir)?;
    Ok(true)
}

/// Creates `path` anew, 0600, never following a link: an old file of that name (ours: it
/// lies in a private directory) is unlinked first.
pub(crate) fn create_private_file(path: &Path) -> CliResult<File> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(path, e)),
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| io_err(path, e))
}

/// The claim on a volume name in a run directory: `NAME.lock` (0600, empty, never
/// removed, so that no two processes can each lock a different file of that name), locked
/// (`flock`) as long as this value (in practice, the serving process) lives. Taken before
/// anything is served, so a second `open NAME` is refused before it starts a frontend.
pub(crate) struct NameClaim {
    _file: File,
}

/// Claims `name` in the private run directory `dir`; `Ok(None)` when another process
/// holds it.
pub(crate) fn claim_name(dir: &Path, name: &str) -> CliResult<Option<NameClaim>> {
    let path = dir.join(format!("{name}.lock"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| io_err(&path, e))?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(NameClaim { _file: file })),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(io_err(&path, e.into())),
    }
}

/// Writes `contents` into a new private file at `path` (see [`create_private_file`]).
pub(crate) fn write_private_file(path: &Path, contents: &[u8]) -> CliResult<()> {
    let mut f = create_private_file(path)?;
    io::Write::write_all(&mut f, contents).map_err(|e| io_err(path, e))
}

/// Reads a small file of ours without following a link.
pub(crate) fn read_private_file(path: &Path) -> Option<String> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let mut s = String::new();
    io::Read::read_to_string(&mut io::Read::take(&mut f, 4096), &mut s).ok()?;
    Some(s)
}

/// Who may connect to a unix socket we serve on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SocketAccess {
    /// Permission bits of the socket file (connecting needs write permission).
    pub mode: u32,
    /// Group to give the socket to, when sharing it with a group on purpose.
    pub gid: Option<u32>,
}

impl Default for SocketAccess {
    fn default() -> Self {
        SocketAccess {
            mode: 0o600,
            gid: None,
        }
    }
}

/// Sets the process umask and puts it back on drop.
struct UmaskGuard(libc::mode_t);

impl UmaskGuard {
    fn set(mask: libc::mode_t) -> Self {
        // SAFETY: umask takes a plain integer and cannot fail.
        UmaskGuard(unsafe { libc::umask(mask) })
    }
}

impl Drop for UmaskGuard {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::umask(self.0) };
    }
}

/// Binds a unix socket at `path` with exactly `access.mode`: the umask in force during
/// `bind` is its complement, so the node is born with its final mode (no later chmod
/// through a path someone could swap for a link). The directories above it must be safe
/// (see [`check_ancestors`]); with `access.gid` it is given to that group (`lchown`: never
/// through a link).
pub(crate) fn bind_socket(path: &Path, access: SocketAccess) -> CliResult<UnixListener> {
    check_socket_path_length(path)?;
    check_ancestors(path)?;
    let l = {
        let _mask = UmaskGuard::set(!access.mode & 0o777);
        UnixListener::bind(path).map_err(|e| io_err(path, e))?
    };
    if let Some(gid) = access.gid {
        std::os::unix::fs::lchown(path, None, Some(gid)).map_err(|e| io_err(path, e))?;
    }
    Ok(l)
}

/// The longest path a unix socket address holds (`sun_path` is 108 bytes with its NUL).
const SOCKET_PATH_MAX: usize = 107;

/// A socket path too long for a unix socket address is refused up front, with what to do
/// about it (the kernel's own answer is a bare EINVAL).
pub(crate) fn check_socket_path_length(path: &Path) -> CliResult<()> {
    let len = path.as_os_str().len();
    if len <= SOCKET_PATH_MAX {
        return Ok(());
    }
    Err(CliError::usage(format!(
        "{}: a unix socket path holds at most {SOCKET_PATH_MAX} bytes and this one has {len}: \
         name a shorter one (--nbd unix:PATH), or a shorter run directory (--run-dir, \
         $XDG_RUNTIME_DIR)",
        path.display()
    )))
}

/// `--socket-mode` (octal, e.g. 660) and `--socket-group` (name or number).
pub(crate) fn socket_access(mode: Option<&str>, group: Option<&str>) -> CliResult<SocketAccess> {
    let mode = match mode {
        None => 0o600,
        Some(m) => u32::from_str_radix(m.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| {
                CliError::usage(format!(
                    "--socket-mode takes octal permissions (e.g. 660), not '{m}'"
                ))
            })?,
    };
    let gid = group.map(group_id).transpose()?;
    Ok(SocketAccess { mode, gid })
}

fn group_id(name: &str) -> CliResult<u32> {
    if let Ok(n) = name.parse() {
        return Ok(n);
    }
    std::fs::read_to_string("/etc/group")
        .ok()
        .and_then(|g| {
            g.lines().find_map(|l| {
                let mut f = l.split(':');
                (f.next() == Some(name))
                    .then(|| f.nth(1).and_then(|gid| gid.parse().ok()))
                    .flatten()
            })
        })
        .ok_or_else(|| CliError::usage(format!("--socket-group: no group named '{name}'")))
}

/// The (device, inode) of what is at `path` now, to remove only what we created.
pub(crate) fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Removes `path` only if it is still the entry `id` names (not one put there since).
pub(crate) fn remove_if_same(path: &Path, id: Option<(u64, u64)>) {
    if id.is_some() && identity(path) == id {
        let _ = std::fs::remove_file(path);
    }
}

/// Makes `path` free for a new socket: nothing there, or a stale socket nobody answers on
/// (removed). A live socket is busy; anything else (a file, a directory, a link) is left
/// alone and refused, never deleted.
pub(crate) fn clear_stale_socket(path: &Path) -> CliResult<()> {
    use std::os::unix::fs::FileTypeExt;
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(path, e)),
    };
    if !m.file_type().is_socket() {
        return Err(CliError::usage(format!(
            "{} exists and is not a socket: refusing to replace it (remove it, or choose another path)",
            path.display()
        )));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(CliError::new(
            crate::error::EXIT_BUSY,
            format!("{} is already served by another process", path.display()),
        )),
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
            std::fs::remove_file(path).map_err(|e| io_err(path, e))
        }
        Err(e) => Err(io_err(path, e)),
    }
}

// ---------------------------------------------------------------------------------------
// Where a served volume's files live, and the names they may have.
// ---------------------------------------------------------------------------------------

pub(crate) fn default_run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return Path::new(&d).join("cryptblk");
    }
    let uid = crate::process::uid();
    if uid == 0 {
        PathBuf::from("/run/cryptblk")
    } else {
        std::env::temp_dir().join(format!("cryptblk-{uid}"))
    }
}

pub(crate) fn run_dir(d: &Option<PathBuf>) -> PathBuf {
    d.clone().unwrap_or_else(default_run_dir)
}

/// The run directory of a command that creates things in it: made 0700, or checked to be
/// private if it exists (see `rundir`).
pub(crate) fn private_run_dir(d: &Option<PathBuf>) -> CliResult<PathBuf> {
    ensure_private_dir(&run_dir(d))
}

/// The run directory of a command that only talks to what runs there: `None` when it
/// does not exist; an error when it is not private (what answers there may not be ours).
pub(crate) fn existing_run_dir(d: &Option<PathBuf>) -> CliResult<Option<PathBuf>> {
    let dir = run_dir(d);
    Ok(check_existing(&dir)?.then_some(dir))
}

pub(crate) fn check_name(name: &str) -> CliResult<()> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        || name.starts_with('.')
    {
        return Err(CliError::usage(format!(
            "invalid name '{name}' (letters, digits, - _ . ; up to 64)"
        )));
    }
    Ok(())
}
