//! No copy of the volume key outlives the volume: a volume is served over NBD with real I/O,
//! then shut down and dropped, and this process's whole memory is scanned for the key.
//! While it is served, every copy found must sit in mlocked memory.
//!
//! The test never holds the key in the clear itself: it keeps it XOR-masked, unmasks it only
//! into the `SecretBytes` handed to the volume, and scans memory by masking what it reads.
//! Alone in its binary so no other test's memory is scanned.

mod common;

use std::sync::Arc;
use std::thread;

use common::{Client, Serving, xts_4096_params};
use cryptblk_crypto::SecretBytes;
use cryptblk_nbd::NbdServer;
use cryptblk_volume::{MemStorage, volume_from_key};

const MASK: u8 = 0xA5;
/// The 512-bit XTS volume key, XOR-masked with MASK.
const MASKED_KEY: [u8; 64] = [
    0x3c, 0x91, 0x0e, 0x77, 0xd2, 0x48, 0xab, 0x15, 0x63, 0xfe, 0x29, 0x84, 0x5b, 0xc0, 0x1d, 0xe6,
    0x70, 0x2f, 0x9a, 0x43, 0xb8, 0x06, 0xd5, 0x6c, 0x31, 0xef, 0x82, 0x5d, 0xa4, 0x17, 0xcb, 0x60,
    0x9e, 0x23, 0xf8, 0x45, 0x1a, 0xb7, 0x6e, 0xd1, 0x08, 0x93, 0x4c, 0xe5, 0x32, 0x7f, 0xa9, 0x54,
    0xc6, 0x0b, 0x98, 0x61, 0xfa, 0x27, 0x8d, 0x40, 0x13, 0xbe, 0x75, 0xca, 0x39, 0x86, 0x5f, 0xe0,
];

struct Region {
    start: u64,
    end: u64,
    locked: bool,
    name: String,
}

fn regions() -> Vec<Region> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut out: Vec<Region> = Vec::new();
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16))
        {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(1).is_some_and(|p| p.starts_with('r')) {
                out.push(Region {
                    start,
                    end,
                    locked: false,
                    name: f.get(5).unwrap_or(&"").to_string(),
                });
            } else {
                out.push(Region {
                    start,
                    end,
                    locked: false,
                    name: "-unreadable-".into(),
                });
            }
        } else if let Some(flags) = line.strip_prefix("VmFlags:")
            && let Some(r) = out.last_mut()
        {
            r.locked = flags.split_whitespace().any(|f| f == "lo");
        }
    }
    out.retain(|r| r.name != "-unreadable-" && r.name != "[vvar]" && r.name != "[vsyscall]");
    out
}

/// Addresses (and whether mlocked) of every 16-byte piece of the key found in memory.
fn scan() -> Vec<(u64, bool, String)> {
    let needles: Vec<[u8; 16]> = MASKED_KEY
        .chunks(16)
        .map(|c| c.try_into().unwrap())
        .collect();
    let mask = std::hint::black_box(MASK);
    let mem = std::fs::File::open("/proc/self/mem").unwrap();
    let mut found = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut scanned = 0u64;
    for r in regions() {
        let mut addr = r.start;
        while addr < r.end {
            let n = ((r.end - addr) as usize).min(buf.len());
            use std::os::unix::fs::FileExt;
            if mem.read_exact_at(&mut buf[..n], addr).is_err() {
                break; // e.g. guard pages
            }
            // Mask what was read: the comparison is between masked bytes only.
            for b in &mut buf[..n] {
                *b ^= mask;
            }
            scanned += n as u64;
            for i in 0..n.saturating_sub(15) {
                if needles.iter().any(|nd| buf[i..i + 16] == nd[..]) {
                    found.push((addr + i as u64, r.locked, r.name.clone()));
                }
            }
            // Where this process holds the *masked* key (the constant, `needles`), the masked
            // buffer now holds the key itself: wipe it before anything else is scanned.
            buf[..n].fill(0);
            std::hint::black_box(&mut buf);
            // Overlapping chunk boundaries: pieces straddling them are found from the next
            // chunk start minus 15.
            addr += (n as u64).max(16) - 15;
            if n < 16 {
                break;
            }
        }
    }
    assert!(scanned > 1 << 20, "scanned only {scanned} bytes");
    found.sort();
    found.dedup();
    found
}

#[test]
fn no_copy_of_the_volume_key_survives_the_volume() {
    let masked = std::hint::black_box(MASKED_KEY);
    let mut key = SecretBytes::zeroed(64);
    for (k, m) in key.iter_mut().zip(masked) {
        *k = m ^ MASK;
    }
    let size = 8u64 << 20;
    let params = xts_4096_params(0);
    let vol = volume_from_key(Box::new(MemStorage::new(size)), &key, &params).unwrap();
    drop(key);

    let srv = Serving::start(
        NbdServer::builder()
            .export("v", Arc::new(vol))
            .build()
            .unwrap(),
    );
    let path = srv.path.clone();
    let clients: Vec<_> = (0..3u8)
        .map(|k| {
            let path = path.clone();
            thread::spawn(move || {
                let mut c = Client::connect(&path);
                let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i as u8) ^ k).collect();
                let off = k as u64 * (2 << 20);
                assert_eq!(c.write(off, &data), 0);
                assert_eq!(c.write(off + 100, &data[..5000]), 0); // read-modify-write
                assert_eq!(c.flush(), 0);
                assert_eq!(c.read(off + 100, 5000).unwrap(), data[..5000]);
                c
            })
        })
        .collect();
    let clients: Vec<Client> = clients.into_iter().map(|t| t.join().unwrap()).collect();

    let live = scan();
    eprintln!("key pieces while serving: {live:x?}");
    assert!(
        !live.is_empty(),
        "the scan must find the key while the volume is in use, or it proves nothing"
    );
    let unlocked: Vec<_> = live.iter().filter(|(_, locked, _)| !locked).collect();
    assert!(
        unlocked.is_empty(),
        "key material outside mlocked memory while serving: {unlocked:x?}"
    );

    for c in clients {
        c.disconnect();
    }
    drop(srv.stop()); // the handle held the last references to the volume
    let after = scan();
    assert!(
        after.is_empty(),
        "key material left in memory after the volume was dropped: {after:x?}"
    );
}
