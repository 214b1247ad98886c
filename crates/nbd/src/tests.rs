//! Protocol tests with a scripted client over Unix sockets.

use super::*;
use crate::proto::*;
use cryptblk_device::{Extent, MemoryDevice};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::Instant;

const MIB: u64 = 1 << 20;

/// A MemoryDevice that records what it was asked and can fail or stall on demand.
struct TestDevice {
    mem: MemoryDevice,
    read_only: bool,
    discard: bool,
    flushes: AtomicU64,
    last_fua: AtomicBool,
    last_may_unmap: AtomicBool,
    /// Errors for the next device calls: raw errno, or 0 for an `Other` error.
    fail: Mutex<Vec<i32>>,
    /// When set, a read at offset 0 waits until `release` is set (or 5 s pass).
    gate_reads_at_zero: bool,
    release: AtomicBool,
    gate: Condvar,
    gate_lock: Mutex<()>,
    /// Writes sleep this long (to keep requests in flight).
    write_delay: Duration,
    /// Claims byte-granular I/O (as an encrypted volume with read-modify-write does).
    byte_granular: bool,
    /// What `block_status` answers (`None`: the default, all data).
    extents: Mutex<Option<Vec<Extent>>>,
    /// `cache` calls seen.
    caches: AtomicU64,
}

impl TestDevice {
    fn open_gate(&self) {
        let _g = lock(&self.gate_lock);
        self.release.store(true, Relaxed);
        self.gate.notify_all();
    }

    fn new(size: u64, bs: u32) -> TestDevice {
        TestDevice {
            mem: MemoryDevice::new(size, bs),
            read_only: false,
            discard: true,
            flushes: AtomicU64::new(0),
            last_fua: AtomicBool::new(false),
            last_may_unmap: AtomicBool::new(false),
            fail: Mutex::new(Vec::new()),
            gate_reads_at_zero: false,
            release: AtomicBool::new(false),
            gate: Condvar::new(),
            gate_lock: Mutex::new(()),
            write_delay: Duration::ZERO,
            byte_granular: false,
            extents: Mutex::new(None),
            caches: AtomicU64::new(0),
        }
    }
    fn injected(&self) -> io::Result<()> {
        match lock(&self.fail).pop() {
            None => Ok(()),
            Some(0) => Err(io::Error::other("injected")),
            Some(code) => Err(io::Error::from_raw_os_error(code)),
        }
    }
}

impl BlockDevice for TestDevice {
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn block_size(&self) -> u32 {
        self.mem.block_size()
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn byte_granular(&self) -> bool {
        self.byte_granular
    }
    fn can_discard(&self) -> bool {
        self.discard
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.injected()?;
        if self.gate_reads_at_zero && offset == 0 {
            let g = lock(&self.gate_lock);
            let _ = self
                .gate
                .wait_timeout_while(g, Duration::from_secs(5), |_| !self.release.load(Relaxed))
                .unwrap();
        }
        self.mem.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.injected()?;
        thread::sleep(self.write_delay);
        self.last_fua.store(fua, Relaxed);
        self.mem.write_at(buf, offset, fua)
    }
    fn flush(&self) -> io::Result<()> {
        self.injected()?;
        self.flushes.fetch_add(1, Relaxed);
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.injected()?;
        self.mem.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> io::Result<()> {
        self.injected()?;
        self.last_may_unmap.store(may_unmap, Relaxed);
        self.mem.write_zeroes(offset, len, may_unmap)
    }
    fn write_zeroes_fast(&self, offset: u64, len: u64, may_unmap: bool) -> io::Result<()> {
        self.injected()?;
        if !(may_unmap && self.discard) {
            return Err(io::ErrorKind::Unsupported.into());
        }
        self.mem.write_zeroes(offset, len, true)
    }
    fn block_status(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        self.injected()?;
        match &*lock(&self.extents) {
            Some(e) => Ok(e.clone()),
            None => self.mem.block_status(offset, len),
        }
    }
    fn cache(&self, _offset: u64, _len: u64) -> io::Result<()> {
        self.injected()?;
        self.caches.fetch_add(1, Relaxed);
        Ok(())
    }
}

fn server_with(
    dev: Arc<dyn BlockDevice>,
    f: impl FnOnce(NbdServerBuilder) -> NbdServerBuilder,
) -> Arc<NbdServer> {
    Arc::new(
        f(NbdServer::builder()
            .export("disk", dev)
            .description("test disk"))
        .build()
        .unwrap(),
    )
}

struct Client {
    s: UnixStream,
    server_thread: Option<thread::JoinHandle<()>>,
}

impl Client {
    /// Connects over a socketpair to a connection served by `serve_unix_stream`.
    fn pair(server: &Arc<NbdServer>) -> Client {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let srv = server.clone();
        let t = thread::spawn(move || srv.serve_unix_stream(b));
        let mut c = Client {
            s: a,
            server_thread: Some(t),
        };
        c.greeting();
        c
    }

    fn connect(path: &Path) -> Client {
        let s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut c = Client {
            s,
            server_thread: None,
        };
        c.greeting();
        c
    }

    fn greeting(&mut self) {
        let b = self.read_n(18);
        assert_eq!(&b[0..8], b"NBDMAGIC");
        assert_eq!(&b[8..16], b"IHAVEOPT");
        assert_eq!(
            u16::from_be_bytes([b[16], b[17]]),
            FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES
        );
    }

    fn read_n(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0; n];
        self.s.read_exact(&mut b).unwrap();
        b
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.read_n(2).try_into().unwrap())
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.read_n(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.read_n(8).try_into().unwrap())
    }

    fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).unwrap();
    }

    fn flags(&mut self, f: u32) {
        self.send(&f.to_be_bytes());
    }

    fn opt(&mut self, opt: u32, data: &[u8]) {
        let mut b = Vec::new();
        b.extend_from_slice(&IHAVEOPT.to_be_bytes());
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.send(&b);
    }

    fn opt_reply(&mut self, expect_opt: u32) -> (u32, Vec<u8>) {
        assert_eq!(self.u64(), OPT_REPLY_MAGIC);
        assert_eq!(self.u32(), expect_opt);
        let typ = self.u32();
        let len = self.u32() as usize;
        (typ, self.read_n(len))
    }

    /// Sends GO/INFO and collects replies up to the final one.
    fn info(&mut self, opt: u32, name: &str, reqs: &[u16]) -> (Vec<Vec<u8>>, u32) {
        let mut d = Vec::new();
        d.extend_from_slice(&(name.len() as u32).to_be_bytes());
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(reqs.len() as u16).to_be_bytes());
        for r in reqs {
            d.extend_from_slice(&r.to_be_bytes());
        }
        self.opt(opt, &d);
        let mut infos = Vec::new();
        loop {
            let (typ, data) = self.opt_reply(opt);
            if typ == REP_INFO {
                infos.push(data);
            } else {
                return (infos, typ);
            }
        }
    }

    fn go(&mut self, structured: bool) {
        self.flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
        if structured {
            self.opt(OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(self.opt_reply(OPT_STRUCTURED_REPLY).0, REP_ACK);
        }
        let (_, fin) = self.info(OPT_GO, "disk", &[INFO_BLOCK_SIZE]);
        assert_eq!(fin, REP_ACK);
    }

    fn request(
        &mut self,
        flags: u16,
        typ: u16,
        cookie: u64,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) {
        let r = Request {
            magic: REQUEST_MAGIC,
            flags,
            typ,
            cookie,
            offset,
            len,
        };
        let mut b = r.encode().to_vec();
        b.extend_from_slice(payload);
        self.send(&b);
    }

    /// Reads a simple reply: (error, cookie).
    fn simple(&mut self) -> (u32, u64) {
        assert_eq!(self.u32(), SIMPLE_REPLY_MAGIC);
        (self.u32(), self.u64())
    }

    /// Reads one structured chunk: (flags, type, cookie, payload).
    fn chunk(&mut self) -> (u16, u16, u64, Vec<u8>) {
        assert_eq!(self.u32(), STRUCTURED_REPLY_MAGIC);
        let flags = self.u16();
        let typ = self.u16();
        let cookie = self.u64();
        let len = self.u32() as usize;
        (flags, typ, cookie, self.read_n(len))
    }

    /// Reads any reply; returns (cookie, error, read data).
    fn any_reply(&mut self) -> (u64, u32, Vec<u8>) {
        match self.u32() {
            SIMPLE_REPLY_MAGIC => {
                let err = self.u32();
                (self.u64(), err, Vec::new())
            }
            STRUCTURED_REPLY_MAGIC => {
                let flags = self.u16();
                let typ = self.u16();
                let cookie = self.u64();
                let len = self.u32() as usize;
                let p = self.read_n(len);
                assert_ne!(flags & REPLY_FLAG_DONE, 0);
                match typ {
                    REPLY_TYPE_OFFSET_DATA => (cookie, 0, p[8..].to_vec()),
                    REPLY_TYPE_NONE => (cookie, 0, Vec::new()),
                    REPLY_TYPE_ERROR => (
                        cookie,
                        u32::from_be_bytes(p[0..4].try_into().unwrap()),
                        Vec::new(),
                    ),
                    t => panic!("unexpected chunk type {t}"),
                }
            }
            m => panic!("bad reply magic {m:#x}"),
        }
    }

    /// Sends LIST/SET_META_CONTEXT; returns the contexts replied (id, name) and the final reply.
    fn meta(&mut self, opt: u32, name: &str, queries: &[&[u8]]) -> (Vec<(u32, Vec<u8>)>, u32) {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q);
        }
        self.opt(opt, &d);
        let mut got = Vec::new();
        loop {
            let (typ, data) = self.opt_reply(opt);
            if typ != REP_META_CONTEXT {
                return (got, typ);
            }
            let id = u32::from_be_bytes(data[..4].try_into().unwrap());
            got.push((id, data[4..].to_vec()));
        }
    }

    /// Structured replies, `base:allocation` selected, then GO on "disk".
    fn go_with_block_status(&mut self) {
        self.flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
        self.opt(OPT_STRUCTURED_REPLY, &[]);
        assert_eq!(self.opt_reply(OPT_STRUCTURED_REPLY).0, REP_ACK);
        let (got, fin) = self.meta(OPT_SET_META_CONTEXT, "disk", &[BASE_ALLOCATION]);
        assert_eq!((got.len(), fin), (1, REP_ACK));
        let (_, fin) = self.info(OPT_GO, "disk", &[]);
        assert_eq!(fin, REP_ACK);
    }

    /// Reads a block-status reply: the descriptors, or the error.
    fn block_status_reply(&mut self, cookie: u64) -> Result<Vec<(u32, u32)>, u32> {
        let (flags, typ, k, p) = self.chunk();
        assert_eq!((flags & REPLY_FLAG_DONE, k), (REPLY_FLAG_DONE, cookie));
        if typ == REPLY_TYPE_ERROR {
            return Err(u32::from_be_bytes(p[..4].try_into().unwrap()));
        }
        assert_eq!(typ, REPLY_TYPE_BLOCK_STATUS);
        assert_eq!(
            u32::from_be_bytes(p[..4].try_into().unwrap()),
            META_ID_BASE_ALLOCATION
        );
        assert_eq!((p.len() - 4) % 8, 0);
        Ok(p[4..]
            .chunks_exact(8)
            .map(|d| {
                (
                    u32::from_be_bytes(d[..4].try_into().unwrap()),
                    u32::from_be_bytes(d[4..].try_into().unwrap()),
                )
            })
            .collect())
    }

    /// Asserts the server closed the connection (EOF, possibly after ignoring some bytes).
    fn expect_closed(&mut self) {
        let mut b = [0u8; 256];
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return,
                Ok(_) => assert!(Instant::now() < deadline, "server kept sending"),
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return,
                Err(e) => panic!("expected the server to close the connection, got {e}"),
            }
        }
    }

    fn finish(mut self) {
        if let Some(t) = self.server_thread.take() {
            drop(self.s);
            t.join().unwrap();
        }
    }
}

