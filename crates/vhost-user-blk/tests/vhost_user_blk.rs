//! The vhost-user-blk backend driven by the crate's own client (the VM's part: shared
//! memfd memory, split virtqueues, eventfds) over a real socket: data, features and
//! configuration, multiqueue, reconnect, shutdown, and a hostile guest.

use cryptblk_crypto::{CipherSpec, IvOptions};
use cryptblk_device::BlockDevice;
use cryptblk_vhost_user_blk::VhostUserBlkServer;
use cryptblk_vhost_user_blk::client::{Client, ClientOptions, RawDesc, Request, kind, status};
use cryptblk_volume::{MemStorage, Volume, VolumeParams, volume_from_key};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::thread::JoinHandle;

const SECTOR: u32 = 4096;
const SIZE: u64 = 16 << 20;

fn volume(discards: bool) -> Arc<Volume> {
    let key: Vec<u8> = (0..64u8).collect();
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
        allow_discards: discards,
    };
    Arc::new(volume_from_key(Box::new(MemStorage::new(SIZE)), &key, &params).unwrap())
}

struct Served {
    path: PathBuf,
    handle: cryptblk_vhost_user_blk::ShutdownHandle,
    thread: Option<JoinHandle<std::io::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Served {
    fn stop(mut self) -> std::io::Result<()> {
        self.handle.shutdown();
        self.thread.take().unwrap().join().unwrap()
    }
}

fn serve(dev: Arc<dyn BlockDevice>, queues: u16, read_only: bool) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blk.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let server = VhostUserBlkServer::builder(dev)
        .queues(queues)
        .read_only(read_only)
        .id("0123456789abcdef0123456789")
        .build(listener)
        .unwrap();
    let handle = server.shutdown_handle();
    let thread = std::thread::spawn(move || server.run());
    Served {
        path,
        handle,
        thread: Some(thread),
        _dir: dir,
    }
}

