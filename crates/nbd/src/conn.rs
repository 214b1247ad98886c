//! One client connection: fixed newstyle handshake, then leader/follower transmission.

use std::io;
use std::net::Shutdown;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::shared::{Export, Shared};
use cryptblk_device::MAX_EXTENTS;
use cryptblk_nbd_wire::proto::*;
use cryptblk_nbd_wire::{AnyStream, lock};

/// `read_some`, polling for up to `poll` first (see `NbdServerBuilder::busy_poll`).
/// Between two tries the poller yields its CPU: whatever else is runnable there (the
/// client, this connection's other requests) runs first, so polling only takes time
/// nobody else wanted. A pure spin took that time from them: at queue depth 16 it cost
/// ~10 % of the throughput, and at queue depth 1 it was slower than yielding whenever
/// client and poller shared a core (docs/benchmarks.md). Only a few threads of the
/// process poll at once: half the CPUs it may run on, and none when that is one (see
/// `Poller::acquire`).
fn read_some_polling(stream: &AnyStream, buf: &mut [u8], poll: Duration) -> io::Result<usize> {
    // Under TLS a readable socket may hold only part of a record: no polling.
    if !poll.is_zero()
        && !stream.tls_active()
        && let Some(_slot) = Poller::acquire()
    {
        let start = Instant::now();
        loop {
            if let Some(n) = stream.try_read(buf)? {
                return Ok(n);
            }
            if start.elapsed() >= poll {
                break;
            }
            std::thread::yield_now();
        }
    }
    stream.read_some(buf)
}

/// Threads of this process busy-polling a socket right now.
static POLLERS: AtomicUsize = AtomicUsize::new(0);

/// A polling slot; released on drop.
struct Poller;

impl Poller {
    /// A slot while fewer than half the process's CPUs poll. On a single CPU there is
    /// none: the client and the other requests run on that CPU too, and a poller's
    /// yields did not reliably hand it to them (4k QD16 over a remote export on one CPU
    /// shared with fio: 59-155 MB/s polling, 113-186 not; QD1 the same over nbdkit and
    /// 7 % slower over qemu-nbd without). With no CPU count known, none either.
    fn acquire() -> Option<Poller> {
        static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let max = *MAX.get_or_init(|| {
            std::thread::available_parallelism().map_or(0, |n| max_pollers(n.get()))
        });
        if POLLERS.fetch_add(1, Relaxed) < max {
            Some(Poller)
        } else {
            POLLERS.fetch_sub(1, Relaxed);
            None
        }
    }
}

/// How many threads may poll at once on `cpus` CPUs.
fn max_pollers(cpus: usize) -> usize {
    cpus / 2
}

impl Drop for Poller {
    fn drop(&mut self) {
        POLLERS.fetch_sub(1, Relaxed);
    }
}

/// Receive buffer shared by the threads of a connection (whoever holds the read lock owns it).
/// One `read` usually brings in a request header together with its write payload, and at
/// higher queue depths several requests; large payloads are read straight into the
/// destination buffer instead of being copied through this one.
pub(crate) struct ReadBuf {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// While set (the handshake, large write payloads), every read must complete before
    /// this instant, so a client dribbling one byte at a time cannot hold the connection
    /// (or its buffer) past it.
    deadline: Option<Instant>,
    /// Busy-poll time before a blocking read of the next request (transmission only).
    poll: Duration,
}

const READ_BUF_LEN: usize = 128 << 10;
/// Payload remainders at least this large bypass the receive buffer.
const DIRECT_READ_MIN: usize = 32 << 10;

impl ReadBuf {
    pub(crate) fn new() -> ReadBuf {
        ReadBuf {
            buf: vec![0; READ_BUF_LEN].into_boxed_slice(),
            start: 0,
            end: 0,
            deadline: None,
            poll: Duration::ZERO,
        }
    }

    fn read_exact(&mut self, s: &AnyStream, dst: &mut [u8]) -> io::Result<()> {
        let n = (self.end - self.start).min(dst.len());
        dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        let mut filled = n;
        while filled < dst.len() {
            if let Some(deadline) = self.deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "client too slow"));
                }
                s.set_read_timeout(Some(left));
            }
            // The buffer is empty here.
            let need = dst.len() - filled;
            if need >= DIRECT_READ_MIN {
                match s.read_some(&mut dst[filled..])? {
                    0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                    r => filled += r,
                }
            } else {
                let r = read_some_polling(s, &mut self.buf, self.poll)?;
                if r == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                let n = r.min(need);
                dst[filled..filled + n].copy_from_slice(&self.buf[..n]);
                self.start = n;
                self.end = r;
                filled += n;
            }
        }
        Ok(())
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    fn read_u32(&mut self, s: &AnyStream) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.read_exact(s, &mut b)?;
        Ok(u32::from_be_bytes(b))
    }
}