fn mem_server() -> (Arc<TestDevice>, Arc<NbdServer>) {
    let dev = Arc::new(TestDevice::new(8 * MIB, 512));
    let srv = server_with(dev.clone(), |b| b);
    (dev, srv)
}

#[test]
fn go_reports_export_info_and_block_sizes() {
    let (_, srv) = mem_server();
    let mut c = Client::pair(&srv);
    c.flags(FLAG_C_FIXED_NEWSTYLE);
    let (infos, fin) = c.info(
        OPT_GO,
        "disk",
        &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE],
    );
    assert_eq!(fin, REP_ACK);
    let find = |t: u16| {
        infos
            .iter()
            .find(|i| u16::from_be_bytes([i[0], i[1]]) == t)
            .cloned()
    };
    let export = find(INFO_EXPORT).expect("NBD_INFO_EXPORT");
    assert_eq!(export.len(), 12);
    assert_eq!(
        u64::from_be_bytes(export[2..10].try_into().unwrap()),
        8 * MIB
    );
    let flags = u16::from_be_bytes([export[10], export[11]]);
    let want = FLAG_HAS_FLAGS
        | FLAG_SEND_FLUSH
        | FLAG_SEND_FUA
        | FLAG_SEND_TRIM
        | FLAG_SEND_WRITE_ZEROES
        | FLAG_CAN_MULTI_CONN
        | FLAG_SEND_CACHE
        | FLAG_SEND_FAST_ZERO;
    assert_eq!(flags, want, "no structured replies: no DF; not read-only");
    let bs = find(INFO_BLOCK_SIZE).expect("NBD_INFO_BLOCK_SIZE");
    assert_eq!(bs.len(), 14);
    assert_eq!(u32::from_be_bytes(bs[2..6].try_into().unwrap()), 512);
    assert_eq!(u32::from_be_bytes(bs[6..10].try_into().unwrap()), 4096);
    assert_eq!(u32::from_be_bytes(bs[10..14].try_into().unwrap()), 32 << 20);
    assert_eq!(&find(INFO_NAME).unwrap()[2..], b"disk");
    assert_eq!(&find(INFO_DESCRIPTION).unwrap()[2..], b"test disk");

    // Simple replies in transmission.
    c.request(0, CMD_WRITE, 1, 4096, 512, &[0xab; 512]);
    assert_eq!(c.simple(), (0, 1));
    c.request(0, CMD_READ, 2, 4096, 512, &[]);
    assert_eq!(c.simple(), (0, 2));
    assert_eq!(c.read_n(512), vec![0xab; 512]);
    c.request(0, CMD_DISC, 3, 0, 0, &[]);
    c.expect_closed();
    c.finish();
}

#[test]
fn block_size_larger_than_4k_is_preferred_size() {
    let dev = Arc::new(MemoryDevice::new(MIB, 8192));
    let srv = server_with(dev, |b| b);
    let mut c = Client::pair(&srv);
    c.flags(FLAG_C_FIXED_NEWSTYLE);
    let (infos, fin) = c.info(OPT_INFO, "", &[INFO_BLOCK_SIZE]);
    assert_eq!(fin, REP_ACK);
    let bs = infos.iter().find(|i| i[1] == 3).unwrap();
    assert_eq!(u32::from_be_bytes(bs[2..6].try_into().unwrap()), 8192);
    assert_eq!(u32::from_be_bytes(bs[6..10].try_into().unwrap()), 8192);
    c.opt(OPT_ABORT, &[]);
    assert_eq!(c.opt_reply(OPT_ABORT).0, REP_ACK);
    c.expect_closed();
    c.finish();
}

#[test]
fn handshake_options_list_info_unknown_and_invalid() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(MIB, 512));
    let srv = Arc::new(
        NbdServer::builder()
            .export("a", dev.clone())
            .description("first")
            .export("b", dev)
            .read_only(true)
            .build()
            .unwrap(),
    );
    let mut c = Client::pair(&srv);
    c.flags(FLAG_C_FIXED_NEWSTYLE);

    c.opt(OPT_LIST, &[]);
    let (t, d) = c.opt_reply(OPT_LIST);
    assert_eq!(t, REP_SERVER);
    assert_eq!(&d[0..4], &1u32.to_be_bytes());
    assert_eq!(&d[4..], b"afirst");
    let (t, d) = c.opt_reply(OPT_LIST);
    assert_eq!((t, &d[..]), (REP_SERVER, &b"\0\0\0\x01b"[..]));
    assert_eq!(c.opt_reply(OPT_LIST).0, REP_ACK);

    c.opt(OPT_LIST, b"junk");
    assert_eq!(c.opt_reply(OPT_LIST).0, REP_ERR_INVALID);
    c.opt(OPT_STRUCTURED_REPLY, b"x");
    assert_eq!(c.opt_reply(OPT_STRUCTURED_REPLY).0, REP_ERR_INVALID);
    c.opt(OPT_STARTTLS, &[]);
    assert_eq!(c.opt_reply(OPT_STARTTLS).0, REP_ERR_UNSUP);
    c.opt(9999, b"whatever");
    assert_eq!(c.opt_reply(9999).0, REP_ERR_UNSUP);
    c.opt(OPT_SET_META_CONTEXT, &[0; 8]); // needs structured replies first
    assert_eq!(c.opt_reply(OPT_SET_META_CONTEXT).0, REP_ERR_INVALID);
    c.opt(OPT_EXTENDED_HEADERS, &[]);
    assert_eq!(c.opt_reply(OPT_EXTENDED_HEADERS).0, REP_ERR_UNSUP);

    let (infos, fin) = c.info(OPT_INFO, "nope", &[]);
    assert_eq!((infos.len(), fin), (0, REP_ERR_UNKNOWN));
    // Name length pointing past the option data.
    let mut d = 100u32.to_be_bytes().to_vec();
    d.extend_from_slice(b"ab\0\0");
    c.opt(OPT_GO, &d);
    assert_eq!(c.opt_reply(OPT_GO).0, REP_ERR_INVALID);
    // Info request count not matching the length.
    let mut d = 1u32.to_be_bytes().to_vec();
    d.extend_from_slice(b"a\0\x05\0\x01");
    c.opt(OPT_GO, &d);
    assert_eq!(c.opt_reply(OPT_GO).0, REP_ERR_INVALID);
    c.opt(OPT_INFO, &[0, 0]);
    assert_eq!(c.opt_reply(OPT_INFO).0, REP_ERR_INVALID);

    // INFO on the read-only export, then GO on it: same flags, READ_ONLY set.
    let (infos, fin) = c.info(OPT_INFO, "b", &[]);
    assert_eq!(fin, REP_ACK);
    let flags = u16::from_be_bytes([infos[0][10], infos[0][11]]);
    assert_ne!(flags & FLAG_READ_ONLY, 0);
    let (infos2, fin) = c.info(OPT_GO, "b", &[]);
    assert_eq!(fin, REP_ACK);
    assert_eq!(infos[0], infos2[0]);
    // Read-only: writes, trims, zeroes fail with EPERM; reads work.
    c.request(0, CMD_WRITE, 1, 0, 512, &[1; 512]);
    assert_eq!(c.simple(), (EPERM, 1));
    c.request(0, CMD_TRIM, 2, 0, 512, &[]);
    assert_eq!(c.simple(), (EPERM, 2));
    c.request(0, CMD_WRITE_ZEROES, 3, 0, 512, &[]);
    assert_eq!(c.simple(), (EPERM, 3));
    c.request(0, CMD_READ, 4, 0, 512, &[]);
    assert_eq!(c.simple(), (0, 4));
    assert_eq!(c.read_n(512), vec![0; 512]);
    c.finish();
}

