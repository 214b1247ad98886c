//! This process's identity, how it may be inspected, and its early end: the only system
//! calls the CLI makes itself outside the run directory's (`rundir`).

#![allow(unsafe_code)]

/// The real user id.
pub(crate) fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// The effective user id (who owns what we create).
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Makes this process non-dumpable: no core dump, and no ptrace or /proc/PID/mem for
/// other (non-root) processes, even of the same user.
pub(crate) fn set_not_dumpable() {
    // SAFETY: prctl(PR_SET_DUMPABLE) takes plain integers and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}

/// Whether this process is dumpable (shown by `status`).
pub(crate) fn is_dumpable() -> bool {
    // SAFETY: prctl(PR_GET_DUMPABLE) takes plain integers and touches no memory of ours.
    unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) != 0 }
}

/// Ends the process now with `code`, without the C library's exit handlers: they would
/// run librbd's static destructors while a thread that gave up waiting is still inside
/// librbd (a crash instead of the exit code). Output already written stays written.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit takes an integer, touches no memory of ours and does not return.
    unsafe { libc::_exit(code) }
}

/// Whether process `pid` has exited for good: gone, or a zombie (not yet reaped) whose
/// other threads have ended too. The first thread to exit shows a zombie while the others
/// still run and hold the process's files (a data file's lock, a block device's O_EXCL
/// claim): a `close` that returned then would leave the device busy for the next opener.
pub(crate) fn has_exited(pid: i32) -> bool {
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true);
    zombie
        && std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.count() <= 1)
            .unwrap_or(true)
}