/// How the handshake ended.
enum Negotiated {
    Transmission {
        export: usize,
        structured: bool,
        /// `base:allocation` was selected for this export (NBD_OPT_SET_META_CONTEXT).
        base_allocation: bool,
    },
    Close,
}

/// Serves one connection until the client disconnects (or is disconnected).
/// With `reject` set the client gets a polite refusal (too many connections) instead.
pub(crate) fn serve(shared: &Shared, stream: &AnyStream, reject: bool) {
    let mut rb = ReadBuf::new();
    rb.deadline = Some(Instant::now() + shared.handshake_timeout);
    let negotiated = handshake(shared, stream, &mut rb, reject);
    match negotiated {
        Ok(Negotiated::Transmission {
            export,
            structured,
            base_allocation,
        }) => {
            rb.deadline = None;
            stream.set_read_timeout(None);
            // Replies: a client that stops reading them is dropped (see `stall_timeout`).
            stream.set_write_timeout(Some(shared.stall_timeout));
            let negotiated = Features {
                structured,
                base_allocation,
            };
            transmission(shared, &shared.exports[export], stream, rb, negotiated);
        }
        Ok(Negotiated::Close) => {}
        Err(_) => {
            shared.counters.protocol_errors.fetch_add(1, Relaxed);
        }
    }
    if let Some(tls) = stream.tls() {
        tls.close();
    }
    stream.shutdown(Shutdown::Both);
}

/// Options a client may send before it must have picked an export.
const MAX_OPTIONS: usize = 256;
/// Options answered on a connection being refused before it is closed.
const MAX_REJECTED_OPTIONS: usize = 8;

fn find_export<'a>(shared: &'a Shared, name: &[u8]) -> Option<(usize, &'a Export)> {
    if name.is_empty() {
        return shared.exports.first().map(|e| (0, e));
    }
    shared
        .exports
        .iter()
        .enumerate()
        .find(|(_, e)| e.name.as_bytes() == name)
}

/// Transmission flags for `export`.
pub(crate) fn transmission_flags(export: &Export, structured: bool) -> u16 {
    // CAN_MULTI_CONN: every connection calls the same shared `BlockDevice`, whose `flush`
    // makes *all* completed writes durable (not only this connection's), and the server keeps
    // no per-connection cache; so a FLUSH or FUA reply on one connection covers writes
    // completed on every other connection, which is exactly what the flag promises.
    // CACHE is a hint the device may ignore; FAST_ZERO is answered by the device (ENOTSUP
    // where zeroing is not faster than writing).
    let mut f = FLAG_HAS_FLAGS
        | FLAG_SEND_FLUSH
        | FLAG_SEND_FUA
        | FLAG_SEND_WRITE_ZEROES
        | FLAG_CAN_MULTI_CONN
        | FLAG_SEND_CACHE
        | FLAG_SEND_FAST_ZERO;
    if export.read_only {
        f |= FLAG_READ_ONLY;
    }
    if export.can_discard {
        f |= FLAG_SEND_TRIM;
    }
    if structured {
        // Reads are always answered with a single data chunk, so "don't fragment" is free.
        f |= FLAG_SEND_DF;
    }
    f
}

/// What handling one option left to do.
enum Step {
    /// Send the reply built in `Handshake::out`, then read the next option.
    Reply,
    /// The reply is sent; read the next option.
    Sent,
    /// The negotiation is over.
    Done(Negotiated),
}

/// The fixed-newstyle negotiation of one connection: the client's options, one method each.
struct Handshake<'a> {
    shared: &'a Shared,
    s: &'a AnyStream,
    /// The reply being built.
    out: Vec<u8>,
    structured: bool,
    no_zeroes: bool,
    /// The export the last NBD_OPT_SET_META_CONTEXT selected `base:allocation` on.
    meta_export: Option<usize>,
}