#[test]
fn export_name_with_and_without_zeroes() {
    let (_, srv) = mem_server();
    for no_zeroes in [false, true] {
        let mut c = Client::pair(&srv);
        c.flags(FLAG_C_FIXED_NEWSTYLE | if no_zeroes { FLAG_C_NO_ZEROES } else { 0 });
        c.opt(OPT_EXPORT_NAME, b"disk");
        assert_eq!(c.u64(), 8 * MIB);
        let flags = c.u16();
        assert_ne!(flags & FLAG_HAS_FLAGS, 0);
        if !no_zeroes {
            assert_eq!(c.read_n(124), vec![0; 124]);
        }
        // The next bytes must be the reply to our first request.
        c.request(0, CMD_FLUSH, 42, 0, 0, &[]);
        assert_eq!(c.simple(), (0, 42));
        c.finish();
    }
    // Unknown export with EXPORT_NAME: nothing to do but hang up.
    let mut c = Client::pair(&srv);
    c.flags(FLAG_C_FIXED_NEWSTYLE);
    c.opt(OPT_EXPORT_NAME, b"other");
    c.expect_closed();
    c.finish();
}

#[test]
fn hostile_handshakes_close_only_that_connection() {
    let (_, srv) = mem_server();
    // Unknown client flags.
    let mut c = Client::pair(&srv);
    c.flags(1 << 7);
    c.expect_closed();
    c.finish();
    // Oversized option length: closed without reading the (never sent) data.
    let mut c = Client::pair(&srv);
    c.flags(FLAG_C_FIXED_NEWSTYLE);
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&OPT_GO.to_be_bytes());
    b.extend_from_slice(&0xffff_ff00u32.to_be_bytes());
    c.send(&b);
    c.expect_closed();
    c.finish();
    // Bad option magic.
    let mut c = Client::pair(&srv);
    c.flags(FLAG_C_FIXED_NEWSTYLE);
    c.send(&[0x55; 16]);
    c.expect_closed();
    c.finish();
    // Truncated handshake (client hangs up mid-option).
    let mut c = Client::pair(&srv);
    c.flags(FLAG_C_FIXED_NEWSTYLE);
    c.send(&IHAVEOPT.to_be_bytes());
    c.finish();
    // Other clients are unaffected.
    let mut c = Client::pair(&srv);
    c.go(true);
    c.request(0, CMD_READ, 5, 0, 512, &[]);
    assert_eq!(c.any_reply(), (5, 0, vec![0; 512]));
    c.finish();
    assert!(srv.stats().protocol_errors >= 3, "{:?}", srv.stats());
}

#[test]
fn handshake_timeout_drops_silent_clients() {
    let dev = Arc::new(MemoryDevice::new(MIB, 512));
    let srv = server_with(dev, |b| b.handshake_timeout(Duration::from_millis(200)));
    let mut c = Client::pair(&srv);
    let t = Instant::now();
    c.expect_closed();
    assert!(t.elapsed() < Duration::from_secs(3));
    c.finish();
}

#[test]
fn structured_reads() {
    let (dev, srv) = mem_server();
    dev.mem.write_at(&[7; 1024], 8192, false).unwrap();
    let mut c = Client::pair(&srv);
    c.flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    c.opt(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.opt_reply(OPT_STRUCTURED_REPLY).0, REP_ACK);
    let (infos, fin) = c.info(OPT_GO, "disk", &[]);
    assert_eq!(fin, REP_ACK);
    assert_ne!(
        u16::from_be_bytes([infos[0][10], infos[0][11]]) & FLAG_SEND_DF,
        0
    );

    c.request(CMD_FLAG_DF, CMD_READ, 9, 8192, 1024, &[]);
    let (flags, typ, cookie, p) = c.chunk();
    assert_eq!(
        (flags, typ, cookie, p.len()),
        (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, 9, 8 + 1024)
    );
    assert_eq!(u64::from_be_bytes(p[0..8].try_into().unwrap()), 8192);
    assert_eq!(&p[8..], &[7; 1024]);

    c.request(0, CMD_READ, 10, 0, 0, &[]);
    assert_eq!(c.chunk(), (REPLY_FLAG_DONE, REPLY_TYPE_NONE, 10, vec![]));

    c.request(0, CMD_READ, 11, 8 * MIB, 512, &[]);
    let (flags, typ, cookie, p) = c.chunk();
    assert_eq!(
        (flags, typ, cookie),
        (REPLY_FLAG_DONE, REPLY_TYPE_ERROR, 11)
    );
    assert_eq!(u32::from_be_bytes(p[0..4].try_into().unwrap()), EINVAL);
    let mlen = u16::from_be_bytes([p[4], p[5]]) as usize;
    assert_eq!(p.len(), 6 + mlen);
    assert!(std::str::from_utf8(&p[6..]).unwrap().contains("end"));

    // Oversized read with structured replies: EOVERFLOW, connection stays.
    c.request(0, CMD_READ, 12, 0, (32 << 20) + 512, &[]);
    assert_eq!(c.any_reply().1, EOVERFLOW);
    // Backend failure during read: error chunk, then the server keeps serving.
    lock(&dev.fail).push(5);
    c.request(0, CMD_READ, 13, 0, 512, &[]);
    assert_eq!(c.any_reply(), (13, EIO, vec![]));
    c.request(0, CMD_READ, 14, 8192, 512, &[]);
    assert_eq!(c.any_reply(), (14, 0, vec![7; 512]));
    c.finish();
}

/// Regression (fuzz target nbd_session): a zero-length read with simple replies as the
/// first request a thread serves panicked on its still empty data buffer.
#[test]
fn zero_length_reads_with_simple_replies() {
    let (_dev, srv) = mem_server();
    let mut c = Client::pair(&srv);
    c.go(false);
    // More requests than threads, so every thread's first request is such a read.
    for cookie in 0..16 {
        c.request(0, CMD_READ, cookie, 4096, 0, &[]);
    }
    let mut got: Vec<(u32, u64)> = (0..16).map(|_| c.simple()).collect();
    got.sort_by_key(|&(_, k)| k);
    assert_eq!(got, (0..16).map(|k| (0, k)).collect::<Vec<_>>());
    c.request(0, CMD_READ, 99, 0, 512, &[]);
    assert_eq!(c.simple(), (0, 99));
    assert_eq!(c.read_n(512), vec![0; 512]);
    c.finish();
    assert_eq!(srv.stats().errors, 0);
}

