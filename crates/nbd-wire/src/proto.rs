//! NBD wire constants and small encoders (see NetworkBlockDevice/nbd `doc/proto.md`).

use std::io;

/// `NBDMAGIC` (the spec's `INIT_PASSWD`): the first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: newstyle magic, sent by the server after `NBDMAGIC` and by the client
/// before every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic that starts every fixed-newstyle option reply (`0x3e889045565a9`).
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// `NBD_REQUEST_MAGIC`: first field of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// `NBD_SIMPLE_REPLY_MAGIC` (formerly `NBD_REPLY_MAGIC`): first field of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// `NBD_STRUCTURED_REPLY_MAGIC`: first field of every structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
/// Handshake flag `NBD_FLAG_FIXED_NEWSTYLE`: the server speaks fixed newstyle
/// negotiation (options other than `NBD_OPT_EXPORT_NAME`, each answered by a reply).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag `NBD_FLAG_NO_ZEROES`: the server can leave out the 124 zero bytes after
/// the `NBD_OPT_EXPORT_NAME` reply if the client sets `NBD_FLAG_C_NO_ZEROES`.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag `NBD_FLAG_C_FIXED_NEWSTYLE`: the client speaks fixed newstyle negotiation.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag `NBD_FLAG_C_NO_ZEROES`: the server must not send the 124 zero bytes after
/// the `NBD_OPT_EXPORT_NAME` reply (only valid if the server offered `NBD_FLAG_NO_ZEROES`).
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags.
/// Transmission flag `NBD_FLAG_HAS_FLAGS`: must always be set.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
/// Transmission flag `NBD_FLAG_READ_ONLY`: the export is read-only; the server errors
/// every write command (this server with `EPERM`).
pub const FLAG_READ_ONLY: u16 = 1 << 1;
/// Transmission flag `NBD_FLAG_SEND_FLUSH`: the server supports `NBD_CMD_FLUSH`.
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
/// Transmission flag `NBD_FLAG_SEND_FUA`: the server supports `NBD_CMD_FLAG_FUA`.
pub const FLAG_SEND_FUA: u16 = 1 << 3;
/// Transmission flag `NBD_FLAG_SEND_TRIM`: the server supports `NBD_CMD_TRIM`.
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
/// Transmission flag `NBD_FLAG_SEND_WRITE_ZEROES`: the server supports
/// `NBD_CMD_WRITE_ZEROES` (and its `NBD_CMD_FLAG_NO_HOLE`).
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// Transmission flag `NBD_FLAG_SEND_DF`: the server honours `NBD_CMD_FLAG_DF` on reads;
/// only set once structured replies are negotiated.
pub const FLAG_SEND_DF: u16 = 1 << 7;
/// Transmission flag `NBD_FLAG_CAN_MULTI_CONN`: flushes and FUA writes are visible on
/// every connection to the export once replied to, so clients may use several connections.
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// Transmission flag `NBD_FLAG_SEND_CACHE`: the server supports `NBD_CMD_CACHE`.
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
/// Transmission flag `NBD_FLAG_SEND_FAST_ZERO`: the server honours
/// `NBD_CMD_FLAG_FAST_ZERO` on `NBD_CMD_WRITE_ZEROES`.
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// Options.
/// `NBD_OPT_EXPORT_NAME`: pick an export by name and enter transmission at once; there is
/// no option reply, so a refusal can only close the connection.
pub const OPT_EXPORT_NAME: u32 = 1;
/// `NBD_OPT_ABORT`: the client ends negotiation; the server acks and closes (soft
/// disconnect).
pub const OPT_ABORT: u32 = 2;
/// `NBD_OPT_LIST`: list exports, one `NBD_REP_SERVER` each, then `NBD_REP_ACK`.
pub const OPT_LIST: u32 = 3;
/// `NBD_OPT_STARTTLS`: the client asks to upgrade the connection to TLS.
pub const OPT_STARTTLS: u32 = 5;
/// `NBD_OPT_INFO`: query an export (`NBD_REP_INFO` replies, then `NBD_REP_ACK`) without
/// entering transmission.
pub const OPT_INFO: u32 = 6;
/// `NBD_OPT_GO`: like `NBD_OPT_INFO`, but the final `NBD_REP_ACK` enters transmission
/// with that export; errors are reported as option replies.
pub const OPT_GO: u32 = 7;
/// `NBD_OPT_STRUCTURED_REPLY`: the client asks for structured replies in transmission (no
/// option data); after `NBD_REP_ACK`, reads must be answered with structured replies.
pub const OPT_STRUCTURED_REPLY: u32 = 8;
/// `NBD_OPT_LIST_META_CONTEXT`: which metadata contexts match the client's queries (one
/// `NBD_REP_META_CONTEXT` each, id 0), then `NBD_REP_ACK`.
pub const OPT_LIST_META_CONTEXT: u32 = 9;
/// `NBD_OPT_SET_META_CONTEXT`: select the metadata contexts `NBD_CMD_BLOCK_STATUS` reports
/// (one `NBD_REP_META_CONTEXT` with its id each), then `NBD_REP_ACK`.
pub const OPT_SET_META_CONTEXT: u32 = 10;
/// `NBD_OPT_EXTENDED_HEADERS`: 64-bit request and reply headers; not supported (the
/// clients of Debian 12 do not ask for it, newer ones fall back to structured replies).
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// Option replies.
/// Option reply `NBD_REP_ACK`: the option succeeded, or the last of a list of replies; no data.
pub const REP_ACK: u32 = 1;
/// Option reply `NBD_REP_SERVER`: one export in an `NBD_OPT_LIST` answer (32-bit name
/// length, then the name).
pub const REP_SERVER: u32 = 2;
/// Option reply `NBD_REP_INFO`: one piece of export information for `NBD_OPT_INFO` /
/// `NBD_OPT_GO`, starting with its 16-bit `NBD_INFO_*` type.
pub const REP_INFO: u32 = 3;
/// Option reply `NBD_REP_META_CONTEXT`: a u32 context id, then the context's name.
pub const REP_META_CONTEXT: u32 = 4;
/// Option error `NBD_REP_ERR_UNSUP`: the server does not know or implement the option.
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
/// Option error `NBD_REP_ERR_POLICY`: the option is valid but server policy forbids it.
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
/// Option error `NBD_REP_ERR_INVALID`: the option is known but its data is malformed or
/// not allowed in this state.
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
/// Option error `NBD_REP_ERR_TLS_REQD`: the server requires TLS before this option.
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
/// Option error `NBD_REP_ERR_UNKNOWN`: the requested export does not exist.
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
/// Option error `NBD_REP_ERR_SHUTDOWN`: the server is shutting down and will not
/// negotiate further.
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;

