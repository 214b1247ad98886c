//! A connected socket, unix or TCP: what an NBD connection and its TLS layer run over.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// A connected unix or TCP socket; all methods take `&self` so the read and write halves
/// can be used by different threads at the same time.
pub enum Socket {
    /// A unix socket.
    Unix(UnixStream),
    /// A TCP connection.
    Tcp(TcpStream),
}

impl From<UnixStream> for Socket {
    fn from(s: UnixStream) -> Socket {
        Socket::Unix(s)
    }
}

impl From<TcpStream> for Socket {
    fn from(s: TcpStream) -> Socket {
        Socket::Tcp(s)
    }
}

impl Socket {
    /// A second handle on the socket (for shutting it down from another thread).
    pub fn try_clone(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
        })
    }

    /// Reads what is there (at least one byte, or 0 at the end), retrying on EINTR.
    pub fn read_some(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let r = match self {
                Socket::Unix(s) => (&*s).read(buf),
                Socket::Tcp(s) => (&*s).read(buf),
            };
            match r {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r,
            }
        }
    }

    /// Reads what is there without waiting: `None` when nothing is.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        use rustix::net::{RecvFlags, recv};
        let r = match self {
            Socket::Unix(s) => recv(s, buf, RecvFlags::DONTWAIT),
            Socket::Tcp(s) => recv(s, buf, RecvFlags::DONTWAIT),
        };
        match r {
            Ok((n, _)) => Ok(Some(n)),
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes all of `buf`.
    pub fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        match self {
            Socket::Unix(s) => (&*s).write_all(buf),
            Socket::Tcp(s) => (&*s).write_all(buf),
        }
    }

    /// Shuts the socket down (`how`), ignoring errors.
    pub fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Socket::Unix(s) => s.shutdown(how),
            Socket::Tcp(s) => s.shutdown(how),
        };
    }

    /// Sets the socket's read timeout, ignoring errors.
    pub fn set_read_timeout(&self, t: Option<Duration>) {
        let _ = match self {
            Socket::Unix(s) => s.set_read_timeout(t),
            Socket::Tcp(s) => s.set_read_timeout(t),
        };
    }

    /// Sets the socket's write timeout, ignoring errors.
    pub fn set_write_timeout(&self, t: Option<Duration>) {
        let _ = match self {
            Socket::Unix(s) => s.set_write_timeout(t),
            Socket::Tcp(s) => s.set_write_timeout(t),
        };
    }
}

/// Locks `m`, taking the data of a poisoned mutex as it is (a panicking thread does not
/// make the connection's state unusable for the others).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
