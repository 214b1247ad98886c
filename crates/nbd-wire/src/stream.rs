//! The stream of an NBD connection, either side: a socket, or a socket that may switch to
//! TLS (`NBD_OPT_STARTTLS`).

use crate::socket::Socket;
use crate::tls::TlsStream;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A connection's stream; all methods take `&self` so the read and write halves can be used
/// by different threads at the same time.
pub enum AnyStream {
    /// A socket, plaintext.
    Plain(Socket),
    /// A socket on a side with TLS configured: plaintext until NBD_OPT_STARTTLS, TLS after.
    Tls(Box<TlsStream>),
}

impl From<UnixStream> for AnyStream {
    fn from(s: UnixStream) -> AnyStream {
        AnyStream::Plain(Socket::Unix(s))
    }
}

impl From<TcpStream> for AnyStream {
    fn from(s: TcpStream) -> AnyStream {
        AnyStream::Plain(Socket::Tcp(s))
    }
}

impl AnyStream {
    /// The socket under the stream.
    pub fn socket(&self) -> &Socket {
        match self {
            AnyStream::Plain(s) => s,
            AnyStream::Tls(t) => t.raw(),
        }
    }

    /// A second handle on the socket (only ever used to shut it down from another thread).
    pub fn try_clone(&self) -> io::Result<AnyStream> {
        Ok(AnyStream::Plain(self.socket().try_clone()?))
    }

    /// The TLS layer, on a side that has TLS configured.
    pub fn tls(&self) -> Option<&TlsStream> {
        match self {
            AnyStream::Tls(t) => Some(t),
            AnyStream::Plain(_) => None,
        }
    }

    /// Whether TLS is on (after NBD_OPT_STARTTLS).
    pub fn tls_active(&self) -> bool {
        self.tls().is_some_and(TlsStream::is_active)
    }

    /// Reads what is there (at least one byte, or 0 at the end), retrying on EINTR.
    pub fn read_some(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            AnyStream::Plain(s) => s.read_some(buf),
            AnyStream::Tls(t) => loop {
                match t.read_some(buf) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    r => return r,
                }
            },
        }
    }

    /// Reads what is there without waiting: `None` when nothing is. Under TLS only before
    /// it starts (a readable socket may then hold part of a record).
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        self.socket().try_read(buf)
    }

    /// Writes all of `buf`.
    pub fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        match self {
            AnyStream::Plain(s) => s.write_all(buf),
            AnyStream::Tls(t) => t.write_all(buf),
        }
    }

    /// Shuts the socket down (`how`), ignoring errors.
    pub fn shutdown(&self, how: Shutdown) {
        self.socket().shutdown(how)
    }

    /// Sets the socket's read timeout, ignoring errors.
    pub fn set_read_timeout(&self, t: Option<Duration>) {
        self.socket().set_read_timeout(t)
    }

    /// Sets the socket's write timeout, ignoring errors.
    pub fn set_write_timeout(&self, t: Option<Duration>) {
        self.socket().set_write_timeout(t)
    }
}