#[test]
fn hostile_requests_get_errors_and_the_connection_survives() {
    let (dev, srv) = mem_server();
    let mut c = Client::pair(&srv);
    c.go(false);
    let end = 8 * MIB;
    // Past the end: reads/trims EINVAL, writes/zeroes ENOSPC; the write payload is consumed.
    c.request(0, CMD_READ, 1, end - 512, 1024, &[]);
    assert_eq!(c.simple(), (EINVAL, 1));
    c.request(0, CMD_WRITE, 2, end, 512, &[9; 512]);
    assert_eq!(c.simple(), (ENOSPC, 2));
    c.request(0, CMD_TRIM, 3, end, 512, &[]);
    assert_eq!(c.simple(), (EINVAL, 3));
    c.request(0, CMD_WRITE_ZEROES, 4, end - 512, 1024, &[]);
    assert_eq!(c.simple(), (ENOSPC, 4));
    c.request(0, CMD_READ, 5, u64::MAX - 511, 1024, &[]);
    assert_eq!(c.simple(), (EINVAL, 5));
    // Unaligned.
    c.request(0, CMD_READ, 6, 100, 512, &[]);
    assert_eq!(c.simple(), (EINVAL, 6));
    c.request(0, CMD_WRITE, 7, 0, 100, &[1; 100]);
    assert_eq!(c.simple(), (EINVAL, 7));
    c.request(0, CMD_TRIM, 8, 512, 10, &[]);
    assert_eq!(c.simple(), (EINVAL, 8));
    // Unknown command, unknown flags, flag not valid for the command.
    c.request(0, 77, 9, 0, 0, &[]);
    assert_eq!(c.simple(), (EINVAL, 9));
    c.request(1 << 9, CMD_READ, 10, 0, 512, &[]);
    assert_eq!(c.simple(), (EINVAL, 10));
    c.request(CMD_FLAG_NO_HOLE, CMD_WRITE, 11, 0, 512, &[2; 512]);
    assert_eq!(c.simple(), (EINVAL, 11));
    c.request(CMD_FLAG_DF, CMD_READ, 12, 0, 512, &[]);
    assert_eq!(c.simple(), (EINVAL, 12), "DF needs structured replies");
    c.request(CMD_FLAG_FAST_ZERO, CMD_READ, 13, 0, 512, &[]);
    assert_eq!(
        c.simple(),
        (EINVAL, 13),
        "FAST_ZERO is for write-zeroes only"
    );
    // Oversized read with simple replies: EINVAL, no payload, connection stays.
    c.request(0, CMD_READ, 14, 0, u32::MAX - 511, &[]);
    assert_eq!(c.simple(), (EINVAL, 14));
    // Zero-length requests are harmless.
    c.request(0, CMD_WRITE, 15, 0, 0, &[]);
    assert_eq!(c.simple(), (0, 15));
    // Nothing was written by all of the above.
    let mut all = vec![1u8; end as usize];
    dev.mem.read_at(&mut all, 0).unwrap();
    assert!(all.iter().all(|&b| b == 0));
    // Still serving.
    c.request(0, CMD_WRITE, 16, 512, 512, &[3; 512]);
    assert_eq!(c.simple(), (0, 16));
    c.request(0, CMD_READ, 17, 512, 512, &[]);
    assert_eq!(c.simple(), (0, 17));
    assert_eq!(c.read_n(512), vec![3; 512]);
    assert_eq!(srv.stats().errors, 14);

    // Oversized write: error reply, then the connection is closed.
    c.request(0, CMD_WRITE, 18, 0, (32 << 20) + 512, &[]);
    assert_eq!(c.simple(), (EINVAL, 18));
    c.expect_closed();
    c.finish();

    // Bad request magic: closed.
    let mut c = Client::pair(&srv);
    c.go(false);
    c.send(&[0xee; 28]);
    c.expect_closed();
    c.finish();

    // Client vanishes mid-payload: the server just drops the connection.
    let mut c = Client::pair(&srv);
    c.go(false);
    c.request(0, CMD_WRITE, 1, 0, 4096, &[5; 100]);
    c.finish();
    let mut b = [1u8; 512];
    dev.mem.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [0; 512]);
}

#[test]
fn unaligned_requests_reach_a_byte_granular_device() {
    let mut dev = TestDevice::new(MIB, 4096);
    dev.byte_granular = true;
    let dev = Arc::new(dev);
    let srv = server_with(dev.clone(), |b| b);
    let mut c = Client::pair(&srv);
    c.go(false);
    c.request(0, CMD_WRITE, 1, 1000, 100, &[5; 100]);
    assert_eq!(c.simple(), (0, 1));
    c.request(0, CMD_READ, 2, 999, 102, &[]);
    assert_eq!(c.simple(), (0, 2));
    let data = c.read_n(102);
    let mut want = vec![5u8; 102];
    (want[0], want[101]) = (0, 0);
    assert_eq!(data, want);
    c.request(0, CMD_WRITE_ZEROES, 3, 1010, 10, &[]);
    assert_eq!(c.simple(), (0, 3));
    let mut back = [9u8; 100];
    dev.mem.read_at(&mut back, 1000).unwrap();
    assert_eq!(&back[..10], &[5; 10]);
    assert_eq!(&back[10..20], &[0; 10]);
    assert_eq!(&back[20..], &[5; 80]);
    // Bounds are still enforced.
    c.request(0, CMD_READ, 4, MIB - 10, 11, &[]);
    assert_eq!(c.simple(), (EINVAL, 4));
    c.finish();
}

#[test]
fn requests_are_served_with_and_without_busy_polling() {
    for poll in [Duration::ZERO, Duration::from_millis(20)] {
        let dev = Arc::new(TestDevice::new(MIB, 512));
        let srv = server_with(dev.clone(), |b| b.busy_poll(poll));
        let mut c = Client::pair(&srv);
        c.go(false);
        // Back to back (picked up while polling), then after the poll window has passed
        // (the reader has gone to sleep in read and must be woken).
        for (i, pause) in [0u64, 0, 60, 5, 60].into_iter().enumerate() {
            thread::sleep(Duration::from_millis(pause));
            c.request(0, CMD_WRITE, i as u64, 512 * i as u64, 512, &[i as u8; 512]);
            assert_eq!(c.simple(), (0, i as u64), "poll {poll:?}");
        }
        let mut back = [0u8; 512];
        dev.mem.read_at(&mut back, 4 * 512).unwrap();
        assert_eq!(back, [4; 512]);
        c.finish();
    }
}

#[test]
fn trim_not_advertised_without_discard() {
    let mut d = TestDevice::new(MIB, 512);
    d.discard = false;
    let srv = server_with(Arc::new(d), |b| b);
    let mut c = Client::pair(&srv);
    c.flags(FLAG_C_FIXED_NEWSTYLE);
    let (infos, _) = c.info(OPT_GO, "disk", &[]);
    assert_eq!(
        u16::from_be_bytes([infos[0][10], infos[0][11]]) & FLAG_SEND_TRIM,
        0
    );
    c.request(0, CMD_TRIM, 1, 0, 512, &[]);
    assert_eq!(c.simple(), (EINVAL, 1));
    c.finish();
}

#[test]
fn backend_errors_map_to_nbd_errors() {
    let (dev, srv) = mem_server();
    let mut c = Client::pair(&srv);
    c.go(true);
    for (injected, want) in [
        (5, EIO),
        (28, ENOSPC),
        (122, ENOSPC),
        (30, EPERM),
        (13, EPERM),
        (22, EINVAL),
        (0, EIO),
    ] {
        lock(&dev.fail).push(injected);
        c.request(0, CMD_WRITE, injected as u64, 0, 512, &[1; 512]);
        assert_eq!(
            c.any_reply(),
            (injected as u64, want, vec![]),
            "errno {injected}"
        );
    }
    lock(&dev.fail).push(5);
    c.request(0, CMD_FLUSH, 100, 0, 0, &[]);
    assert_eq!(c.any_reply(), (100, EIO, vec![]));
    lock(&dev.fail).push(28);
    c.request(0, CMD_WRITE_ZEROES, 101, 0, 512, &[]);
    assert_eq!(c.any_reply(), (101, ENOSPC, vec![]));
    // Still serving.
    c.request(0, CMD_FLUSH, 102, 0, 0, &[]);
    assert_eq!(c.any_reply(), (102, 0, vec![]));
    c.finish();
}

#[test]
fn fua_no_hole_and_flush_reach_the_device() {
    let (dev, srv) = mem_server();
    let mut c = Client::pair(&srv);
    c.go(false);
    c.request(CMD_FLAG_FUA, CMD_WRITE, 1, 0, 512, &[1; 512]);
    assert_eq!(c.simple(), (0, 1));
    assert!(dev.last_fua.load(Relaxed));
    c.request(0, CMD_WRITE, 2, 0, 512, &[1; 512]);
    assert_eq!(c.simple(), (0, 2));
    assert!(!dev.last_fua.load(Relaxed));

    c.request(CMD_FLAG_NO_HOLE, CMD_WRITE_ZEROES, 3, 0, 512, &[]);
    assert_eq!(c.simple(), (0, 3));
    assert!(
        !dev.last_may_unmap.load(Relaxed),
        "NO_HOLE means may_unmap = false"
    );
    c.request(0, CMD_WRITE_ZEROES, 4, 0, 512, &[]);
    assert_eq!(c.simple(), (0, 4));
    assert!(dev.last_may_unmap.load(Relaxed));

    let f0 = dev.flushes.load(Relaxed);
    c.request(CMD_FLAG_FUA, CMD_WRITE_ZEROES, 5, 0, 512, &[]);
    assert_eq!(c.simple(), (0, 5));
    assert_eq!(dev.flushes.load(Relaxed), f0 + 1, "FUA zeroes flush");
    c.request(0, CMD_FLUSH, 6, 0, 0, &[]);
    assert_eq!(c.simple(), (0, 6));
    assert_eq!(dev.flushes.load(Relaxed), f0 + 2);
    // Trim zeroes the MemoryDevice; FUA accepted on reads too.
    c.request(0, CMD_WRITE, 7, 1024, 512, &[4; 512]);
    assert_eq!(c.simple(), (0, 7));
    c.request(0, CMD_TRIM, 8, 1024, 512, &[]);
    assert_eq!(c.simple(), (0, 8));
    c.request(CMD_FLAG_FUA, CMD_READ, 9, 1024, 512, &[]);
    assert_eq!(c.simple(), (0, 9));
    assert_eq!(c.read_n(512), vec![0; 512]);
    // Write zeroes larger than the maximum payload is fine (no payload).
    c.request(0, CMD_WRITE_ZEROES, 10, 0, 8 << 20, &[]);
    assert_eq!(c.simple(), (0, 10));

    let s = srv.stats();
    assert_eq!((s.writes, s.write_bytes), (3, 1536));
    assert_eq!((s.reads, s.read_bytes), (1, 512));
    assert_eq!((s.trims, s.trim_bytes), (1, 512));
    assert_eq!(
        (s.write_zeroes, s.write_zeroes_bytes),
        (4, 1536 + (8 << 20))
    );
    assert_eq!(s.flushes, 1);
    assert_eq!(s.errors, 0);
    assert_eq!((s.connections_active, s.connections_total), (1, 1));
    c.finish();
    assert_eq!(srv.stats().connections_active, 0);
}