fn handshake(
    shared: &Shared,
    s: &AnyStream,
    rb: &mut ReadBuf,
    reject: bool,
) -> io::Result<Negotiated> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(&NBDMAGIC.to_be_bytes());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&out)?;

    let client_flags = rb.read_u32(s)?;
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "unknown client flags",
        ));
    }
    let mut hs = Handshake {
        shared,
        s,
        out,
        structured: false,
        no_zeroes: client_flags & FLAG_C_NO_ZEROES != 0,
        meta_export: None,
    };
    let mut data = Vec::new();
    let max_options = if reject {
        MAX_REJECTED_OPTIONS
    } else {
        MAX_OPTIONS
    };
    for _ in 0..max_options {
        let mut hdr = [0u8; OPTION_HDR_LEN];
        rb.read_exact(s, &mut hdr)?;
        let h = OptionHeader::parse(&hdr);
        h.check()
            .map_err(|m| io::Error::new(io::ErrorKind::InvalidData, m))?;
        let opt = h.option;
        data.resize(h.len as usize, 0);
        rb.read_exact(s, &mut data)?;
        hs.out.clear();
        let step = if reject || shared.shutting_down.load(Relaxed) {
            hs.refuse(opt, reject)
        } else if shared.tls_required && !s.tls_active() && opt != OPT_STARTTLS && opt != OPT_ABORT
        {
            hs.tls_required(opt)
        } else {
            match opt {
                OPT_STARTTLS => hs.start_tls(&data, rb)?,
                OPT_EXPORT_NAME => hs.export_name(&data)?,
                OPT_ABORT => hs.abort(),
                OPT_LIST => hs.list(&data),
                OPT_STRUCTURED_REPLY => hs.structured_reply(&data),
                OPT_INFO | OPT_GO => hs.info_or_go(opt, &data)?,
                OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => hs.meta_context(opt, &data),
                _ => hs.unsupported(opt),
            }
        };
        match step {
            Step::Reply => s.write_all(&hs.out)?,
            Step::Sent => {}
            Step::Done(n) => return Ok(n),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "too many options",
    ))
}

