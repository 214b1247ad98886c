//! The split data path (frontend does the storage I/O, the volume the crypto) gives the same
//! bytes as the inline one, with one cipher call per request.

use cryptblk_crypto::{CipherSpec, IvOptions};
use cryptblk_device::BlockDevice;
use cryptblk_volume::{FileStorage, MemStorage, VolumeParams, volume_from_key};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering::Relaxed;

fn params(read_only: bool) -> VolumeParams {
    VolumeParams {
        cipher: CipherSpec::parse("aes-xts-plain64").unwrap(),
        sector_size: 4096,
        iv: IvOptions {
            large_sectors: true,
            offset: 0,
        },
        data_offset: 8192,
        data_length: None,
        read_only,
        allow_discards: false,
    }
}

#[test]
fn split_path_matches_inline_path() {
    let f = tempfile::tempfile().unwrap();
    f.set_len(1 << 20).unwrap();
    let file = f.try_clone().unwrap();
    let key: Vec<u8> = (0..64u8).collect();
    let vol =
        volume_from_key(Box::new(FileStorage::new(f).unwrap()), &key, &params(false)).unwrap();
    let split = vol.split_io().expect("file storage splits");
    let calls = || vol.stats().crypto_calls.load(Relaxed);

    // Split write, inline read.
    let plain: Vec<u8> = (0..32768u32).map(|i| (i * 13) as u8).collect();
    let mut buf = plain.clone();
    let at = split.map(4096, buf.len() as u64, true).unwrap();
    assert_eq!(at, 8192 + 4096);
    let c = calls();
    split.seal(4096, &mut buf).unwrap();
    assert_eq!(calls(), c + 1);
    assert_ne!(buf, plain);
    file.write_all_at(&buf, at).unwrap();
    let mut back = vec![0u8; plain.len()];
    vol.read_at(&mut back, 4096).unwrap();
    assert_eq!(back, plain);

    // Inline write, split read.
    vol.write_at(&plain[..8192], 65536, false).unwrap();
    let mut raw = vec![0u8; 8192];
    file.read_exact_at(&mut raw, split.map(65536, 8192, false).unwrap())
        .unwrap();
    let c = calls();
    split.unseal(65536, &mut raw).unwrap();
    assert_eq!(calls(), c + 1);
    assert_eq!(raw, &plain[..8192]);

    // Whole sectors only, inside the volume.
    assert!(split.map(100, 4096, false).is_err());
    assert!(split.map(0, 4000, false).is_err());
    assert!(split.map(vol.size(), 4096, false).is_err());
}

#[test]
fn read_only_refuses_split_writes_and_memory_does_not_split() {
    let f = tempfile::tempfile().unwrap();
    f.set_len(1 << 20).unwrap();
    let key: Vec<u8> = (0..64u8).collect();
    let vol = volume_from_key(Box::new(FileStorage::new(f).unwrap()), &key, &params(true)).unwrap();
    let split = vol.split_io().unwrap();
    assert!(split.map(0, 4096, true).is_err());
    assert!(split.seal(0, &mut [0u8; 4096]).is_err());
    assert!(split.map(0, 4096, false).is_ok());

    let mem = volume_from_key(Box::new(MemStorage::new(1 << 20)), &key, &params(false)).unwrap();
    assert!(mem.split_io().is_none());
}
