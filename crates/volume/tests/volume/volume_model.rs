//! The volume against a plaintext model: every byte read equals what was last written,
//! whatever the alignment, and the ciphertext on storage is what the sector cipher makes.

use cryptblk_crypto::{CipherSpec, IvOptions, SectorCipher};
use cryptblk_device::BlockDevice;
use cryptblk_volume::{MemStorage, Storage, Volume, VolumeParams, volume_from_key};
use proptest::prelude::*;
use std::sync::Arc;

fn params(spec: &str, ss: u32, offset: u64) -> VolumeParams {
    VolumeParams {
        cipher: CipherSpec::parse(spec).unwrap(),
        sector_size: ss,
        iv: IvOptions {
            large_sectors: ss > 512,
            offset: 0,
        },
        data_offset: offset,
        data_length: None,
        read_only: false,
        allow_discards: false,
    }
}

const KEY: [u8; 64] = [7u8; 64];

fn mem_volume(spec: &str, ss: u32, size: u64) -> Volume {
    let key_len = CipherSpec::parse(spec).unwrap().default_key_len();
    volume_from_key(
        Box::new(MemStorage::new(size + 8192)),
        &KEY[..key_len],
        &params(spec, ss, 8192),
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn random_io_matches_model(
        ss in prop::sample::select(vec![512u32, 4096]),
        spec in prop::sample::select(vec!["aes-xts-plain64", "aes-cbc-essiv:sha256"]),
        ops in prop::collection::vec((0u64..60_000, 1usize..9000, any::<u8>(), any::<bool>()), 1..40),
    ) {
        let size = 64 * 1024u64;
        let vol = mem_volume(spec, ss, size);
        let mut model = vec![0u8; size as usize];
        // Start from a known state: the volume's initial plaintext is decrypted zeros.
        vol.read_at(&mut model, 0).unwrap();
        for (off, len, fill, is_write) in ops {
            let len = len.min((size - off) as usize);
            if is_write {
                let mut data: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
                model[off as usize..off as usize + len].copy_from_slice(&data);
                if fill % 2 == 0 { vol.write_at(&data, off, false).unwrap() } else { vol.write_at_mut(&mut data, off, false).unwrap() }
            } else {
                let mut got = vec![0u8; len];
                vol.read_at(&mut got, off).unwrap();
                prop_assert_eq!(&got[..], &model[off as usize..off as usize + len]);
            }
        }
        let mut all = vec![0u8; size as usize];
        vol.read_at(&mut all, 0).unwrap();
        prop_assert!(all == model);
    }
}

#[test]
fn storage_holds_exactly_the_sector_cipher_output() {
    for ss in [512u32, 4096] {
        let storage = Arc::new(MemStorage::new(1 << 20));
        let p = params("aes-xts-plain64", ss, 4096);
        let vol = volume_from_key(Box::new(storage.clone()), &KEY, &p).unwrap();
        let plain: Vec<u8> = (0..3 * ss as usize).map(|i| (i * 7) as u8).collect();
        vol.write_at(&plain, 2 * ss as u64, false).unwrap();
        let mut expect = plain.clone();
        SectorCipher::new(p.cipher, &KEY, ss, p.iv)
            .unwrap()
            .encrypt(2, &mut expect)
            .unwrap();
        let mut on_disk = vec![0u8; expect.len()];
        storage.read_at(&mut on_disk, 4096 + 2 * ss as u64).unwrap();
        assert_eq!(on_disk, expect, "sector size {ss}");
    }
}

#[test]
fn one_cipher_call_per_aligned_request() {
    let vol = mem_volume("aes-xts-plain64", 512, 1 << 20);
    let before = vol
        .stats()
        .crypto_calls
        .load(std::sync::atomic::Ordering::Relaxed);
    let mut buf = vec![1u8; 128 * 1024];
    vol.write_at(&buf, 4096, false).unwrap();
    vol.read_at(&mut buf, 4096).unwrap();
    let after = vol
        .stats()
        .crypto_calls
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        after - before,
        2,
        "256 sectors per request must take one call each way"
    );
}

#[test]
fn bounds_read_only_and_too_small() {
    let vol = mem_volume("aes-xts-plain64", 4096, 64 * 1024);
    let mut b = vec![0u8; 4096];
    assert!(vol.read_at(&mut b, 64 * 1024 - 2048).is_err());
    assert!(vol.write_at(&b, u64::MAX - 10, false).is_err());
    let mut p = params("aes-xts-plain64", 512, 8192);
    p.read_only = true;
    let ro = volume_from_key(Box::new(MemStorage::new(1 << 20)), &KEY, &p).unwrap();
    assert_eq!(
        ro.write_at(&b, 0, false).unwrap_err().kind(),
        std::io::ErrorKind::PermissionDenied
    );
    assert!(ro.discard(0, 4096).is_err(), "discards are off by default");
    p.read_only = false;
    p.data_length = Some(2 << 20);
    assert!(volume_from_key(Box::new(MemStorage::new(1 << 20)), &KEY, &p).is_err());
}

#[test]
fn write_zeroes_reads_back_zeroes() {
    let vol = mem_volume("aes-xts-plain64", 512, 1 << 20);
    vol.write_at(&vec![0xaa; 8192], 0, false).unwrap();
    vol.write_zeroes(100, 5000, true).unwrap();
    let mut b = vec![0u8; 8192];
    vol.read_at(&mut b, 0).unwrap();
    assert!(b[..100].iter().all(|&x| x == 0xaa));
    assert!(b[100..5100].iter().all(|&x| x == 0));
    assert!(b[5100..].iter().all(|&x| x == 0xaa));
}