impl Handshake<'_> {
    /// Over the connection limit (`reject`) or shutting down: every option is answered
    /// with an error, and the client can only leave.
    fn refuse(&mut self, opt: u32, reject: bool) -> Step {
        match opt {
            OPT_ABORT => self.abort(),
            // No way to send an error: the only option is to hang up.
            OPT_EXPORT_NAME => Step::Done(Negotiated::Close),
            _ if reject => {
                option_reply(
                    &mut self.out,
                    opt,
                    REP_ERR_POLICY,
                    b"too many connections, try again later",
                );
                Step::Reply
            }
            _ => {
                option_reply(
                    &mut self.out,
                    opt,
                    REP_ERR_SHUTDOWN,
                    b"server is shutting down",
                );
                Step::Reply
            }
        }
    }

    /// Any option but STARTTLS and ABORT on a server that requires TLS, before TLS.
    fn tls_required(&mut self, opt: u32) -> Step {
        if opt == OPT_EXPORT_NAME {
            // No way to send an error: the only option is to hang up.
            return Step::Done(Negotiated::Close);
        }
        option_reply(
            &mut self.out,
            opt,
            REP_ERR_TLS_REQD,
            b"this server requires TLS: send NBD_OPT_STARTTLS first",
        );
        Step::Reply
    }

    /// NBD_OPT_STARTTLS: acknowledged, then the TLS handshake, within the handshake's
    /// deadline; everything after it is encrypted. What was negotiated before is forgotten,
    /// as the protocol asks (a man in the middle could have chosen it).
    fn start_tls(&mut self, data: &[u8], rb: &ReadBuf) -> io::Result<Step> {
        let Some(tls) = self.s.tls() else {
            return Ok(self.unsupported(OPT_STARTTLS));
        };
        if tls.is_active() || !data.is_empty() {
            let why: &[u8] = if data.is_empty() {
                b"TLS is already on"
            } else {
                b"NBD_OPT_STARTTLS takes no data"
            };
            option_reply(&mut self.out, OPT_STARTTLS, REP_ERR_INVALID, why);
            return Ok(Step::Reply);
        }
        option_reply(&mut self.out, OPT_STARTTLS, REP_ACK, &[]);
        self.s.write_all(&self.out)?;
        if !rb.is_empty() {
            // The client may only start its TLS handshake after the reply.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "data after NBD_OPT_STARTTLS before its reply",
            ));
        }
        tls.start(rb.deadline)?;
        self.structured = false;
        self.meta_export = None;
        Ok(Step::Sent)
    }

    /// NBD_OPT_EXPORT_NAME: the old way in; an unknown name can only be hung up on.
    fn export_name(&mut self, name: &[u8]) -> io::Result<Step> {
        let Some((idx, export)) = find_export(self.shared, name) else {
            return Ok(Step::Done(Negotiated::Close));
        };
        self.out.extend_from_slice(&export.size().to_be_bytes());
        self.out
            .extend_from_slice(&transmission_flags(export, self.structured).to_be_bytes());
        if !self.no_zeroes {
            self.out.extend_from_slice(&[0u8; 124]);
        }
        self.s.write_all(&self.out)?;
        Ok(Step::Done(Negotiated::Transmission {
            export: idx,
            structured: self.structured,
            base_allocation: self.meta_export == Some(idx),
        }))
    }

    /// NBD_OPT_ABORT: acknowledged (if the client still listens), then closed.
    fn abort(&mut self) -> Step {
        option_reply(&mut self.out, OPT_ABORT, REP_ACK, &[]);
        let _ = self.s.write_all(&self.out);
        Step::Done(Negotiated::Close)
    }

    /// NBD_OPT_LIST: every export's name and description.
    fn list(&mut self, data: &[u8]) -> Step {
        if !data.is_empty() {
            option_reply(
                &mut self.out,
                OPT_LIST,
                REP_ERR_INVALID,
                b"NBD_OPT_LIST takes no data",
            );
            return Step::Reply;
        }
        let mut item = Vec::new();
        for e in &self.shared.exports {
            item.clear();
            item.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
            item.extend_from_slice(e.name.as_bytes());
            if let Some(d) = &e.description {
                item.extend_from_slice(d.as_bytes());
            }
            option_reply(&mut self.out, OPT_LIST, REP_SERVER, &item);
        }
        option_reply(&mut self.out, OPT_LIST, REP_ACK, &[]);
        Step::Reply
    }

    /// NBD_OPT_STRUCTURED_REPLY: accepted (reads then use structured replies).
    fn structured_reply(&mut self, data: &[u8]) -> Step {
        if data.is_empty() {
            self.structured = true;
            option_reply(&mut self.out, OPT_STRUCTURED_REPLY, REP_ACK, &[]);
        } else {
            option_reply(
                &mut self.out,
                OPT_STRUCTURED_REPLY,
                REP_ERR_INVALID,
                b"NBD_OPT_STRUCTURED_REPLY takes no data",
            );
        }
        Step::Reply
    }

    /// NBD_OPT_INFO and NBD_OPT_GO: the export's details; GO then starts transmission.
    fn info_or_go(&mut self, opt: u32, data: &[u8]) -> io::Result<Step> {
        let Some(idx) = info_reply(self.shared, opt, data, self.structured, &mut self.out) else {
            return Ok(Step::Reply); // `out` holds the error reply
        };
        self.s.write_all(&self.out)?;
        Ok(if opt == OPT_GO {
            Step::Done(Negotiated::Transmission {
                export: idx,
                structured: self.structured,
                base_allocation: self.meta_export == Some(idx),
            })
        } else {
            Step::Sent
        })
    }

    /// NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT: the one context offered is
    /// `base:allocation`. Queries for other namespaces, other `base:` contexts and malformed
    /// names are ignored (the spec says so); a LIST with no query, or the query `base:`,
    /// lists it. A SET replaces the selection, even when it fails.
    fn meta_context(&mut self, opt: u32, data: &[u8]) -> Step {
        let set = opt == OPT_SET_META_CONTEXT;
        if set {
            self.meta_export = None;
        }
        if !self.structured {
            option_reply(
                &mut self.out,
                opt,
                REP_ERR_INVALID,
                b"metadata contexts need structured replies",
            );
            return Step::Reply;
        }
        let req = match MetaContextRequest::parse(data) {
            Ok(r) => r,
            Err(msg) => {
                option_reply(&mut self.out, opt, REP_ERR_INVALID, msg);
                return Step::Reply;
            }
        };
        let Some((idx, _)) = find_export(self.shared, req.name) else {
            option_reply(&mut self.out, opt, REP_ERR_UNKNOWN, b"no such export");
            return Step::Reply;
        };
        let matched = if set {
            req.queries().any(|q| q == BASE_ALLOCATION)
        } else {
            req.count() == 0 || req.queries().any(|q| q == BASE_ALLOCATION || q == b"base:")
        };
        if matched {
            // One reply, however often it was asked for.
            let id = if set { META_ID_BASE_ALLOCATION } else { 0 };
            let mut item = id.to_be_bytes().to_vec();
            item.extend_from_slice(BASE_ALLOCATION);
            option_reply(&mut self.out, opt, REP_META_CONTEXT, &item);
            if set {
                self.meta_export = Some(idx);
            }
        }
        option_reply(&mut self.out, opt, REP_ACK, &[]);
        Step::Reply
    }

    /// Any other option (STARTTLS included: no TLS here yet).
    fn unsupported(&mut self, opt: u32) -> Step {
        let msg = if opt == OPT_STARTTLS {
            &b"TLS is not supported"[..]
        } else {
            &b"unsupported option"[..]
        };
        option_reply(&mut self.out, opt, REP_ERR_UNSUP, msg);
        Step::Reply
    }
}