#[test]
fn replies_out_of_order_with_several_threads() {
    let mut d = TestDevice::new(MIB, 512);
    d.gate_reads_at_zero = true;
    let dev = Arc::new(d);
    let srv = server_with(dev.clone(), |b| b.threads_per_connection(4));
    let mut c = Client::pair(&srv);
    c.go(true);
    dev.mem.write_at(&[1; 512], 0, false).unwrap();
    dev.mem.write_at(&[2; 512], 4096, false).unwrap();
    // The read at 0 blocks until we have the reply to the read at 4096.
    c.request(0, CMD_READ, 100, 0, 512, &[]);
    c.request(0, CMD_READ, 200, 4096, 512, &[]);
    let t = Instant::now();
    assert_eq!(c.any_reply(), (200, 0, vec![2; 512]));
    dev.open_gate();
    assert_eq!(c.any_reply(), (100, 0, vec![1; 512]));
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "the first read waited for the gate timeout"
    );
    c.finish();
}

#[test]
fn one_thread_per_connection_replies_in_order() {
    let mut d = TestDevice::new(MIB, 512);
    d.gate_reads_at_zero = true;
    let dev = Arc::new(d);
    let srv = server_with(dev.clone(), |b| b.threads_per_connection(1));
    let mut c = Client::pair(&srv);
    c.go(true);
    c.request(0, CMD_READ, 100, 0, 512, &[]);
    c.request(0, CMD_READ, 200, 4096, 512, &[]);
    thread::sleep(Duration::from_millis(300));
    dev.open_gate();
    assert_eq!(c.any_reply().0, 100);
    assert_eq!(c.any_reply().0, 200);
    c.finish();
}

#[test]
fn pipelined_mixed_requests_keep_data_and_cookies_straight() {
    let dev = Arc::new(MemoryDevice::new(16 * MIB, 4096));
    let srv = server_with(dev.clone(), |b| b.threads_per_connection(8));
    let mut c = Client::pair(&srv);
    c.go(true);
    // 64 writes of distinct sizes and patterns, sent back to back.
    let mut batch = Vec::new();
    let mut expect = std::collections::HashMap::new();
    for i in 0..64u64 {
        let len = 4096 * (1 + (i as usize * 7) % 40);
        let off = i * 256 * 1024;
        let data: Vec<u8> = (0..len).map(|j| (i as usize * 31 + j) as u8).collect();
        batch.extend_from_slice(
            &Request {
                magic: REQUEST_MAGIC,
                flags: 0,
                typ: CMD_WRITE,
                cookie: 1000 + i,
                offset: off,
                len: len as u32,
            }
            .encode(),
        );
        batch.extend_from_slice(&data);
        expect.insert(2000 + i, (off, data));
    }
    let mut w = c.s.try_clone().unwrap();
    let writer = thread::spawn(move || w.write_all(&batch).unwrap());
    let mut seen = std::collections::HashSet::new();
    for _ in 0..64 {
        let (cookie, err, _) = c.any_reply();
        assert_eq!(err, 0);
        assert!((1000..1064).contains(&cookie) && seen.insert(cookie));
    }
    writer.join().unwrap();
    for (cookie, (off, data)) in &expect {
        c.request(0, CMD_READ, *cookie, *off, data.len() as u32, &[]);
    }
    for _ in 0..64 {
        let (cookie, err, got) = c.any_reply();
        assert_eq!(err, 0);
        assert_eq!(&got, &expect[&cookie].1, "cookie {cookie}");
    }
    // A maximal 32 MiB request works both ways... on a 16 MiB disk it must fail cleanly instead.
    c.request(0, CMD_READ, 1, 0, 32 << 20, &[]);
    assert_eq!(c.any_reply().1, EINVAL);
    c.finish();
}

#[test]
fn max_size_write_and_read() {
    let dev = Arc::new(MemoryDevice::new(64 * MIB, 512));
    let srv = server_with(dev, |b| b);
    let mut c = Client::pair(&srv);
    c.go(true);
    let data: Vec<u8> = (0..32 << 20)
        .map(|i: usize| (i / 512) as u8 ^ (i as u8))
        .collect();
    let mut w = c.s.try_clone().unwrap();
    let d2 = data.clone();
    let writer = thread::spawn(move || {
        let r = Request {
            magic: REQUEST_MAGIC,
            flags: 0,
            typ: CMD_WRITE,
            cookie: 1,
            offset: 16 * MIB,
            len: 32 << 20,
        };
        w.write_all(&r.encode()).unwrap();
        w.write_all(&d2).unwrap();
    });
    assert_eq!(c.any_reply(), (1, 0, vec![]));
    writer.join().unwrap();
    c.request(0, CMD_READ, 2, 16 * MIB, 32 << 20, &[]);
    let (cookie, err, got) = c.any_reply();
    assert_eq!((cookie, err), (2, 0));
    assert!(got == data);
    c.finish();
}

#[test]
fn disconnect_finishes_in_flight_requests_then_flushes() {
    let mut d = TestDevice::new(MIB, 512);
    d.write_delay = Duration::from_millis(300);
    let dev = Arc::new(d);
    let srv = server_with(dev.clone(), |b| b.threads_per_connection(4));
    let mut c = Client::pair(&srv);
    c.go(false);
    c.request(0, CMD_WRITE, 1, 0, 512, &[6; 512]);
    c.request(0, CMD_WRITE, 2, 512, 512, &[7; 512]);
    c.request(0, CMD_DISC, 3, 0, 0, &[]);
    let mut cookies = vec![c.simple(), c.simple()];
    cookies.sort();
    assert_eq!(cookies, vec![(0, 1), (0, 2)]);
    c.expect_closed();
    c.finish();
    assert!(dev.flushes.load(Relaxed) >= 1, "flushed after DISC");
    let mut b = [0u8; 1024];
    dev.mem.read_at(&mut b, 0).unwrap();
    assert_eq!((&b[..512], &b[512..]), (&[6u8; 512][..], &[7u8; 512][..]));
}

