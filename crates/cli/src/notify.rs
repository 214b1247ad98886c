//! systemd's service notification protocol (sd_notify(3)): a `Type=notify` service tells
//! the manager it is ready (`READY=1`, once the frontend accepts clients), what it is
//! doing (`STATUS=`) and that it is stopping (`STOPPING=1`), as datagrams on the socket
//! `$NOTIFY_SOCKET` names (a path, or `@name` in the abstract namespace). Without the
//! variable nothing is sent. The protocol is small enough to speak directly; libsystemd
//! is not needed for it.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (newline-separated `KEY=VALUE` lines) to the service manager, if one
/// listens; a failure is not the service's (it is said once on stderr, never fatal).
pub(crate) fn notify(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send(&target, state) {
        eprintln!(
            "cannot notify the service manager at {}: {e}",
            target.to_string_lossy()
        );
    }
}

fn send(target: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let sock = UnixDatagram::unbound()?;
    let bytes = target.as_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else if bytes.first() == Some(&b'/') {
        sock.send_to(state.as_bytes(), target)?;
    } else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not an absolute path or an @abstract name",
        ));
    }
    Ok(())
}

/// A `STATUS=` line's value on one line.
pub(crate) fn status_line(s: &str) -> String {
    s.replace('\n', " ")
}