/// Builds the reply to NBD_OPT_INFO/NBD_OPT_GO into `out`; returns the export on success.
fn info_reply(
    shared: &Shared,
    opt: u32,
    data: &[u8],
    structured: bool,
    out: &mut Vec<u8>,
) -> Option<usize> {
    let req = match InfoRequest::parse(data) {
        Ok(r) => r,
        Err(msg) => {
            option_reply(out, opt, REP_ERR_INVALID, msg);
            return None;
        }
    };
    let wants = |t: u16| req.wants(t);
    let name = req.name;
    let Some((idx, export)) = find_export(shared, name) else {
        option_reply(out, opt, REP_ERR_UNKNOWN, b"no such export");
        return None;
    };

    let mut item = Vec::with_capacity(64);
    item.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    item.extend_from_slice(&export.size().to_be_bytes());
    item.extend_from_slice(&transmission_flags(export, structured).to_be_bytes());
    option_reply(out, opt, REP_INFO, &item);

    // Always sent: the export enforces its minimum block size whether or not it was asked.
    item.clear();
    item.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    item.extend_from_slice(&export.block_size.to_be_bytes());
    item.extend_from_slice(&export.block_size.max(4096).to_be_bytes());
    item.extend_from_slice(&MAX_PAYLOAD.to_be_bytes());
    option_reply(out, opt, REP_INFO, &item);

    if wants(INFO_NAME) {
        item.clear();
        item.extend_from_slice(&INFO_NAME.to_be_bytes());
        item.extend_from_slice(export.name.as_bytes());
        option_reply(out, opt, REP_INFO, &item);
    }
    if wants(INFO_DESCRIPTION)
        && let Some(d) = &export.description
    {
        item.clear();
        item.extend_from_slice(&INFO_DESCRIPTION.to_be_bytes());
        item.extend_from_slice(d.as_bytes());
        option_reply(out, opt, REP_INFO, &item);
    }
    option_reply(out, opt, REP_ACK, &[]);
    Some(idx)
}

/// Bytes kept free in front of a thread's data buffer for the reply header, so a read reply
/// (header + data) goes out in one `write` without copying the data.
pub(crate) const HEADROOM: usize = STRUCTURED_HDR_LEN + 8;
const _: () = assert!(HEADROOM >= SIMPLE_REPLY_LEN);
/// Requests up to this size (headroom included) use the thread's own buffer; larger ones
/// take one from the server's [`crate::BufferPool`].
const SMALL_BUF_MAX: usize = HEADROOM + (128 << 10);

struct Conn<'a> {
    shared: &'a Shared,
    export: &'a Export,
    stream: &'a AnyStream,
    rd: Mutex<ReadBuf>,
    wr: Mutex<()>,
    closing: AtomicBool,
    dirty: AtomicBool,
    structured: bool,
    base_allocation: bool,
}

/// What the handshake settled for transmission.
struct Features {
    structured: bool,
    base_allocation: bool,
}

fn transmission(
    shared: &Shared,
    export: &Export,
    stream: &AnyStream,
    rb: ReadBuf,
    negotiated: Features,
) {
    let mut rb = rb;
    rb.poll = shared.busy_poll;
    let conn = Conn {
        shared,
        export,
        stream,
        rd: Mutex::new(rb),
        wr: Mutex::new(()),
        closing: AtomicBool::new(false),
        dirty: AtomicBool::new(false),
        structured: negotiated.structured,
        base_allocation: negotiated.base_allocation,
    };
    // Leader/follower: every thread takes turns reading one request under the read lock and
    // then serves and answers it itself; the calling thread is one of them.
    std::thread::scope(|scope| {
        for _ in 1..shared.threads_per_connection {
            let spawned = std::thread::Builder::new()
                .name("nbd-worker".into())
                .spawn_scoped(scope, || conn.worker());
            if spawned.is_err() {
                break; // fewer threads: still correct, only less parallel
            }
        }
        conn.worker();
    });
    // All requests read have been answered. Make writes durable before hanging up
    // (NBD_CMD_DISC, or the client went away, or the server is shutting down).
    if conn.dirty.load(Relaxed) {
        let _ = export.device.flush();
    }
}

