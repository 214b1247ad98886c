//! The NBD protocol as both ends see it: the wire format's constants and messages
//! ([`proto`]), the socket under a connection ([`AnyStream`]: unix or TCP, and TLS over
//! either after `NBD_OPT_STARTTLS`) and the TLS layer itself (rustls for the handshake,
//! cryptblk's record layer after it). The server (`cryptblk-nbd`, a frontend) and the
//! client (`cryptblk-storage`, a backend) are built on it and on nothing of each other.

#![forbid(unsafe_code)]

pub mod proto;
mod socket;
mod stream;
mod tls;

pub use socket::{Socket, lock};
pub use stream::AnyStream;
pub use tls::{NbdClientTls, NbdTls, SYSTEM_CA_BUNDLE, TlsMode, TlsSide, TlsStream};