fn connect(s: &Served, queues: u16) -> Client {
    Client::connect(
        &s.path,
        ClientOptions {
            queues,
            depth: 16,
            max_io: 1 << 20,
            event_idx: true,
        },
    )
    .unwrap()
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn data_written_by_the_guest_is_the_volumes_plaintext_on_every_queue() {
    let vol = volume(false);
    let s = serve(vol.clone(), 2, false);
    let mut c = connect(&s, 2);
    assert_eq!(c.capacity().unwrap(), SIZE);
    let cases = [
        (0u64, 4096usize),
        (8192, 131072),
        (1 << 20, 1 << 20),
        (SIZE - 4096, 4096),
    ];
    for (i, &(off, len)) in cases.iter().enumerate() {
        let q = i % 2;
        let data = pattern(len, i as u64 + 1);
        assert_eq!(c.write(q, off, &data).unwrap(), status::OK);
        let mut back = vec![0u8; len];
        assert_eq!(c.read(1 - q, off, &mut back).unwrap(), status::OK);
        assert!(back == data, "read back through the other queue at {off}");
        let mut plain = vec![0u8; len];
        vol.read_at(&mut plain, off).unwrap();
        assert!(plain == data, "the volume's plaintext at {off}");
    }
    let st = s.handle.stats();
    assert_eq!(st.writes.load(Relaxed), 4);
    assert_eq!(st.reads.load(Relaxed), 4);
    assert_eq!(st.errors.load(Relaxed), 0);
    drop(c);
    s.stop().unwrap();
}

#[test]
fn features_and_configuration_describe_the_volume() {
    let s = serve(volume(true), 3, false);
    let mut c = connect(&s, 1);
    let f = c.features;
    for (bit, name) in [
        (1, "SIZE_MAX"),
        (2, "SEG_MAX"),
        (6, "BLK_SIZE"),
        (9, "FLUSH"),
        (12, "MQ"),
        (13, "DISCARD"),
        (14, "WRITE_ZEROES"),
        (28, "INDIRECT_DESC"),
        (29, "EVENT_IDX"),
        (32, "VERSION_1"),
    ] {
        assert!(f & (1 << bit) != 0, "{name} offered");
    }
    assert!(f & (1 << 5) == 0, "not read-only");
    // QEMU asks for the whole structure; exactly that many bytes come back.
    let cfg = c.config(0, 60).unwrap();
    assert_eq!(cfg.len(), 60);
    let u32_at = |o: usize| u32::from_le_bytes(cfg[o..o + 4].try_into().unwrap());
    assert_eq!(
        u64::from_le_bytes(cfg[0..8].try_into().unwrap()),
        SIZE / 512
    );
    assert_eq!(u32_at(8), 256 << 10, "size_max");
    assert_eq!(u32_at(12), 126, "seg_max");
    // SeaBIOS's blocks per request, u16(size_max * seg_max / 512), must not wrap to 0.
    assert!(u64::from(u32_at(8)) * u64::from(u32_at(12)) / 512 < 65536);
    assert_eq!(u32_at(20), SECTOR, "blk_size");
    assert_eq!(cfg[24], 3, "physical_block_exp: 4096 = 512 << 3");
    assert_eq!(u16::from_le_bytes([cfg[34], cfg[35]]), 3, "num_queues");
    assert!(u32_at(36) > 0, "max_discard_sectors");
    assert_eq!(cfg[56], 1, "write_zeroes_may_unmap");
    // GET_ID: the first 20 bytes of the id.
    let area = c.slot_data(0, 0);
    assert_eq!(
        c.one(
            0,
            Request {
                kind: kind::GET_ID,
                sector: 0,
                len: 20
            }
        )
        .unwrap(),
        status::OK
    );
    let mut id = [0u8; 20];
    c.read_mem(area, &mut id).unwrap();
    assert_eq!(&id, b"0123456789abcdef0123");
    drop(c);
    s.stop().unwrap();
}

fn dwz(c: &mut Client, k: u32, sector: u64, count: u32, flags: u32) -> u8 {
    let mut seg = [0u8; 16];
    seg[0..8].copy_from_slice(&sector.to_le_bytes());
    seg[8..12].copy_from_slice(&count.to_le_bytes());
    seg[12..16].copy_from_slice(&flags.to_le_bytes());
    c.write_mem(c.slot_data(0, 0), &seg).unwrap();
    c.one(
        0,
        Request {
            kind: k,
            sector: 0,
            len: 16,
        },
    )
    .unwrap()
}

#[test]
fn flush_write_zeroes_and_discard() {
    let vol = volume(false);
    let s = serve(vol.clone(), 1, false);
    let mut c = connect(&s, 1);
    assert!(
        c.features & (1 << 13) == 0,
        "no DISCARD on a volume that refuses discards"
    );
    c.write(0, 0, &pattern(65536, 9)).unwrap();
    assert_eq!(
        c.one(
            0,
            Request {
                kind: kind::FLUSH,
                sector: 0,
                len: 0
            }
        )
        .unwrap(),
        status::OK
    );
    assert_eq!(s.handle.stats().flushes.load(Relaxed), 1);
    assert_eq!(dwz(&mut c, kind::WRITE_ZEROES, 8, 16, 0), status::OK);
    let mut back = vec![1u8; 65536];
    c.read(0, 0, &mut back).unwrap();
    assert!(back[4096..12288].iter().all(|&b| b == 0), "zeroed");
    assert!(back[..4096] == pattern(65536, 9)[..4096], "the rest kept");
    assert_eq!(dwz(&mut c, kind::DISCARD, 0, 8, 0), status::UNSUPP);
    drop(c);
    s.stop().unwrap();

    let vol = volume(true);
    let s = serve(vol.clone(), 1, false);
    let mut c = connect(&s, 1);
    c.write(0, 0, &pattern(8192, 3)).unwrap();
    assert_eq!(dwz(&mut c, kind::DISCARD, 0, 8, 0), status::OK);
    assert_eq!(
        dwz(&mut c, kind::DISCARD, 0, 8, 1),
        status::IOERR,
        "discard takes no flags"
    );
    assert_eq!(s.handle.stats().discards.load(Relaxed), 1);
    drop(c);
    s.stop().unwrap();
}

#[test]
fn a_read_only_volume_refuses_writes() {
    let vol = volume(true);
    vol.write_at(&pattern(4096, 5), 0, false).unwrap();
    let s = serve(vol.clone(), 1, true);
    let mut c = connect(&s, 1);
    assert!(c.features & (1 << 5) != 0, "VIRTIO_BLK_F_RO");
    assert!(
        c.features & ((1 << 13) | (1 << 14)) == 0,
        "no discard, no write-zeroes"
    );
    assert_eq!(c.write(0, 0, &[0u8; 4096]).unwrap(), status::IOERR);
    assert_eq!(dwz(&mut c, kind::WRITE_ZEROES, 0, 8, 0), status::IOERR);
    let mut back = vec![0u8; 4096];
    assert_eq!(c.read(0, 0, &mut back).unwrap(), status::OK);
    assert_eq!(back, pattern(4096, 5));
    drop(c);
    s.stop().unwrap();
}

#[test]
fn many_requests_in_flight_complete_and_a_reconnect_sees_the_data() {
    let s = serve(volume(false), 1, false);
    let mut c = connect(&s, 1);
    let reqs: Vec<(u16, Request)> = (0..16u16)
        .map(|slot| {
            c.write_mem(c.slot_data(0, slot), &pattern(65536, u64::from(slot)))
                .unwrap();
            (
                slot,
                Request {
                    kind: kind::OUT,
                    sector: u64::from(slot) * 128,
                    len: 65536,
                },
            )
        })
        .collect();
    c.submit(0, &reqs).unwrap();
    let mut done = Vec::new();
    while done.len() < 16 {
        done.extend(c.wait(0).unwrap());
    }
    assert!(done.iter().all(|d| d.status == status::OK));
    // Completed in the order they were made available (what reconnect relies on).
    let order: Vec<u16> = done.iter().map(|d| d.slot).collect();
    assert_eq!(order, (0..16).collect::<Vec<_>>());
    drop(c);

    // The VM goes away and comes back (QEMU's reconnect): a fresh device state.
    let mut c = Client::connect(
        &s.path,
        ClientOptions {
            event_idx: false,
            ..ClientOptions::default()
        },
    )
    .unwrap();
    for slot in 0..16u16 {
        let mut back = vec![0u8; 65536];
        assert_eq!(
            c.read(0, u64::from(slot) * 65536, &mut back).unwrap(),
            status::OK
        );
        assert!(back == pattern(65536, u64::from(slot)), "slot {slot}");
    }
    assert_eq!(s.handle.stats().connections_total.load(Relaxed), 2);
    drop(c);
    s.stop().unwrap();
}

#[test]
fn shutdown_detaches_a_connected_guest() {
    let s = serve(volume(false), 1, false);
    let mut c = connect(&s, 1);
    c.write(0, 0, &pattern(4096, 1)).unwrap();
    assert_eq!(s.handle.stats().connected.load(Relaxed), 1);
    s.stop().unwrap();
    drop(c);
}

const NEXT: u16 = 1;
const WRITE: u16 = 2;
const INDIRECT: u16 = 4;

fn header(c: &Client, kind: u32, sector: u64) -> u64 {
    let area = c.slot_area(0, 0);
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    c.write_mem(area, &h).unwrap();
    c.write_mem(area + 16, &[0xff]).unwrap();
    area
}

fn raw(c: &mut Client, descs: &[RawDesc]) -> (u8, u32) {
    c.submit_raw(0, 0, descs, 0).unwrap();
    let mut done = Vec::new();
    while done.is_empty() {
        done = c.wait(0).unwrap();
    }
    let mut st = [0u8];
    c.read_mem(c.slot_area(0, 0) + 16, &mut st).unwrap();
    (st[0], done[0].len)
}

fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDesc {
    RawDesc {
        addr,
        len,
        flags,
        next,
    }
}

#[test]
fn a_hostile_guest_gets_errors_and_the_backend_carries_on() {
    let vol = volume(false);
    let s = serve(vol.clone(), 1, false);
    let mut c = connect(&s, 1);
    let outside = c.mem_size() + (1 << 20);
    let mut before = vec![0u8; 1 << 20];
    vol.read_at(&mut before, 0).unwrap();
    let mut end_before = vec![0u8; 4096];
    vol.read_at(&mut end_before, SIZE - 4096).unwrap();

    // Each case: a header (kind, sector, whether it is in device-writable memory), a data
    // descriptor (offset from the slot's area, or an absolute address; length; flags; None:
    // no data), where the status byte is, and what must come back: a status, or (no
    // status byte to write) a used length of 0.
    enum At {
        Slot(u64),
        Abs(u64),
    }
    enum Expect {
        Status(u8),
        NothingWritten,
    }
    use At::{Abs, Slot};
    use Expect::{NothingWritten, Status};
    type Case = (
        &'static str,
        u32,
        u64,
        bool,
        Option<(At, u32, u16)>,
        At,
        Expect,
    );
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        ("data outside guest memory", kind::IN, 0, false, Some((Abs(outside), 4096, WRITE)), Slot(16), Status(status::IOERR)),
        ("status byte outside guest memory", kind::IN, 0, false, Some((Slot(4096), 4096, WRITE)), Abs(outside), NothingWritten),
        ("header in device-writable memory", kind::IN, 0, true, Some((Slot(4096), 4096, WRITE)), Slot(16), Status(status::IOERR)),
        ("a read into memory the device may not write", kind::IN, 0, false, Some((Slot(4096), 4096, 0)), Slot(16), Status(status::IOERR)),
        ("sector 2^63 (its byte offset overflows)", kind::IN, 1 << 63, false, Some((Slot(4096), 4096, WRITE)), Slot(16), Status(status::IOERR)),
        ("past the end", kind::OUT, SIZE / 512 - 4, false, Some((Slot(4096), 4096, 0)), Slot(16), Status(status::IOERR)),
        ("not on a 4096-byte sector", kind::OUT, 1, false, Some((Slot(4096), 4096, 0)), Slot(16), Status(status::IOERR)),
        ("not whole 4096-byte sectors", kind::OUT, 0, false, Some((Slot(4096), 512, 0)), Slot(16), Status(status::IOERR)),
        ("129 MiB in one request (over seg_max * size_max)", kind::OUT, 0, false, Some((Abs(0), 129 << 20, 0)), Slot(16), Status(status::IOERR)),
        ("an unknown request type", 77, 0, false, None, Slot(16), Status(status::UNSUPP)),
    ];
    for (what, k, sector, hdr_writable, data, status_at, expect) in cases {
        let a = header(&c, k, sector);
        let at = |x: &At| match *x {
            Slot(off) => a + off,
            Abs(addr) => addr,
        };
        let mut descs = vec![d(a, 16, NEXT | if hdr_writable { WRITE } else { 0 }, 1)];
        if let Some((addr, len, flags)) = &data {
            descs.push(d(at(addr), *len, flags | NEXT, 2));
        }
        let next = descs.len() as u16;
        descs[next as usize - 1].next = next;
        descs.push(d(at(&status_at), 1, WRITE, 0));
        let (st, len) = raw(&mut c, &descs);
        match expect {
            Status(want) => assert_eq!(st, want, "{what}"),
            NothingWritten => assert_eq!(len, 0, "{what}"),
        }
    }
    // Chains that end early: a loop, a next index past the table.
    for (what, next) in [
        ("a loop in the chain", 0u16),
        ("a next index past the table", 40000),
    ] {
        let a = header(&c, kind::IN, 0);
        let descs = [
            d(a, 16, NEXT, 1),
            d(a + 4096, 4096, WRITE | NEXT, next),
            d(a + 16, 1, WRITE, 0),
        ];
        assert_eq!(raw(&mut c, &descs).1, 0, "{what}");
    }
    // A nested indirect table.
    let a = header(&c, kind::IN, 0);
    let table = a + 8192;
    let t = table_bytes(&[d(table, 16, INDIRECT, 0)]);
    c.write_mem(table, &t).unwrap();
    assert_eq!(raw(&mut c, &[d(table, 16, INDIRECT, 0)]).1, 0);
    // Nothing was written, and the device still serves honest requests.
    let mut after = vec![0u8; 1 << 20];
    vol.read_at(&mut after, 0).unwrap();
    assert!(after == before, "no refused request wrote anything");
    vol.read_at(&mut after[..4096], SIZE - 4096).unwrap();
    assert!(after[..4096] == end_before[..], "nor past the end");
    let data = pattern(8192, 42);
    assert_eq!(c.write(0, 0, &data).unwrap(), status::OK);
    let mut back = vec![0u8; 8192];
    assert_eq!(c.read(0, 0, &mut back).unwrap(), status::OK);
    assert_eq!(back, data);
    assert!(s.handle.stats().errors.load(Relaxed) >= 12);
    drop(c);
    s.stop().unwrap();
}

