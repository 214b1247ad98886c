//! The queue's request handler, driven directly with fake requests (no kernel needed):
//! each request is served on the calling thread, in its own buffer, with exactly one
//! crypto call however many sectors it spans.

use cryptblk_crypto::{CipherSpec, IvOptions};
use cryptblk_device::BlockDevice;
use cryptblk_ublk::{
    IO_F_FUA, IO_OP_DISCARD, IO_OP_FLUSH, IO_OP_READ, IO_OP_WRITE, IO_OP_WRITE_ZEROES, IoDesc,
    handle_request,
};
use cryptblk_volume::{MemStorage, Volume, VolumeParams, volume_from_key};
use std::io;
use std::sync::Mutex;
use std::sync::atomic::Ordering::Relaxed;
use std::thread::ThreadId;

const SECTOR: u32 = 4096;

fn volume() -> Volume {
    let key: Vec<u8> = (0..64u8).collect(); // two different XTS halves
    let params = VolumeParams {
        cipher: CipherSpec::parse("aes-xts-plain64").unwrap(),
        sector_size: SECTOR,
        iv: IvOptions {
            large_sectors: true,
            offset: 0,
        },
        data_offset: 0,
        data_length: None,
        read_only: false,
        allow_discards: false,
    };
    volume_from_key(Box::new(MemStorage::new(4 << 20)), &key, &params).unwrap()
}

/// Wraps the volume and records, for each call, the thread it ran on and the FUA flag.
struct Recorder {
    vol: Volume,
    calls: Mutex<Vec<(&'static str, ThreadId, bool)>>,
}

impl Recorder {
    fn note(&self, what: &'static str, fua: bool) {
        self.calls
            .lock()
            .unwrap()
            .push((what, std::thread::current().id(), fua));
    }
}

impl BlockDevice for Recorder {
    fn size(&self) -> u64 {
        self.vol.size()
    }
    fn block_size(&self) -> u32 {
        self.vol.block_size()
    }
    fn read_only(&self) -> bool {
        self.vol.read_only()
    }
    fn can_discard(&self) -> bool {
        self.vol.can_discard()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.note("read", false);
        self.vol.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.note("write_copy", fua);
        self.vol.write_at(buf, offset, fua)
    }
    fn write_at_mut(&self, buf: &mut [u8], offset: u64, fua: bool) -> io::Result<()> {
        self.note("write_in_place", fua);
        self.vol.write_at_mut(buf, offset, fua)
    }
    fn flush(&self) -> io::Result<()> {
        self.note("flush", false);
        self.vol.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.vol.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> io::Result<()> {
        self.note("write_zeroes", false);
        self.vol.write_zeroes(offset, len, may_unmap)
    }
}

fn iod(op: u8, flags: u32, start_sector: u64, nr_sectors: u32) -> IoDesc {
    IoDesc {
        op_flags: op as u32 | flags,
        nr_sectors,
        start_sector,
        addr: 0,
    }
}

fn crypto_calls(r: &Recorder) -> u64 {
    r.vol.stats().crypto_calls.load(Relaxed)
}

#[test]
fn one_crypto_call_per_request_in_the_requests_own_buffer_on_the_calling_thread() {
    let r = Recorder {
        vol: volume(),
        calls: Mutex::new(Vec::new()),
    };
    let me = std::thread::current().id();
    // The tag's buffer, as the queue has it: max_io_buf_bytes long, request at its start.
    let mut buf = vec![0u8; 1 << 20];
    for (len, start) in [(SECTOR as usize, 0u64), (64 << 10, 8), (1 << 20, 1024)] {
        let plain: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        buf[..len].copy_from_slice(&plain);
        let before = crypto_calls(&r);
        let w = iod(IO_OP_WRITE, 0, start, (len / 512) as u32);
        assert_eq!(handle_request(&r, &w, &mut buf), len as i32);
        assert_eq!(
            crypto_calls(&r),
            before + 1,
            "{len}-byte write: one cipher call"
        );
        // Encrypted where it lay: the request's buffer now holds the ciphertext.
        assert_ne!(
            &buf[..len],
            &plain[..],
            "write encrypts in the request's buffer"
        );
        let mut raw = vec![0u8; len];
        r.vol.read_at(&mut raw, start * 512).unwrap(); // +1 call (decrypts)
        assert_eq!(raw, plain);

        buf[..len].fill(0xee);
        let before = crypto_calls(&r);
        let rd = iod(IO_OP_READ, 0, start, (len / 512) as u32);
        assert_eq!(handle_request(&r, &rd, &mut buf), len as i32);
        assert_eq!(
            crypto_calls(&r),
            before + 1,
            "{len}-byte read: one cipher call"
        );
        assert_eq!(
            &buf[..len],
            &plain[..],
            "read decrypts into the request's buffer"
        );
    }
    let calls = r.calls.lock().unwrap();
    assert!(
        calls.iter().all(|c| c.1 == me),
        "every call on the calling thread"
    );
    assert!(
        calls.iter().all(|c| c.0 != "write_copy"),
        "writes use the in-place path (no copy)"
    );
}

#[test]
fn fua_flush_write_zeroes_and_errors() {
    let r = Recorder {
        vol: volume(),
        calls: Mutex::new(Vec::new()),
    };
    let mut buf = vec![0x55u8; 64 << 10];
    let fua = iod(IO_OP_WRITE, IO_F_FUA, 0, 16);
    assert_eq!(handle_request(&r, &fua, &mut buf), 8192);
    assert_eq!(
        r.calls.lock().unwrap().last().unwrap(),
        &("write_in_place", std::thread::current().id(), true)
    );
    // A flush's start sector is meaningless (the kernel may leave anything there).
    let flush = iod(IO_OP_FLUSH, 0, u64::MAX, 0);
    assert_eq!(handle_request(&r, &flush, &mut buf), 0);
    assert_eq!(r.vol.stats().flushes.load(Relaxed), 1);
    // Write-zeroes: no data buffer; reads back as zeros.
    let z = iod(IO_OP_WRITE_ZEROES, 0, 0, 16);
    assert_eq!(handle_request(&r, &z, &mut buf), 0);
    let mut back = vec![1u8; 8192];
    r.vol.read_at(&mut back, 0).unwrap();
    assert!(back.iter().all(|&b| b == 0));
    // Discard is refused on a volume that does not allow it.
    let d = iod(IO_OP_DISCARD, 0, 0, 8);
    assert_eq!(handle_request(&r, &d, &mut buf), -libc::EOPNOTSUPP);
    // Past the end, longer than the buffer, unknown operation.
    let end = r.vol.size() / 512;
    assert_eq!(
        handle_request(&r, &iod(IO_OP_READ, 0, end, 8), &mut buf),
        -libc::EINVAL
    );
    assert_eq!(
        handle_request(&r, &iod(IO_OP_READ, 0, 0, 256), &mut buf),
        -libc::EINVAL
    );
    assert_eq!(
        handle_request(&r, &iod(99, 0, 0, 8), &mut buf),
        -libc::EOPNOTSUPP
    );
}