/// Outcome of executing one request.
type Outcome = Result<usize, (u32, &'static str)>;

impl Conn<'_> {
    /// Notes that the device has been written (flushed at disconnect). Loads first so that
    /// the threads of a busy connection do not keep writing the same cache line.
    fn mark_dirty(&self) {
        if !self.dirty.load(Relaxed) {
            self.dirty.store(true, Relaxed);
        }
    }

    fn hang_up(&self) {
        self.closing.store(true, Relaxed);
        self.stream.shutdown(Shutdown::Both);
    }

    /// The data buffer for a request needing `need` bytes: the thread's own small one, or
    /// one from the pool (waiting for it if the pool is exhausted), left in `big`.
    fn buffer<'b>(
        &self,
        small: &'b mut Vec<u8>,
        big: &'b mut Option<Vec<u8>>,
        need: usize,
    ) -> &'b mut Vec<u8> {
        if need <= SMALL_BUF_MAX {
            if small.len() < need {
                small.resize(need, 0);
            }
            small
        } else {
            big.insert(self.shared.buffers.take(need))
        }
    }

    fn worker(&self) {
        let mut small: Vec<u8> = Vec::new();
        loop {
            let mut big: Option<Vec<u8>> = None;
            let Some(req) = self.next_request(&mut small, &mut big) else {
                return;
            };
            if !self.answer(&req, &mut small, &mut big) {
                return;
            }
        }
    }

    /// Reads the next request header, and a write's payload (into `small`, or into `big`
    /// from the pool), under the socket's read lock. `None` when this worker must stop:
    /// client gone, protocol violation, disconnect request.
    fn next_request(&self, small: &mut Vec<u8>, big: &mut Option<Vec<u8>>) -> Option<Request> {
        let mut rd = lock(&self.rd);
        if self.closing.load(Relaxed) {
            return None;
        }
        let mut hdr = [0u8; REQUEST_LEN];
        if rd.read_exact(self.stream, &mut hdr).is_err() {
            // Client gone (or server shutting down): answer nothing more.
            self.closing.store(true, Relaxed);
            return None;
        }
        let req = Request::parse(&hdr);
        if req.magic != REQUEST_MAGIC {
            self.shared.counters.protocol_errors.fetch_add(1, Relaxed);
            drop(rd);
            self.hang_up();
            return None;
        }
        match req.typ {
            CMD_WRITE if req.len > MAX_PAYLOAD => {
                // The payload cannot be skipped safely: answer, then hang up.
                self.closing.store(true, Relaxed);
                drop(rd);
                self.shared.counters.protocol_errors.fetch_add(1, Relaxed);
                let _ = self.send_error(&req, EINVAL, "write payload exceeds the 32 MiB maximum");
                self.hang_up();
                None
            }
            CMD_WRITE => match self.read_payload(&mut rd, &req, small, big) {
                Ok(()) => Some(req),
                Err(e) => {
                    drop(rd);
                    if let Some(b) = big.take() {
                        self.shared.buffers.give(b);
                    }
                    if matches!(
                        e.kind(),
                        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
                    ) {
                        // Stalled: drop the client.
                        self.shared.counters.protocol_errors.fetch_add(1, Relaxed);
                        self.hang_up();
                    } else {
                        // Gone: answer nothing more.
                        self.closing.store(true, Relaxed);
                    }
                    None
                }
            },
            CMD_DISC => {
                // Others finish what they already read; nobody reads further.
                self.closing.store(true, Relaxed);
                None
            }
            _ => Some(req),
        }
    }

    /// Reads a write's payload into the thread's buffer or one from the pool.
    fn read_payload(
        &self,
        rd: &mut ReadBuf,
        req: &Request,
        small: &mut Vec<u8>,
        big: &mut Option<Vec<u8>>,
    ) -> io::Result<()> {
        let need = HEADROOM + req.len as usize;
        let buf = self.buffer(small, big, need);
        let pooled = need > SMALL_BUF_MAX;
        if pooled {
            // Pool memory is held until the payload is in: bound the wait.
            rd.deadline = Some(Instant::now() + self.shared.stall_timeout);
        }
        let r = rd.read_exact(self.stream, &mut buf[HEADROOM..need]);
        if pooled {
            rd.deadline = None;
            self.stream.set_read_timeout(None);
        }
        r
    }

    /// Executes `req` (its payload already in `small` or `big`) and sends the reply; gives
    /// a pooled buffer back. False when the connection must end (the reply could not go out).
    fn answer(&self, req: &Request, small: &mut Vec<u8>, big: &mut Option<Vec<u8>>) -> bool {
        if req.typ == CMD_READ && req.len <= MAX_PAYLOAD {
            self.buffer(small, big, HEADROOM + req.len as usize);
        }
        let buf = match big {
            Some(b) => b,
            None => small,
        };
        let sent = match self.execute(req, buf) {
            Ok(n) if req.typ == CMD_READ => self.send_read(req, buf, n),
            // `execute` built the whole chunk in `buf`.
            Ok(n) if req.typ == CMD_BLOCK_STATUS => self.send(&buf[..n]),
            Ok(_) => {
                let mut r = [0u8; SIMPLE_REPLY_LEN];
                simple_reply(&mut r, 0, req.cookie);
                self.send(&r)
            }
            Err((errno, msg)) => {
                // A refused fast zero is an answer the client expects, not a failure.
                let counter = if errno == ENOTSUP {
                    &self.shared.counters.fast_zero_refused
                } else {
                    &self.shared.counters.errors
                };
                counter.fetch_add(1, Relaxed);
                self.send_error(req, errno, msg)
            }
        };
        if let Some(b) = big.take() {
            self.shared.buffers.give(b);
        }
        if sent.is_err() {
            self.hang_up();
            return false;
        }
        true
    }

    fn send(&self, bytes: &[u8]) -> io::Result<()> {
        let _w = lock(&self.wr);
        self.stream.write_all(bytes)
    }

    fn send_read(&self, req: &Request, buf: &mut [u8], n: usize) -> io::Result<()> {
        if self.structured {
            if n == 0 {
                let mut r = [0u8; STRUCTURED_HDR_LEN];
                structured_header(&mut r, REPLY_FLAG_DONE, REPLY_TYPE_NONE, req.cookie, 0);
                return self.send(&r);
            }
            let start = HEADROOM - STRUCTURED_HDR_LEN - 8;
            structured_header(
                &mut buf[start..start + STRUCTURED_HDR_LEN],
                REPLY_FLAG_DONE,
                REPLY_TYPE_OFFSET_DATA,
                req.cookie,
                8 + n as u32,
            );
            buf[HEADROOM - 8..HEADROOM].copy_from_slice(&req.offset.to_be_bytes());
            self.send(&buf[start..HEADROOM + n])
        } else {
            if n == 0 {
                // A zero-length read: this thread's buffer may not even hold the headroom.
                let mut r = [0u8; SIMPLE_REPLY_LEN];
                simple_reply(&mut r, 0, req.cookie);
                return self.send(&r);
            }
            let start = HEADROOM - SIMPLE_REPLY_LEN;
            simple_reply(&mut buf[start..HEADROOM], 0, req.cookie);
            self.send(&buf[start..HEADROOM + n])
        }
    }

    fn send_error(&self, req: &Request, errno: u32, msg: &str) -> io::Result<()> {
        if self.structured {
            let mut r = [0u8; STRUCTURED_HDR_LEN + 6 + 96];
            let msg = &msg.as_bytes()[..msg.len().min(96)];
            let len = 6 + msg.len();
            structured_header(
                &mut r,
                REPLY_FLAG_DONE,
                REPLY_TYPE_ERROR,
                req.cookie,
                len as u32,
            );
            r[20..24].copy_from_slice(&errno.to_be_bytes());
            r[24..26].copy_from_slice(&(msg.len() as u16).to_be_bytes());
            r[26..26 + msg.len()].copy_from_slice(msg);
            self.send(&r[..STRUCTURED_HDR_LEN + len])
        } else {
            let mut r = [0u8; SIMPLE_REPLY_LEN];
            simple_reply(&mut r, errno, req.cookie);
            self.send(&r)
        }
    }

    /// Validates and performs one request; returns the number of bytes read into
    /// `buf[HEADROOM..]` for reads.
    fn execute(&self, req: &Request, buf: &mut Vec<u8>) -> Outcome {
        let e = self.export;
        let c = &self.shared.counters;
        let fua = req.flags & CMD_FLAG_FUA != 0;
        let extra_flags = match req.typ {
            CMD_READ if self.structured => CMD_FLAG_DF,
            CMD_WRITE_ZEROES => CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
            CMD_READ | CMD_WRITE | CMD_FLUSH | CMD_TRIM | CMD_CACHE => 0,
            _ => return Err((EINVAL, "unknown command")),
        };
        if req.flags & !(CMD_FLAG_FUA | extra_flags) != 0 {
            return Err((EINVAL, "unsupported command flags"));
        }
        if req.typ == CMD_FLUSH {
            c.flushes.fetch_add(1, Relaxed);
            return e.device.flush().map(|_| 0).map_err(io_err);
        }
        if req.typ == CMD_BLOCK_STATUS && !self.base_allocation {
            return Err((EINVAL, "no metadata context was negotiated"));
        }
        let writes = matches!(req.typ, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
        if writes && e.read_only {
            return Err((EPERM, "export is read-only"));
        }
        if req.typ == CMD_TRIM && !e.can_discard {
            return Err((EINVAL, "trim is not supported by this export"));
        }
        if req.typ == CMD_READ && req.len > MAX_PAYLOAD {
            let errno = if self.structured { EOVERFLOW } else { EINVAL };
            return Err((errno, "read exceeds the 32 MiB maximum"));
        }
        let len = req.len as u64;
        if req.offset.checked_add(len).is_none_or(|end| end > e.size()) {
            return Err(match req.typ {
                CMD_WRITE | CMD_WRITE_ZEROES => {
                    (ENOSPC, "request extends past the end of the export")
                }
                _ => (EINVAL, "request extends past the end of the export"),
            });
        }
        let bs = e.block_size as u64;
        if !(req.offset | len).is_multiple_of(bs) && !e.device.byte_granular() {
            return Err((EINVAL, "request not aligned to the minimum block size"));
        }
        if len == 0 {
            if req.typ == CMD_BLOCK_STATUS {
                return Err((EINVAL, "block status of an empty range"));
            }
            return Ok(0);
        }
        let n = req.len as usize;
        match req.typ {
            CMD_BLOCK_STATUS => {
                let descs = self.block_status(req, bs);
                // Built apart and copied in: encoding into `buf` itself would shrink the
                // thread's data buffer, and the next read would zero it again up to 128 KiB.
                let mut chunk = Vec::new();
                block_status_chunk(&mut chunk, req.cookie, META_ID_BASE_ALLOCATION, &descs);
                if buf.len() < chunk.len() {
                    buf.resize(chunk.len(), 0);
                }
                buf[..chunk.len()].copy_from_slice(&chunk);
                c.block_status.fetch_add(1, Relaxed);
                Ok(chunk.len())
            }
            CMD_CACHE => {
                e.device.cache(req.offset, len).map_err(io_err)?;
                c.caches.fetch_add(1, Relaxed);
                Ok(0)
            }
            CMD_READ => {
                if buf.len() < HEADROOM + n {
                    buf.resize(HEADROOM + n, 0);
                }
                e.device
                    .read_at(&mut buf[HEADROOM..HEADROOM + n], req.offset)
                    .map_err(io_err)?;
                c.reads.fetch_add(1, Relaxed);
                c.read_bytes.fetch_add(len, Relaxed);
                Ok(n)
            }
            CMD_WRITE => {
                self.mark_dirty();
                // The payload buffer is this thread's own: let the device encrypt in place.
                e.device
                    .write_at_mut(&mut buf[HEADROOM..HEADROOM + n], req.offset, fua)
                    .map_err(io_err)?;
                c.writes.fetch_add(1, Relaxed);
                c.write_bytes.fetch_add(len, Relaxed);
                Ok(0)
            }
            CMD_TRIM => {
                self.mark_dirty();
                match e.device.discard(req.offset, len) {
                    // TRIM is only a hint.
                    Err(err) if err.kind() == io::ErrorKind::Unsupported => {}
                    r => r.map_err(io_err)?,
                }
                if fua {
                    e.device.flush().map_err(io_err)?;
                }
                c.trims.fetch_add(1, Relaxed);
                c.trim_bytes.fetch_add(len, Relaxed);
                Ok(0)
            }
            _ => {
                let may_unmap = req.flags & CMD_FLAG_NO_HOLE == 0;
                if req.flags & CMD_FLAG_FAST_ZERO != 0 {
                    match e.device.write_zeroes_fast(req.offset, len, may_unmap) {
                        Err(err) if err.kind() == io::ErrorKind::Unsupported => {
                            return Err((ENOTSUP, "zeroing is not faster than writing here"));
                        }
                        r => {
                            self.mark_dirty();
                            r.map_err(io_err)?
                        }
                    }
                } else {
                    self.mark_dirty();
                    e.device
                        .write_zeroes(req.offset, len, may_unmap)
                        .map_err(io_err)?;
                }
                if fua {
                    e.device.flush().map_err(io_err)?;
                }
                c.write_zeroes.fetch_add(1, Relaxed);
                c.write_zeroes_bytes.fetch_add(len, Relaxed);
                Ok(0)
            }
        }
    }
}