#[test]
fn builder_rejects_bad_configuration() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(MIB, 512));
    assert!(NbdServer::builder().build().is_err());
    assert!(
        NbdServer::builder()
            .description("x")
            .export("a", dev.clone())
            .build()
            .is_err()
    );
    assert!(
        NbdServer::builder()
            .export("a", dev.clone())
            .threads_per_connection(0)
            .build()
            .is_err()
    );
    assert!(
        NbdServer::builder()
            .export("a", dev.clone())
            .max_connections(0)
            .build()
            .is_err()
    );
    assert!(
        NbdServer::builder()
            .export("a", dev.clone())
            .export("a", dev.clone())
            .build()
            .is_err()
    );
    assert!(
        NbdServer::builder()
            .export("x".repeat(5000), dev.clone())
            .build()
            .is_err()
    );
    assert!(
        NbdServer::builder()
            .export("a", dev.clone())
            .max_buffer_bytes(MIN_MAX_BUFFER_BYTES - 1)
            .build()
            .is_err(),
        "the buffer pool must hold one maximum-size request"
    );
    let odd: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(MIB, 1000));
    assert!(NbdServer::builder().export("a", odd).build().is_err());
    // Size not a multiple of the block size: the tail is not advertised.
    let uneven: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(MIB + 100, 512));
    let srv = Arc::new(NbdServer::builder().export("a", uneven).build().unwrap());
    let mut c = Client::pair(&srv);
    c.flags(FLAG_C_FIXED_NEWSTYLE);
    let (infos, _) = c.info(OPT_INFO, "a", &[]);
    assert_eq!(u64::from_be_bytes(infos[0][2..10].try_into().unwrap()), MIB);
    c.finish();
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn wait_for_socket(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(Instant::now() < deadline, "server socket never appeared");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn unix_server_limits_connections_and_shuts_down_cleanly() {
    let dir = temp_dir();
    let path = dir.path().join("nbd.sock");
    let dev = Arc::new(TestDevice::new(MIB, 512));
    let srv = server_with(dev.clone(), |b| b.max_connections(1));
    let handle = srv.shutdown_handle();
    let s2 = srv.clone();
    let p2 = path.clone();
    let serving = thread::spawn(move || s2.serve_unix(&p2));
    wait_for_socket(&path);

    let mut c1 = Client::connect(&path);
    c1.go(false);
    c1.request(0, CMD_WRITE, 1, 0, 512, &[8; 512]);
    assert_eq!(c1.simple(), (0, 1));

    // Second client: politely refused.
    let mut c2 = Client::connect(&path);
    c2.flags(FLAG_C_FIXED_NEWSTYLE);
    let (_, fin) = c2.info(OPT_GO, "disk", &[]);
    assert_eq!(fin, REP_ERR_POLICY);
    c2.opt(OPT_ABORT, &[]);
    assert_eq!(c2.opt_reply(OPT_ABORT).0, REP_ACK);
    c2.expect_closed();
    let st = handle.stats();
    assert_eq!(
        (
            st.connections_active,
            st.connections_total,
            st.connections_rejected
        ),
        (1, 1, 1)
    );

    // A second server on the same live socket is refused.
    let other = server_with(Arc::new(MemoryDevice::new(MIB, 512)), |b| b);
    assert_eq!(
        other.serve_unix(&path).unwrap_err().kind(),
        io::ErrorKind::AddrInUse
    );

    let f0 = dev.flushes.load(Relaxed);
    handle.shutdown();
    serving.join().unwrap().unwrap();
    c1.expect_closed();
    assert!(dev.flushes.load(Relaxed) > f0, "device flushed at shutdown");
    assert!(!path.exists(), "socket file removed");
    assert_eq!(handle.stats().connections_active, 0);
}

#[test]
fn stale_socket_replaced_and_regular_file_kept() {
    let dir = temp_dir();
    let path = dir.path().join("stale.sock");
    drop(UnixListener::bind(&path).unwrap()); // leaves a socket file nobody listens on
    assert!(path.exists());
    let srv = server_with(Arc::new(MemoryDevice::new(MIB, 512)), |b| b);
    let handle = srv.shutdown_handle();
    let s2 = srv.clone();
    let p2 = path.clone();
    let serving = thread::spawn(move || s2.serve_unix(&p2));
    // Wait until it accepts.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut c = loop {
        if let Ok(s) = UnixStream::connect(&path) {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut c = Client {
                s,
                server_thread: None,
            };
            c.greeting();
            break c;
        }
        assert!(Instant::now() < deadline);
        thread::sleep(Duration::from_millis(5));
    };
    c.go(false);
    handle.shutdown();
    serving.join().unwrap().unwrap();
    c.expect_closed();

    let file = dir.path().join("plain");
    std::fs::write(&file, b"keep me").unwrap();
    let srv = server_with(Arc::new(MemoryDevice::new(MIB, 512)), |b| b);
    assert!(srv.serve_unix(&file).is_err());
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
}

#[test]
fn shutdown_while_in_handshake_and_with_request_in_flight() {
    let dir = temp_dir();
    let path = dir.path().join("s.sock");
    let mut d = TestDevice::new(MIB, 512);
    d.write_delay = Duration::from_millis(300);
    let srv = server_with(Arc::new(d), |b| b);
    let handle = srv.shutdown_handle();
    let s2 = srv.clone();
    let p2 = path.clone();
    let serving = thread::spawn(move || s2.serve_unix(&p2));
    wait_for_socket(&path);
    let mut idle = Client::connect(&path); // stays in the handshake
    let mut busy = Client::connect(&path);
    busy.go(false);
    busy.request(0, CMD_WRITE, 5, 0, 512, &[1; 512]);
    thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    handle.shutdown();
    assert_eq!(
        busy.simple(),
        (0, 5),
        "in-flight write answered before closing"
    );
    busy.expect_closed();
    idle.expect_closed();
    serving.join().unwrap().unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn tcp_loopback_only_unless_allowed() {
    let srv = server_with(Arc::new(MemoryDevice::new(MIB, 512)), |b| b);
    let err = srv.serve_tcp("0.0.0.0:0").unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let srv = Arc::new(srv);
    let handle = srv.shutdown_handle();
    let s2 = srv.clone();
    let serving = thread::spawn(move || s2.serve_tcp_listener(listener));
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut greet = [0u8; 18];
    s.read_exact(&mut greet).unwrap();
    assert_eq!(&greet[..8], b"NBDMAGIC");
    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    let mut opt = IHAVEOPT.to_be_bytes().to_vec();
    opt.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    opt.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&opt).unwrap();
    let mut r = [0u8; 10];
    s.read_exact(&mut r).unwrap();
    assert_eq!(u64::from_be_bytes(r[..8].try_into().unwrap()), MIB);
    handle.shutdown();
    serving.join().unwrap().unwrap();
    assert_eq!(s.read(&mut r).unwrap(), 0);
}

/// Sends `bytes` one at a time, `gap` apart; stops quietly at the first failed write.
fn dribble(s: &mut UnixStream, bytes: &[u8], gap: Duration) -> usize {
    for (i, b) in bytes.iter().enumerate() {
        if s.write_all(std::slice::from_ref(b)).is_err() {
            return i;
        }
        thread::sleep(gap);
    }
    bytes.len()
}

#[test]
fn slowloris_handshake_is_cut_off_at_the_handshake_deadline() {
    // Each byte arrives well within the timeout, but the handshake as a whole does not.
    let dev = Arc::new(MemoryDevice::new(MIB, 512));
    let srv = server_with(dev, |b| b.handshake_timeout(Duration::from_secs(1)));
    let mut c = Client::pair(&srv);
    let mut hs = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    hs.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hs.extend_from_slice(&OPT_LIST.to_be_bytes());
    hs.extend_from_slice(&0u32.to_be_bytes());
    assert_eq!(hs.len(), 20);
    let t = Instant::now();
    let mut w = c.s.try_clone().unwrap();
    let sender = thread::spawn(move || dribble(&mut w, &hs, Duration::from_millis(100)));
    c.expect_closed();
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(1800),
        "closed after {took:?}, expected about 1 s"
    );
    let sent = sender.join().unwrap();
    assert!(sent < 20, "the whole dribbled handshake was accepted");
    c.finish();
    assert_eq!(srv.stats().protocol_errors, 1);
    // A prompt client is still served.
    let mut c = Client::pair(&srv);
    c.go(false);
    c.request(0, CMD_READ, 1, 0, 512, &[]);
    assert_eq!(c.simple(), (0, 1));
    assert_eq!(c.read_n(512), vec![0; 512]);
    c.finish();
}