// Info types.
/// `NBD_INFO_EXPORT`: export size in bytes (u64) and transmission flags (u16); always
/// sent before a successful `NBD_OPT_INFO` / `NBD_OPT_GO`.
pub const INFO_EXPORT: u16 = 0;
/// `NBD_INFO_NAME`: the export's canonical name.
pub const INFO_NAME: u16 = 1;
/// `NBD_INFO_DESCRIPTION`: a human-readable description of the export.
pub const INFO_DESCRIPTION: u16 = 2;
/// `NBD_INFO_BLOCK_SIZE`: minimum, preferred and maximum block size in bytes (u32 each).
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands.
/// `NBD_CMD_READ`: read `len` bytes at `offset`.
pub const CMD_READ: u16 = 0;
/// `NBD_CMD_WRITE`: write the `len` payload bytes that follow the request at `offset`.
pub const CMD_WRITE: u16 = 1;
/// `NBD_CMD_DISC`: the client disconnects; the server finishes outstanding requests,
/// sends no reply and closes.
pub const CMD_DISC: u16 = 2;
/// `NBD_CMD_FLUSH`: make every write already replied to durable before replying.
pub const CMD_FLUSH: u16 = 3;
/// `NBD_CMD_TRIM`: the client no longer needs `len` bytes at `offset`; the server may
/// discard them.
pub const CMD_TRIM: u16 = 4;
/// `NBD_CMD_WRITE_ZEROES`: make `len` bytes at `offset` read as zeroes, with no payload.
pub const CMD_WRITE_ZEROES: u16 = 6;
/// `NBD_CMD_CACHE`: the client will read the range soon; the server may prefetch it.
pub const CMD_CACHE: u16 = 5;
/// `NBD_CMD_BLOCK_STATUS`: the state of the range in each selected metadata context
/// (here `base:allocation`: hole, zero), as `NBD_REPLY_TYPE_BLOCK_STATUS` chunks.
pub const CMD_BLOCK_STATUS: u16 = 7;