impl Conn<'_> {
    /// The `base:allocation` descriptors of a checked range: the device's runs, cleaned up
    /// (empty ones dropped, cut to the range, at most `MAX_EXTENTS`, one with REQ_ONE). A
    /// device that fails, or a range not on block boundaries (on a device that takes such
    /// requests), gets one descriptor: all data, which is always true.
    fn block_status(&self, req: &Request, bs: u64) -> Vec<(u32, u32)> {
        let len = req.len as u64;
        let whole = vec![(req.len, 0)];
        if !(req.offset | len).is_multiple_of(bs) {
            return whole;
        }
        let Ok(runs) = self.export.device.block_status(req.offset, len) else {
            return whole;
        };
        let one = req.flags & CMD_FLAG_REQ_ONE != 0;
        let (mut descs, mut covered) = (Vec::new(), 0u64);
        for r in runs.iter().filter(|r| r.len > 0).take(MAX_EXTENTS) {
            let l = r.len.min(len - covered);
            if l == 0 {
                break;
            }
            let flags = if r.hole { STATE_HOLE } else { 0 } | if r.zero { STATE_ZERO } else { 0 };
            descs.push((l as u32, flags));
            covered += l;
            if one {
                break;
            }
        }
        if descs.is_empty() { whole } else { descs }
    }
}

fn io_err(e: io::Error) -> (u32, &'static str) {
    let errno = errno_of(&e);
    let msg = match errno {
        EPERM => "operation not permitted by the backend",
        EINVAL => "invalid argument (backend)",
        ENOSPC => "no space left on the backend",
        ENOMEM => "out of memory (backend)",
        _ => "I/O error in the backend",
    };
    (errno, msg)
}

#[cfg(test)]
mod poll_tests {
    #[test]
    fn no_polling_on_one_cpu_and_half_of_more() {
        assert_eq!(super::max_pollers(1), 0);
        assert_eq!(super::max_pollers(2), 1);
        assert_eq!(super::max_pollers(3), 1);
        assert_eq!(super::max_pollers(16), 8);
    }
}