#[test]
fn concurrent_overlapping_unaligned_writes_keep_a_consistent_model() {
    // Threads write disjoint byte ranges that share sectors; read-modify-write must not
    // lose any of them.
    let vol = Arc::new(mem_volume("aes-xts-plain64", 4096, 256 * 1024));
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let vol = vol.clone();
            std::thread::spawn(move || {
                for i in 0..200u64 {
                    let off = (i * 4 + t as u64) * 300;
                    vol.write_at(&[t + 1; 300], off, false).unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let mut all = vec![0u8; 800 * 300];
    vol.read_at(&mut all, 0).unwrap();
    for (k, chunk) in all.chunks(300).enumerate() {
        assert!(
            chunk.iter().all(|&b| b == (k % 4) as u8 + 1),
            "chunk {k} lost a write"
        );
    }
}

/// Every file engine (pread/pwrite, io_uring, mmap; page cache or O_DIRECT) stores the same
/// ciphertext for the same writes: a volume written through one reads back through another.
#[test]
fn file_engines_store_identical_ciphertext() {
    use cryptblk_volume::{FileIo, FileStorage, IoEngine};
    // Not tmpfs: O_DIRECT needs a file system that supports it (the temp dir is on disk).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let size = 4u64 << 20;
    let mut images = Vec::new();
    for (i, (engine, direct)) in [
        (IoEngine::Psync, false),
        (IoEngine::Psync, true),
        (IoEngine::Uring, false),
        (IoEngine::Uring, true),
        (IoEngine::Mmap, false),
    ]
    .into_iter()
    .enumerate()
    {
        let path = dir.path().join(format!("img{i}"));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.set_len(size + 8192).unwrap();
        let io = FileIo { engine, direct };
        let mut st = FileStorage::new(f).unwrap().with_engine(engine).unwrap();
        if direct {
            st = st.direct(4096).unwrap();
            assert!(st.is_direct());
        }
        assert_eq!(st.engine(), io.engine);
        let vol =
            volume_from_key(Box::new(st), &KEY, &params("aes-xts-plain64", 4096, 8192)).unwrap();
        // Aligned and unaligned writes, from buffers at odd addresses (O_DIRECT bounces).
        let data: Vec<u8> = (0..300_001u32).map(|x| (x * 7 + 3) as u8).collect();
        vol.write_at(&data[..262_144], 0, false).unwrap();
        vol.write_at(&data[1..], 1_000_003, true).unwrap();
        let mut odd = data[5..65_541].to_vec();
        vol.write_at_mut(&mut odd, 3 << 20, false).unwrap();
        vol.flush().unwrap();
        // Read into a buffer at an odd address too.
        let mut back = vec![0u8; data.len()];
        vol.read_at(&mut back[1..], 1_000_003).unwrap();
        assert!(back[1..] == data[1..], "{engine:?} direct={direct}");
        drop(vol);
        images.push(std::fs::read(&path).unwrap());
    }
    for (i, img) in images.iter().enumerate().skip(1) {
        assert!(img == &images[0], "engine {i} wrote different ciphertext");
    }
}

/// Requests far larger than the per-thread scratch (128 KiB), aligned and not, borrowed
/// and consumable, plus write-zeroes: they go through it in pieces and still land whole.
#[test]
fn requests_larger_than_the_thread_scratch_land_whole() {
    let size = 8u64 << 20;
    let vol = mem_volume("aes-xts-plain64", 4096, size);
    // Never-written sectors decrypt to noise: the model starts from what the volume reads.
    let mut model = vec![0u8; size as usize];
    vol.read_at(&mut model, 0).unwrap();
    let pattern = |n: usize, seed: u8| -> Vec<u8> {
        (0..n)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
            .collect()
    };
    let check = |what: &str, model: &[u8]| {
        // Read back aligned and unaligned, large.
        let mut all = vec![0u8; size as usize];
        vol.read_at(&mut all, 0).unwrap();
        assert!(all == model, "{what}: whole volume differs");
        let (off, len) = (4095usize, (3 << 20) + 17);
        let mut part = vec![0u8; len];
        vol.read_at(&mut part, off as u64).unwrap();
        assert!(
            part[..] == model[off..off + len],
            "{what}: unaligned read differs"
        );
    };
    for (off, len, seed) in [
        (0usize, 1 << 20, 1u8),
        (4096, (1 << 20) + 4096, 2),
        (777, (1 << 20) + 123, 3),
        (5000, 300_000, 4),
        (4096 * 3 + 1, 4095, 5),
    ] {
        let data = pattern(len, seed);
        vol.write_at(&data, off as u64, false).unwrap();
        model[off..off + len].copy_from_slice(&data);
        check(&format!("borrowed write {off}+{len}"), &model);
        let mut consumable = pattern(len, seed ^ 0x80);
        model[off..off + len].copy_from_slice(&consumable);
        vol.write_at_mut(&mut consumable, off as u64, false)
            .unwrap();
        check(&format!("in-place write {off}+{len}"), &model);
    }
    vol.write_zeroes(1234, (2 << 20) + 5, false).unwrap();
    model[1234..1234 + (2 << 20) + 5].fill(0);
    check("write-zeroes", &model);
}
