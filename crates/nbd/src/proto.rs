//! NBD wire constants and small encoders (see NetworkBlockDevice/nbd `doc/proto.md`).

use std::io;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;

// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;

// Info types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;

// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;

// Structured reply flags and types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

// Errors.
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ESHUTDOWN: u32 = 108;

/// Largest request payload (and read length) the server accepts: 32 MiB.
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Largest option payload accepted in the handshake; anything longer closes the connection.
/// (An export name is at most 4096 bytes; GO/INFO add 6 bytes plus 2 per info request.)
pub const MAX_OPTION_LEN: u32 = 16 << 10;
/// Bytes of a request header.
pub const REQUEST_LEN: usize = 28;
/// Bytes of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Bytes of a structured reply chunk header.
pub const STRUCTURED_HDR_LEN: usize = 20;

/// A transmission request header as sent by the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub magic: u32,
    pub flags: u16,
    pub typ: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

impl Request {
    pub fn parse(b: &[u8; REQUEST_LEN]) -> Request {
        Request {
            magic: u32::from_be_bytes(b[0..4].try_into().unwrap()),
            flags: u16::from_be_bytes(b[4..6].try_into().unwrap()),
            typ: u16::from_be_bytes(b[6..8].try_into().unwrap()),
            cookie: u64::from_be_bytes(b[8..16].try_into().unwrap()),
            offset: u64::from_be_bytes(b[16..24].try_into().unwrap()),
            len: u32::from_be_bytes(b[24..28].try_into().unwrap()),
        }
    }

    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&self.magic.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.typ.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.len.to_be_bytes());
        b
    }
}

/// Bytes of an option header in the handshake (magic, option, length).
pub const OPTION_HDR_LEN: usize = 16;

/// An option header sent by the client during the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub magic: u64,
    pub option: u32,
    pub len: u32,
}

impl OptionHeader {
    pub fn parse(b: &[u8; OPTION_HDR_LEN]) -> OptionHeader {
        OptionHeader {
            magic: u64::from_be_bytes(b[0..8].try_into().unwrap()),
            option: u32::from_be_bytes(b[8..12].try_into().unwrap()),
            len: u32::from_be_bytes(b[12..16].try_into().unwrap()),
        }
    }

    /// Checks magic and length before the payload is read; the error says why the
    /// connection must be closed.
    pub fn check(&self) -> Result<(), &'static str> {
        if self.magic != IHAVEOPT {
            return Err("bad option magic");
        }
        if self.len > MAX_OPTION_LEN {
            return Err("option too long");
        }
        Ok(())
    }
}

/// The payload of NBD_OPT_INFO / NBD_OPT_GO: export name and requested information types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest<'a> {
    pub name: &'a [u8],
    /// Raw big-endian u16 info types, two bytes each.
    requests: &'a [u8],
}

impl<'a> InfoRequest<'a> {
    /// Parses the option data; the error is the message for NBD_REP_ERR_INVALID.
    pub fn parse(data: &'a [u8]) -> Result<InfoRequest<'a>, &'static [u8]> {
        if data.len() < 6 {
            return Err(b"option data too short");
        }
        let name_len = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize;
        if name_len > data.len() - 6 {
            return Err(b"export name length exceeds option length");
        }
        let name = &data[4..4 + name_len];
        let nreq =
            u16::from_be_bytes(data[4 + name_len..6 + name_len].try_into().unwrap()) as usize;
        let requests = &data[6 + name_len..];
        if requests.len() != 2 * nreq {
            return Err(b"information request count does not match option length");
        }
        Ok(InfoRequest { name, requests })
    }

    /// The requested information types, in order.
    pub fn types(&self) -> impl Iterator<Item = u16> + '_ {
        self.requests
            .chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
    }

    /// Whether information type `t` was requested.
    pub fn wants(&self, t: u16) -> bool {
        self.types().any(|x| x == t)
    }
}

/// Writes a simple reply header into `out` (16 bytes).
pub fn simple_reply(out: &mut [u8], error: u32, cookie: u64) {
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
}

