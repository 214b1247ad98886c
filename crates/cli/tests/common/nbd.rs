//! A minimal NBD client whose every call can fail (for tests that kill the server under
//! it): fixed newstyle, NBD_OPT_EXPORT_NAME, simple replies, one request at a time.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

pub(crate) const CMD_READ: u16 = 0;
pub(crate) const CMD_WRITE: u16 = 1;
pub(crate) const CMD_DISC: u16 = 2;
pub(crate) const CMD_FLUSH: u16 = 3;
pub(crate) const REQUEST_MAGIC: u32 = 0x2560_9513;
pub(crate) const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

pub(crate) struct NbdClient {
    /// The connection, for tests that send (parts of) requests by hand.
    pub s: UnixStream,
    pub size: u64,
    cookie: u64,
}

/// The server's answer to a request: `Ok(errno)` (0 = success) or the connection failed.
pub(crate) type Reply<T> = io::Result<Result<T, u32>>;

impl NbdClient {
    pub(crate) fn connect(sock: &str, export: &str) -> io::Result<NbdClient> {
        let mut s = UnixStream::connect(sock)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello)?;
        if &hello[..8] != b"NBDMAGIC" {
            return Err(io::Error::other("not an NBD server"));
        }
        s.write_all(&3u32.to_be_bytes())?; // FIXED_NEWSTYLE | NO_ZEROES
        let mut opt = b"IHAVEOPT".to_vec();
        opt.extend_from_slice(&1u32.to_be_bytes()); // EXPORT_NAME
        opt.extend_from_slice(&(export.len() as u32).to_be_bytes());
        opt.extend_from_slice(export.as_bytes());
        s.write_all(&opt)?;
        let mut info = [0u8; 10];
        s.read_exact(&mut info)?;
        let size = u64::from_be_bytes(info[..8].try_into().unwrap());
        Ok(NbdClient { s, size, cookie: 0 })
    }

    /// The header of the next request (a new cookie), for sending by hand or with a payload.
    pub(crate) fn header(&mut self, typ: u16, offset: u64, len: u32) -> Vec<u8> {
        self.cookie += 1;
        let mut h = Vec::with_capacity(28);
        h.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        h.extend_from_slice(&0u16.to_be_bytes());
        h.extend_from_slice(&typ.to_be_bytes());
        h.extend_from_slice(&self.cookie.to_be_bytes());
        h.extend_from_slice(&offset.to_be_bytes());
        h.extend_from_slice(&len.to_be_bytes());
        h
    }

    fn request(&mut self, typ: u16, offset: u64, len: u32, payload: &[u8]) -> io::Result<u32> {
        let mut h = self.header(typ, offset, len);
        h.extend_from_slice(payload);
        self.s.write_all(&h)?;
        let mut r = [0u8; 16];
        self.s.read_exact(&mut r)?;
        assert_eq!(
            u32::from_be_bytes(r[..4].try_into().unwrap()),
            SIMPLE_REPLY_MAGIC
        );
        assert_eq!(u64::from_be_bytes(r[8..].try_into().unwrap()), self.cookie);
        Ok(u32::from_be_bytes(r[4..8].try_into().unwrap()))
    }

    pub(crate) fn write(&mut self, offset: u64, data: &[u8]) -> Reply<()> {
        Ok(
            match self.request(CMD_WRITE, offset, data.len() as u32, data)? {
                0 => Ok(()),
                e => Err(e),
            },
        )
    }

    pub(crate) fn read(&mut self, offset: u64, len: usize) -> Reply<Vec<u8>> {
        match self.request(CMD_READ, offset, len as u32, &[])? {
            0 => {
                let mut b = vec![0u8; len];
                self.s.read_exact(&mut b)?;
                Ok(Ok(b))
            }
            e => Ok(Err(e)),
        }
    }

    pub(crate) fn flush(&mut self) -> Reply<()> {
        Ok(match self.request(CMD_FLUSH, 0, 0, &[])? {
            0 => Ok(()),
            e => Err(e),
        })
    }

    pub(crate) fn disconnect(mut self) {
        let h = self.header(CMD_DISC, 0, 0);
        let _ = self.s.write_all(&h);
    }
}