#[test]
fn slowloris_request_header_stalls_only_its_own_connection() {
    let dir = temp_dir();
    let path = dir.path().join("nbd.sock");
    let dev = Arc::new(MemoryDevice::new(MIB, 512));
    let srv = server_with(dev.clone(), |b| b);
    let handle = srv.shutdown_handle();
    let (s2, p2) = (srv.clone(), path.clone());
    let serving = thread::spawn(move || s2.serve_unix(&p2));
    wait_for_socket(&path);

    // One client dribbles a write request (header and payload) at 100 ms per byte of header.
    let mut slow = Client::connect(&path);
    slow.go(false);
    let r = Request {
        magic: REQUEST_MAGIC,
        flags: 0,
        typ: CMD_WRITE,
        cookie: 77,
        offset: 4096,
        len: 512,
    };
    let hdr = r.encode().to_vec();
    let mut w = slow.s.try_clone().unwrap();
    let dribbler = thread::spawn(move || {
        let n = dribble(&mut w, &hdr, Duration::from_millis(100));
        w.write_all(&[0x5a; 512]).unwrap();
        n
    });
    // Meanwhile another client gets prompt answers.
    let mut fast = Client::connect(&path);
    fast.go(true);
    for i in 0..20u64 {
        let t = Instant::now();
        fast.request(0, CMD_WRITE, i, i * 512, 512, &[i as u8; 512]);
        assert_eq!(fast.any_reply(), (i, 0, vec![]));
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(dribbler.join().unwrap(), 28);
    // The dribbled request is served correctly in the end.
    assert_eq!(slow.simple(), (0, 77));
    let mut b = [0u8; 512];
    dev.read_at(&mut b, 4096).unwrap();
    assert_eq!(b, [0x5a; 512]);
    handle.shutdown();
    serving.join().unwrap().unwrap();
}

#[test]
fn connection_storm_is_refused_beyond_the_limit_and_others_keep_working() {
    const STORM: usize = 300;
    let dir = temp_dir();
    let path = dir.path().join("nbd.sock");
    let dev = Arc::new(MemoryDevice::new(4 * MIB, 512));
    let srv = server_with(dev.clone(), |b| b); // default max_connections (32)
    let handle = srv.shutdown_handle();
    let (s2, p2) = (srv.clone(), path.clone());
    let serving = thread::spawn(move || s2.serve_unix(&p2));
    wait_for_socket(&path);

    // A client connected before the storm.
    let mut before = Client::connect(&path);
    before.go(false);

    // 300 clients at once; each accepted one writes its own block, reads it back, and stays
    // connected until all have tried, so the limit is really reached.
    let barrier = Arc::new(std::sync::Barrier::new(STORM + 1));
    let threads: Vec<_> = (0..STORM)
        .map(|i| {
            let (path, barrier) = (path.clone(), barrier.clone());
            thread::spawn(move || {
                let outcome = (|| -> io::Result<Option<UnixStream>> {
                    let mut s = UnixStream::connect(&path)?;
                    s.set_read_timeout(Some(Duration::from_secs(20)))?;
                    let mut hello = [0u8; 18];
                    s.read_exact(&mut hello)?;
                    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())?;
                    let mut d = Vec::new();
                    d.extend_from_slice(&4u32.to_be_bytes());
                    d.extend_from_slice(b"disk");
                    d.extend_from_slice(&0u16.to_be_bytes());
                    let mut o = IHAVEOPT.to_be_bytes().to_vec();
                    o.extend_from_slice(&OPT_GO.to_be_bytes());
                    o.extend_from_slice(&(d.len() as u32).to_be_bytes());
                    o.extend_from_slice(&d);
                    s.write_all(&o)?;
                    loop {
                        let mut h = [0u8; 20];
                        s.read_exact(&mut h)?;
                        let typ = u32::from_be_bytes(h[12..16].try_into().unwrap());
                        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
                        let mut body = vec![0u8; len as usize];
                        s.read_exact(&mut body)?;
                        match typ {
                            REP_INFO => continue,
                            REP_ACK => break,
                            REP_ERR_POLICY => return Ok(None),
                            t => panic!("unexpected option reply {t:#x}"),
                        }
                    }
                    let r = Request {
                        magic: REQUEST_MAGIC,
                        flags: 0,
                        typ: CMD_WRITE,
                        cookie: i as u64,
                        offset: i as u64 * 4096,
                        len: 4096,
                    };
                    let mut req = r.encode().to_vec();
                    req.extend_from_slice(&[i as u8; 4096]);
                    s.write_all(&req)?;
                    let mut rep = [0u8; 16];
                    s.read_exact(&mut rep)?;
                    assert_eq!(u32::from_be_bytes(rep[4..8].try_into().unwrap()), 0);
                    assert_eq!(u64::from_be_bytes(rep[8..16].try_into().unwrap()), i as u64);
                    Ok(Some(s)) // kept open until everyone has tried
                })();
                barrier.wait();
                // Refused: polite error or hung up (beyond the 16 being answered at once).
                matches!(outcome, Ok(Some(_)))
            })
        })
        .collect();
    // During the storm the early client is served.
    for k in 0..10 {
        before.request(0, CMD_READ, k, 0, 512, &[]);
        assert_eq!(before.simple(), (0, k));
        before.read_n(512);
    }
    barrier.wait();
    let accepted: Vec<usize> = threads
        .into_iter()
        .enumerate()
        .filter_map(|(i, t)| t.join().unwrap().then_some(i))
        .collect();
    let st = handle.stats();
    assert!(
        accepted.len() == DEFAULT_MAX_CONNECTIONS - 1,
        "{} accepted",
        accepted.len()
    );
    assert_eq!(
        st.connections_rejected as usize,
        STORM - accepted.len(),
        "{st:?}"
    );
    // Every accepted client's write landed.
    for &i in &accepted {
        let mut b = [0u8; 4096];
        dev.read_at(&mut b, i as u64 * 4096).unwrap();
        assert_eq!(b, [i as u8; 4096], "client {i}");
    }
    // Once the storm has gone, new clients are accepted again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while handle.stats().connections_active > 1 {
        assert!(Instant::now() < deadline, "storm connections never closed");
        thread::sleep(Duration::from_millis(10));
    }
    let mut after = Client::connect(&path);
    after.go(false);
    after.request(0, CMD_READ, 2, 0, 512, &[]);
    assert_eq!(after.simple(), (0, 2));
    after.read_n(512);
    before.request(0, CMD_DISC, 99, 0, 0, &[]);
    handle.shutdown();
    serving.join().unwrap().unwrap();
}

/// A server whose buffer pool holds exactly one maximum-size request, so one stalled
/// client holding it blocks every other large request until `stall_timeout` frees it.
fn one_buffer_server() -> (Arc<MemoryDevice>, Arc<NbdServer>) {
    let dev = Arc::new(MemoryDevice::new(64 * MIB, 512));
    let srv = server_with(dev.clone(), |b| {
        b.max_buffer_bytes(MIN_MAX_BUFFER_BYTES)
            .stall_timeout(Duration::from_millis(500))
    });
    (dev, srv)
}

/// One maximum-size write from a fresh client; returns how long it took.
fn big_write(srv: &Arc<NbdServer>, offset: u64, byte: u8) -> Duration {
    let mut c = Client::pair(srv);
    c.go(false);
    let t = Instant::now();
    let mut w = c.s.try_clone().unwrap();
    let writer = thread::spawn(move || {
        let r = Request {
            magic: REQUEST_MAGIC,
            flags: 0,
            typ: CMD_WRITE,
            cookie: 1,
            offset,
            len: MAX_PAYLOAD,
        };
        w.write_all(&r.encode()).unwrap();
        w.write_all(&vec![byte; MAX_PAYLOAD as usize]).unwrap();
    });
    assert_eq!(c.simple(), (0, 1));
    writer.join().unwrap();
    let took = t.elapsed();
    c.finish();
    took
}

#[test]
fn stalled_write_payload_is_dropped_and_frees_the_pool() {
    let (dev, srv) = one_buffer_server();
    // Sends the header of a 32 MiB write and 1 MiB of its payload, then nothing.
    let mut stalled = Client::pair(&srv);
    stalled.go(false);
    stalled.request(0, CMD_WRITE, 1, 0, MAX_PAYLOAD, &vec![0xAB; 1 << 20]);
    thread::sleep(Duration::from_millis(100));
    // Another client's large write waits for the one buffer, then goes through once the
    // stalled client has been dropped (not forever).
    let took = big_write(&srv, 32 * MIB, 0xCD);
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "{took:?}"
    );
    stalled.expect_closed();
    stalled.finish();
    let mut b = vec![0u8; 4096];
    dev.read_at(&mut b, 0).unwrap();
    assert_eq!(b, vec![0; 4096], "the stalled write was not applied");
    dev.read_at(&mut b, 32 * MIB).unwrap();
    assert_eq!(b, vec![0xCD; 4096]);
    let st = srv.stats();
    assert!(st.buffer_waits >= 1 && st.protocol_errors >= 1, "{st:?}");
    assert!(st.buffer_bytes_peak as usize <= MIN_MAX_BUFFER_BYTES);
}

#[test]
fn client_not_reading_replies_is_dropped_and_frees_the_pool() {
    let (_, srv) = one_buffer_server();
    // Asks for 32 MiB reads and never reads the replies.
    let mut deaf = Client::pair(&srv);
    deaf.go(false);
    for i in 0..4 {
        deaf.request(0, CMD_READ, i, 0, MAX_PAYLOAD, &[]);
    }
    thread::sleep(Duration::from_millis(100));
    let took = big_write(&srv, 0, 0x11);
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Its connection is gone (whatever part of a reply it had been sent).
    deaf.expect_closed();
    deaf.finish();
    // Healthy clients are not affected by the timeout.
    assert!(big_write(&srv, 0, 0x22) < Duration::from_secs(5));
}