/// Writes a structured reply chunk header into `out` (20 bytes).
pub fn structured_header(out: &mut [u8], flags: u16, typ: u16, cookie: u64, len: u32) {
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&typ.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out[16..20].copy_from_slice(&len.to_be_bytes());
}

/// Appends an option reply (fixed newstyle) to `out`.
pub fn option_reply(out: &mut Vec<u8>, option: u32, reply: u32, data: &[u8]) {
    out.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// Maps a backend error to the NBD error value sent to the client (NBD carries only a few).
pub fn errno_of(e: &io::Error) -> u32 {
    use cryptblk_device::errno as linux;
    match cryptblk_device::errno_of(e) {
        linux::EPERM | linux::EACCES | linux::EROFS => EPERM,
        linux::ENOMEM => ENOMEM,
        linux::EINVAL => EINVAL,
        linux::EFBIG | linux::ENOSPC | linux::EDQUOT => ENOSPC,
        _ => EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_roundtrip() {
        let r = Request {
            magic: REQUEST_MAGIC,
            flags: 3,
            typ: 1,
            cookie: 0x1122_3344_5566_7788,
            offset: 4096,
            len: 512,
        };
        let b = r.encode();
        assert_eq!(&b[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(Request::parse(&b), r);
    }

    #[test]
    fn reply_encodings() {
        let mut b = [0u8; 20];
        simple_reply(&mut b, EIO, 7);
        assert_eq!(
            &b[..16],
            &[0x67, 0x44, 0x66, 0x98, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 7]
        );
        structured_header(&mut b, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, 9, 8 + 512);
        assert_eq!(
            &b,
            &[
                0x66, 0x8e, 0x33, 0xef, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 2, 8
            ]
        );
        let mut v = Vec::new();
        option_reply(&mut v, OPT_GO, REP_ERR_UNSUP, b"x");
        assert_eq!(v.len(), 21);
        assert_eq!(&v[0..8], &OPT_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&v[12..16], &[0x80, 0, 0, 1]);
    }

    #[test]
    fn option_and_info_parsing() {
        let mut h = [0u8; OPTION_HDR_LEN];
        h[..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        h[8..12].copy_from_slice(&OPT_GO.to_be_bytes());
        h[12..16].copy_from_slice(&(MAX_OPTION_LEN + 1).to_be_bytes());
        let o = OptionHeader::parse(&h);
        assert_eq!((o.option, o.check()), (OPT_GO, Err("option too long")));
        h[0] = 0;
        assert_eq!(OptionHeader::parse(&h).check(), Err("bad option magic"));

        let data = [0, 0, 0, 2, b'h', b'd', 0, 2, 0, 1, 0, 3];
        let r = InfoRequest::parse(&data).unwrap();
        assert_eq!(r.name, b"hd");
        assert_eq!(r.types().collect::<Vec<_>>(), [INFO_NAME, INFO_BLOCK_SIZE]);
        assert!(r.wants(INFO_NAME) && !r.wants(INFO_DESCRIPTION));
        assert!(InfoRequest::parse(&data[..5]).is_err());
        assert!(InfoRequest::parse(&data[..11]).is_err());
        // Name length larger than the data, including values that overflow 32 bits.
        assert!(InfoRequest::parse(&[0xff, 0xff, 0xff, 0xff, 0, 0]).is_err());
    }

    #[test]
    fn error_mapping() {
        assert_eq!(errno_of(&io::Error::from_raw_os_error(28)), ENOSPC);
        assert_eq!(errno_of(&io::Error::from_raw_os_error(30)), EPERM);
        assert_eq!(
            errno_of(&io::Error::from(io::ErrorKind::PermissionDenied)),
            EPERM
        );
        assert_eq!(
            errno_of(&io::Error::from(io::ErrorKind::InvalidInput)),
            EINVAL
        );
        assert_eq!(
            errno_of(&io::Error::from(io::ErrorKind::StorageFull)),
            ENOSPC
        );
        assert_eq!(errno_of(&io::Error::other("boom")), EIO);
        assert_eq!(errno_of(&io::Error::from(io::ErrorKind::InvalidData)), EIO);
    }
}