#[test]
fn indirect_descriptor_tables_are_followed() {
    let vol = volume(false);
    let s = serve(vol.clone(), 1, false);
    let mut c = connect(&s, 1);
    let data = pattern(8192, 7);
    let a = header(&c, kind::OUT, 16);
    c.write_mem(a + 4096, &data).unwrap();
    let table = a + 4096 + 16384;
    // Header, data in two pieces, status.
    let t = table_bytes(&[
        d(a, 16, NEXT, 1),
        d(a + 4096, 4096, NEXT, 2),
        d(a + 8192, 4096, NEXT, 3),
        d(a + 16, 1, WRITE, 0),
    ]);
    c.write_mem(table, &t).unwrap();
    assert_eq!(raw(&mut c, &[d(table, 64, INDIRECT, 0)]).0, status::OK);
    let mut plain = vec![0u8; 8192];
    vol.read_at(&mut plain, 16 * 512).unwrap();
    assert_eq!(plain, data);
    drop(c);
    s.stop().unwrap();
}

/// Descriptors as an indirect table in guest memory holds them.
fn table_bytes(descs: &[RawDesc]) -> Vec<u8> {
    let mut t = Vec::new();
    for e in descs {
        t.extend_from_slice(&e.addr.to_le_bytes());
        t.extend_from_slice(&e.len.to_le_bytes());
        t.extend_from_slice(&e.flags.to_le_bytes());
        t.extend_from_slice(&e.next.to_le_bytes());
    }
    t
}