#[test]
fn meta_context_negotiation() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(MIB, 512));
    let srv = Arc::new(
        NbdServer::builder()
            .export("a", dev.clone())
            .export("b", dev)
            .build()
            .unwrap(),
    );
    let base = BASE_ALLOCATION.to_vec();
    let mut c = Client::pair(&srv);
    c.flags(FLAG_C_FIXED_NEWSTYLE);
    // Without structured replies: refused, both kinds.
    for opt in [OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT] {
        assert_eq!(
            c.meta(opt, "a", &[BASE_ALLOCATION]),
            (vec![], REP_ERR_INVALID)
        );
    }
    c.opt(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.opt_reply(OPT_STRUCTURED_REPLY).0, REP_ACK);
    // LIST: every context with no query or "base:"; id 0.
    let one = (vec![(0, base.clone())], REP_ACK);
    assert_eq!(c.meta(OPT_LIST_META_CONTEXT, "a", &[]), one);
    assert_eq!(c.meta(OPT_LIST_META_CONTEXT, "", &[b"base:"]), one);
    // Other namespaces, unknown base: contexts and names without a namespace: ignored.
    let odd: [&[u8]; 4] = [b"qemu:allocation-depth", b"x-a:b", b"base:nope", b"nocolon"];
    assert_eq!(c.meta(OPT_LIST_META_CONTEXT, "a", &odd), (vec![], REP_ACK));
    assert_eq!(c.meta(OPT_SET_META_CONTEXT, "a", &odd), (vec![], REP_ACK));
    // SET: one reply with its id, however often asked; "base:" alone selects nothing.
    let twice: [&[u8]; 3] = [BASE_ALLOCATION, BASE_ALLOCATION, b"qemu:dirty-bitmap:x"];
    assert_eq!(
        c.meta(OPT_SET_META_CONTEXT, "a", &twice),
        (vec![(META_ID_BASE_ALLOCATION, base.clone())], REP_ACK)
    );
    assert_eq!(
        c.meta(OPT_SET_META_CONTEXT, "a", &[b"base:"]),
        (vec![], REP_ACK)
    );
    assert_eq!(c.meta(OPT_SET_META_CONTEXT, "a", &[]), (vec![], REP_ACK));
    // Unknown export; malformed payloads.
    assert_eq!(
        c.meta(OPT_LIST_META_CONTEXT, "zz", &[]),
        (vec![], REP_ERR_UNKNOWN)
    );
    for bad in [
        &[0u8; 7][..],
        &[0, 0, 0, 9, 0, 0, 0, 0],
        &[0, 0, 0, 0, 0, 0, 0, 1],
    ] {
        c.opt(OPT_SET_META_CONTEXT, bad);
        assert_eq!(c.opt_reply(OPT_SET_META_CONTEXT).0, REP_ERR_INVALID);
    }
    c.opt(OPT_ABORT, &[]);
    assert_eq!(c.opt_reply(OPT_ABORT).0, REP_ACK);
    c.finish();

    // A selection counts only for the export it was made on, and a failed SET clears it.
    for (set_on, go_to, spoil, want) in [
        ("a", "a", false, true),
        ("", "a", false, true),
        ("a", "b", false, false),
        ("a", "a", true, false),
    ] {
        let mut c = Client::pair(&srv);
        c.flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
        c.opt(OPT_STRUCTURED_REPLY, &[]);
        assert_eq!(c.opt_reply(OPT_STRUCTURED_REPLY).0, REP_ACK);
        assert_eq!(
            c.meta(OPT_SET_META_CONTEXT, set_on, &[BASE_ALLOCATION]).1,
            REP_ACK
        );
        if spoil {
            c.opt(OPT_SET_META_CONTEXT, &[1, 2, 3]);
            assert_eq!(c.opt_reply(OPT_SET_META_CONTEXT).0, REP_ERR_INVALID);
        }
        assert_eq!(c.info(OPT_GO, go_to, &[]).1, REP_ACK);
        c.request(0, CMD_BLOCK_STATUS, 1, 0, 4096, &[]);
        let got = c.block_status_reply(1);
        if want {
            assert_eq!(got, Ok(vec![(4096, 0)]), "set on {set_on:?}, go to {go_to}");
        } else {
            assert_eq!(
                got,
                Err(EINVAL),
                "set on {set_on:?}, go to {go_to}, spoil {spoil}"
            );
        }
        c.finish();
    }
}

#[test]
fn block_status_replies() {
    let (dev, srv) = mem_server();
    let mut c = Client::pair(&srv);
    c.go_with_block_status();
    let ext = |len, hole, zero| Extent { len, hole, zero };
    // The device's runs, as descriptors; REQ_ONE: the first only.
    *lock(&dev.extents) = Some(vec![
        ext(4096, false, false),
        ext(8192, true, true),
        ext(512, true, false),
    ]);
    c.request(0, CMD_BLOCK_STATUS, 1, 0, 4096 + 8192 + 512, &[]);
    assert_eq!(
        c.block_status_reply(1),
        Ok(vec![
            (4096, 0),
            (8192, STATE_HOLE | STATE_ZERO),
            (512, STATE_HOLE)
        ])
    );
    c.request(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 2, 0, 65536, &[]);
    assert_eq!(c.block_status_reply(2), Ok(vec![(4096, 0)]));
    // Runs past the range are cut; empty runs dropped; too many capped.
    c.request(0, CMD_BLOCK_STATUS, 3, 0, 6144, &[]);
    assert_eq!(
        c.block_status_reply(3),
        Ok(vec![(4096, 0), (2048, STATE_HOLE | STATE_ZERO)])
    );
    *lock(&dev.extents) = Some(
        std::iter::once(ext(0, true, true))
            .chain((0..5000).map(|i| ext(512, i % 2 == 1, false)))
            .collect(),
    );
    c.request(0, CMD_BLOCK_STATUS, 4, 0, 4 << 20, &[]);
    let got = c.block_status_reply(4).unwrap();
    assert_eq!(got.len(), cryptblk_device::MAX_EXTENTS);
    assert_eq!((got[0], got[1]), ((512, 0), (512, STATE_HOLE)));
    // A device that fails: all data (always true); an empty device answer likewise.
    *lock(&dev.extents) = Some(vec![]);
    c.request(0, CMD_BLOCK_STATUS, 5, 512, 1024, &[]);
    assert_eq!(c.block_status_reply(5), Ok(vec![(1024, 0)]));
    lock(&dev.fail).push(libc_eio());
    c.request(FLAG_FUA_ON_ANY, CMD_BLOCK_STATUS, 6, 512, 1024, &[]);
    assert_eq!(c.block_status_reply(6), Ok(vec![(1024, 0)]));
    // Misuse: empty, past the end, misaligned, a flag it does not take.
    for (cookie, flags, off, len) in [
        (7, 0, 0, 0),
        (8, 0, 8 * MIB - 512, 1024),
        (9, 0, 100, 512),
        (10, CMD_FLAG_DF, 0, 512),
    ] {
        c.request(flags, CMD_BLOCK_STATUS, cookie, off, len, &[]);
        assert_eq!(c.block_status_reply(cookie), Err(EINVAL), "cookie {cookie}");
    }
    c.finish();
    assert_eq!(srv.stats().block_status, 6);
}

/// FUA is valid on every command.
const FLAG_FUA_ON_ANY: u16 = CMD_FLAG_FUA;

fn libc_eio() -> i32 {
    5
}

#[test]
fn block_status_of_a_sparse_file_and_on_a_read_only_export() {
    // A plain file with data in the middle: holes that read as zeros around it.
    let dir = temp_dir();
    let path = dir.path().join("sparse.img");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.set_len(8 * MIB).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[7u8; 1 << 20], 2 * MIB).unwrap();
    // Where the file system cannot tell holes (SEEK_HOLE at the end only), all is data.
    let probe = cryptblk_device::file_seek_hole(&f, 0).unwrap();
    let dev: Arc<dyn BlockDevice> =
        Arc::new(cryptblk_device::RawDevice::with_storage(f, 4096).unwrap());
    let srv = Arc::new(
        NbdServer::builder()
            .export("disk", dev)
            .read_only(true)
            .build()
            .unwrap(),
    );
    let mut c = Client::pair(&srv);
    c.go_with_block_status();
    c.request(0, CMD_BLOCK_STATUS, 1, 0, 8 << 20, &[]);
    let got = c.block_status_reply(1).unwrap();
    if probe == 8 * MIB {
        eprintln!("NOTE: the temp dir's file system reports no holes; checked as all data");
        assert_eq!(got, vec![(8 << 20, 0)]);
    } else {
        let hz = STATE_HOLE | STATE_ZERO;
        assert_eq!(got, vec![(2 << 20, hz), (1 << 20, 0), (5 << 20, hz)]);
    }
    // CACHE is fine on a read-only export; write-zeroes is not.
    c.request(0, CMD_CACHE, 2, 0, 4096, &[]);
    assert_eq!(
        c.simple(),
        (0, 2),
        "commands without data get simple replies"
    );
    c.request(CMD_FLAG_FAST_ZERO, CMD_WRITE_ZEROES, 3, 0, 4096, &[]);
    assert_eq!(c.block_status_reply(3), Err(EPERM));
    c.finish();
}

#[test]
fn cache_and_fast_zero() {
    let (dev, srv) = mem_server();
    let mut c = Client::pair(&srv);
    c.go(false);
    c.request(0, CMD_CACHE, 1, 0, 1 << 20, &[]);
    assert_eq!(c.simple(), (0, 1));
    assert_eq!(dev.caches.load(Relaxed), 1);
    c.request(0, CMD_CACHE, 2, 8 * MIB - 512, 1024, &[]);
    assert_eq!(c.simple(), (EINVAL, 2));
    c.request(CMD_FLAG_NO_HOLE, CMD_CACHE, 3, 0, 512, &[]);
    assert_eq!(c.simple(), (EINVAL, 3));
    // Fast zero: done where the device can unmap, else ENOTSUP and nothing changes.
    c.request(0, CMD_WRITE, 4, 0, 1024, &[9; 1024]);
    assert_eq!(c.simple(), (0, 4));
    c.request(
        CMD_FLAG_FAST_ZERO | CMD_FLAG_NO_HOLE,
        CMD_WRITE_ZEROES,
        5,
        0,
        1024,
        &[],
    );
    assert_eq!(c.simple(), (ENOTSUP, 5));
    let mut b = [0u8; 1024];
    dev.mem.read_at(&mut b, 0).unwrap();
    assert_eq!(
        b, [9; 1024],
        "a refused fast zero leaves the range as it was"
    );
    c.request(CMD_FLAG_FAST_ZERO, CMD_WRITE_ZEROES, 6, 0, 512, &[]);
    assert_eq!(c.simple(), (0, 6));
    dev.mem.read_at(&mut b, 0).unwrap();
    assert!(b[..512].iter().all(|&x| x == 0) && b[512..].iter().all(|&x| x == 9));
    // Block status was not negotiated on this connection.
    c.request(0, CMD_BLOCK_STATUS, 7, 0, 512, &[]);
    assert_eq!(c.simple(), (EINVAL, 7));
    c.finish();
    let s = srv.stats();
    assert_eq!((s.caches, s.fast_zero_refused, s.errors), (1, 1, 3));
}
