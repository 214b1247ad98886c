//! Backend failures through the real stack: an encrypted `Volume` whose storage fails with
//! EIO on chosen ranges, served by `NbdServer`, driven by a client over a Unix socket.

use std::io;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::common::{Client, Serving, xts_4096_params};
use cryptblk_nbd::NbdServer;
use cryptblk_volume::{MemStorage, Storage, volume_from_key};

const EIO: u32 = 5;
const DATA_OFFSET: u64 = 1 << 20;

/// Storage that fails with EIO on byte ranges of the backing store (reads, writes or both).
struct Faulty {
    inner: MemStorage,
    bad_reads: Mutex<Vec<Range<u64>>>,
    bad_writes: Mutex<Vec<Range<u64>>>,
    bad_sync: Mutex<bool>,
}

fn hits(bad: &Mutex<Vec<Range<u64>>>, offset: u64, len: usize) -> bool {
    let end = offset + len as u64;
    bad.lock()
        .unwrap()
        .iter()
        .any(|r| r.start < end && offset < r.end)
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(EIO as i32)
}

/// The volume owns its storage; the test keeps a second handle to flip the faults.
struct Shared(Arc<Faulty>);

impl std::ops::Deref for Shared {
    type Target = Faulty;
    fn deref(&self) -> &Faulty {
        &self.0
    }
}

impl Storage for Shared {
    fn size(&self) -> io::Result<u64> {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if hits(&self.bad_reads, offset, buf.len()) {
            return Err(eio());
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if hits(&self.bad_writes, offset, buf.len()) {
            return Err(eio());
        }
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        if *self.bad_sync.lock().unwrap() {
            return Err(eio());
        }
        self.inner.sync()
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.punch_hole(offset, len)
    }
}

#[test]
fn eio_from_the_storage_reaches_the_client_and_the_server_keeps_serving() {
    let size = 16u64 << 20;
    let faulty = Arc::new(Faulty {
        inner: MemStorage::new(DATA_OFFSET + size),
        bad_reads: Mutex::new(Vec::new()),
        bad_writes: Mutex::new(Vec::new()),
        bad_sync: Mutex::new(false),
    });
    let params = xts_4096_params(DATA_OFFSET);
    let key: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5c).collect();
    let vol = volume_from_key(Box::new(Shared(faulty.clone())), &key, &params).unwrap();
    let srv = Serving::start(
        NbdServer::builder()
            .export("v", Arc::new(vol))
            .build()
            .unwrap(),
    );
    let path = srv.path.clone();

    let mut c = Client::connect(&path);
    assert_eq!(c.size, size);
    let good: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 251) as u8).collect();
    assert_eq!(c.write(0, &good), 0);
    assert_eq!(c.flush(), 0);

    // Plaintext [1 MiB, 1 MiB + 8 KiB) sits on storage bytes DATA_OFFSET + that.
    let bad = (1u64 << 20)..(1u64 << 20) + 8192;
    let on_disk = |r: &Range<u64>| DATA_OFFSET + r.start..DATA_OFFSET + r.end;
    faulty.bad_reads.lock().unwrap().push(on_disk(&bad));
    faulty.bad_writes.lock().unwrap().push(on_disk(&bad));

    // Reads touching the bad range fail with EIO, whole or partial, aligned or not.
    assert_eq!(c.read(bad.start, 4096), Err(EIO));
    assert_eq!(c.read(bad.start - 4096, 3 * 4096), Err(EIO));
    assert_eq!(c.read(bad.end - 100, 200), Err(EIO));
    // Writes too, including a read-modify-write of a partial sector next to it.
    assert_eq!(c.write(bad.start + 4096, &[7; 4096]), EIO);
    assert_eq!(c.write(bad.start + 10, &[7; 100]), EIO);
    // Ranges right next to it are fine, on the same connection.
    let before = (bad.start - 4096) as usize;
    assert!(c.read(bad.start - 4096, 4096).unwrap() == good[before..before + 4096]);
    let after = bad.end as usize;
    assert!(c.read(bad.end, 8192).unwrap() == good[after..after + 8192]);
    assert_eq!(c.write(bad.end, &[9; 4096]), 0);
    assert_eq!(c.read(bad.end, 4096).unwrap(), vec![9; 4096]);

    // A failing flush is an error too; the next one succeeds once the device recovers.
    *faulty.bad_sync.lock().unwrap() = true;
    assert_eq!(c.flush(), EIO);
    *faulty.bad_sync.lock().unwrap() = false;
    assert_eq!(c.flush(), 0);

    // Other connections were never disturbed, and the server still accepts new ones.
    let mut other = Client::connect(&path);
    assert!(other.read(0, 65536).unwrap() == good[..65536]);
    assert_eq!(other.read(bad.start, 4096), Err(EIO));

    // The device heals: the range that failed still holds what was written before the
    // failures (the failed writes changed nothing).
    faulty.bad_reads.lock().unwrap().clear();
    faulty.bad_writes.lock().unwrap().clear();
    let b = bad.start as usize;
    assert!(c.read(bad.start, 8192).unwrap() == good[b..b + 8192]);

    let st = srv.handle.stats();
    assert_eq!(st.errors, 7, "{st:?}");
    assert_eq!(st.protocol_errors, 0);
    assert_eq!(st.connections_active, 2);
    c.disconnect();
    other.disconnect();
    srv.stop();
}