// Command flags.
/// Command flag `NBD_CMD_FLAG_FUA` (force unit access): reply only once the command's
/// writes are durable.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// Command flag `NBD_CMD_FLAG_NO_HOLE` on `NBD_CMD_WRITE_ZEROES`: the zeroed range must
/// stay allocated (no hole punched).
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Command flag `NBD_CMD_FLAG_DF` (don't fragment) on `NBD_CMD_READ`: reply with at most
/// one content chunk; needs `NBD_FLAG_SEND_DF`.
pub const CMD_FLAG_DF: u16 = 1 << 2;
/// Command flag `NBD_CMD_FLAG_REQ_ONE` on `NBD_CMD_BLOCK_STATUS`: one descriptor per
/// context is enough.
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Command flag `NBD_CMD_FLAG_FAST_ZERO` on `NBD_CMD_WRITE_ZEROES`: fail with `ENOTSUP`
/// at once (range untouched) unless zeroing is faster than writing zeros.
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// Structured reply flags and types.
/// Structured reply flag `NBD_REPLY_FLAG_DONE`: this is the last chunk of the reply.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
/// Chunk type `NBD_REPLY_TYPE_NONE`: empty final chunk (always with
/// `NBD_REPLY_FLAG_DONE`); success if no error chunk came before.
pub const REPLY_TYPE_NONE: u16 = 0;
/// Chunk type `NBD_REPLY_TYPE_OFFSET_DATA`: read data; payload is a u64 offset, then the
/// bytes.
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Chunk type `NBD_REPLY_TYPE_ERROR`: the request failed; payload is a u32 error, a u16
/// message length and the message.
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
/// Chunk type `NBD_REPLY_TYPE_BLOCK_STATUS`: a u32 metadata context id, then descriptors of
/// a u32 length and u32 state flags each, covering the range from its start.
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;

// Metadata contexts.
/// The one metadata context this server offers.
pub const BASE_ALLOCATION: &[u8] = b"base:allocation";
/// Its id in `NBD_REP_META_CONTEXT` replies to `NBD_OPT_SET_META_CONTEXT` (any value but
/// 0, which LIST replies use).
pub const META_ID_BASE_ALLOCATION: u32 = 1;
/// `base:allocation` state `NBD_STATE_HOLE`: the range is not allocated on the storage.
pub const STATE_HOLE: u32 = 1 << 0;
/// `base:allocation` state `NBD_STATE_ZERO`: the range reads as zeros.
pub const STATE_ZERO: u32 = 1 << 1;

// Errors.
/// NBD error `EPERM`: operation not permitted (e.g. a write to a read-only export).
pub const EPERM: u32 = 1;
/// NBD error `EIO`: input/output error.
pub const EIO: u32 = 5;
/// NBD error `ENOMEM`: cannot allocate memory.
pub const ENOMEM: u32 = 12;
/// NBD error `EINVAL`: invalid argument (unknown command or flag, a read past the end of
/// the export, a misaligned range).
pub const EINVAL: u32 = 22;
/// NBD error `ENOSPC`: no space left (also a write beyond the end of the export, and the
/// mapping of `EDQUOT` / `EFBIG`).
pub const ENOSPC: u32 = 28;
/// NBD error `EOVERFLOW`: value too large (a read longer than the server sends in one
/// reply; structured replies only).
pub const EOVERFLOW: u32 = 75;
/// NBD error `ENOTSUP`: only for `NBD_CMD_FLAG_FAST_ZERO` (zeroing would not be fast).
pub const ENOTSUP: u32 = 95;
/// NBD error `ESHUTDOWN`: the server is shutting down; the client must disconnect.
pub const ESHUTDOWN: u32 = 108;

/// Largest request payload (and read length) the server accepts: 32 MiB.
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Longest export name or description accepted (the protocol's string limit).
pub const MAX_STRING_LEN: usize = 4096;
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
    /// Must be [`REQUEST_MAGIC`]; [`Request::parse`] does not check it.
    pub magic: u32,
    /// Command flags (`CMD_FLAG_*`).
    pub flags: u16,
    /// Command type (`CMD_*`).
    pub typ: u16,
    /// Opaque value the reply echoes (the spec's "cookie", formerly "handle").
    pub cookie: u64,
    /// Start of the range in the export, in bytes.
    pub offset: u64,
    /// Length of the range in bytes (also the payload length of `NBD_CMD_WRITE`).
    pub len: u32,
}

impl Request {
    /// Decodes the 28 big-endian header bytes; checks nothing.
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

    /// The 28 big-endian bytes of the header, as a client sends them.
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
    /// Must be [`IHAVEOPT`]; see [`OptionHeader::check`].
    pub magic: u64,
    /// The option (`OPT_*`).
    pub option: u32,
    /// Length in bytes of the option data that follows.
    pub len: u32,
}

impl OptionHeader {
    /// Decodes the 16 big-endian header bytes; [`OptionHeader::check`] validates them.
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
    /// Requested export name, as sent (not checked for UTF-8; empty = the default export).
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

/// The payload of NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT: export name and
/// context queries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaContextRequest<'a> {
    /// Requested export name, as sent (empty = the default export).
    pub name: &'a [u8],
    /// The queries, each a u32 length and that many bytes (checked by `parse`).
    queries: &'a [u8],
    count: u32,
}

impl<'a> MetaContextRequest<'a> {
    /// Parses the option data; the error is the message for NBD_REP_ERR_INVALID.
    pub fn parse(data: &'a [u8]) -> Result<MetaContextRequest<'a>, &'static [u8]> {
        let u32_at = |at: usize| -> Option<u32> {
            Some(u32::from_be_bytes(data.get(at..at + 4)?.try_into().ok()?))
        };
        let Some(name_len) = u32_at(0) else {
            return Err(b"option data too short");
        };
        let name_end = 4usize.saturating_add(name_len as usize);
        let Some(count) = name_end.checked_add(4).and_then(|_| u32_at(name_end)) else {
            return Err(b"export name length exceeds option length");
        };
        let queries = &data[name_end + 4..];
        // Walk the queries once (the count bounds nothing: the data does).
        let (mut rest, mut seen) = (queries, 0u32);
        while !rest.is_empty() {
            let Some(len) = rest
                .get(..4)
                .map(|b| u32::from_be_bytes(b.try_into().unwrap()))
            else {
                return Err(b"truncated query length");
            };
            let Some(next) = rest.get(4 + len as usize..) else {
                return Err(b"query length exceeds option length");
            };
            rest = next;
            seen += 1;
        }
        if seen != count {
            return Err(b"query count does not match option length");
        }
        Ok(MetaContextRequest {
            name: &data[4..name_end],
            queries,
            count,
        })
    }

    /// Number of queries (0: the client asks for every context, LIST only).
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The queries, in order.
    pub fn queries(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let mut rest = self.queries;
        std::iter::from_fn(move || {
            let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
            let (q, next) = rest[4..].split_at(len);
            rest = next;
            Some(q)
        })
    }
}

/// Writes a `NBD_REPLY_TYPE_BLOCK_STATUS` chunk (the final one) for context `id` into `out`
/// (replacing what it held): `(length, flags)` descriptors, big-endian.
pub fn block_status_chunk(out: &mut Vec<u8>, cookie: u64, id: u32, descs: &[(u32, u32)]) {
    out.clear();
    out.resize(STRUCTURED_HDR_LEN, 0);
    let len = 4 + 8 * descs.len() as u32;
    structured_header(
        &mut out[..],
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        cookie,
        len,
    );
    out.extend_from_slice(&id.to_be_bytes());
    for (l, f) in descs {
        out.extend_from_slice(&l.to_be_bytes());
        out.extend_from_slice(&f.to_be_bytes());
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

    fn meta_payload(name: &[u8], queries: &[&[u8]]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name);
        d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q);
        }
        d
    }

    #[test]
    fn meta_context_parsing() {
        let d = meta_payload(b"hd", &[b"base:allocation", b"", b"qemu:x"]);
        let r = MetaContextRequest::parse(&d).unwrap();
        assert_eq!((r.name, r.count()), (&b"hd"[..], 3));
        assert_eq!(
            r.queries().collect::<Vec<_>>(),
            [&b"base:allocation"[..], b"", b"qemu:x"]
        );
        let none = meta_payload(b"", &[]);
        let r = MetaContextRequest::parse(&none).unwrap();
        assert_eq!((r.name, r.count(), r.queries().count()), (&b""[..], 0, 0));
        // Malformed: too short, name past the end, truncated query, trailing byte, a count
        // that does not match (also a huge one: nothing is driven by it).
        assert!(MetaContextRequest::parse(&d[..7]).is_err());
        assert!(MetaContextRequest::parse(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]).is_err());
        assert!(MetaContextRequest::parse(&d[..d.len() - 1]).is_err());
        let mut long = d.clone();
        long.push(0);
        assert!(MetaContextRequest::parse(&long).is_err());
        let mut count = d.clone();
        count[9] = 0xff; // the count's low byte (after the 4 + 2 name bytes)
        assert!(MetaContextRequest::parse(&count).is_err());
        let mut huge = none.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(MetaContextRequest::parse(&huge).is_err());
    }

    #[test]
    fn block_status_encoding() {
        let mut out = Vec::new();
        block_status_chunk(&mut out, 9, 1, &[(4096, STATE_HOLE | STATE_ZERO), (512, 0)]);
        assert_eq!(out.len(), STRUCTURED_HDR_LEN + 4 + 16);
        assert_eq!(&out[4..8], &[0, 1, 0, 5]); // DONE, type 5
        assert_eq!(&out[16..20], &20u32.to_be_bytes());
        assert_eq!(&out[20..24], &1u32.to_be_bytes());
        assert_eq!(&out[24..32], &[0, 0, 0x10, 0, 0, 0, 0, 3]);
        assert_eq!(&out[32..40], &[0, 0, 2, 0, 0, 0, 0, 0]);
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
