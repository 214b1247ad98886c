//! Volumes of several segments (a LUKS2 volume mid-reencryption): every byte lands in the
//! segment that covers it, encrypted with that segment's key, IV offset and sector size, at
//! that segment's place on the storage; requests that straddle a boundary are split.

use cryptblk_crypto::{CipherSpec, IvOptions, SectorCipher};
use cryptblk_device::BlockDevice;
use cryptblk_volume::{DataSegment, MemStorage, Storage, Volume};
use proptest::prelude::*;
use std::sync::Arc;

fn cipher(spec: &str, key: u8, ss: u32, iv_offset: u64) -> SectorCipher {
    let spec = CipherSpec::parse(spec).unwrap();
    let key = vec![key; spec.default_key_len()];
    let iv = IvOptions {
        large_sectors: false,
        offset: iv_offset,
    };
    SectorCipher::new(spec, &key, ss, iv).unwrap()
}

/// What a mid-reencryption volume looks like: [new key, 4096-byte sectors][linear][old key,
/// 512-byte sectors], the last one stored after a gap (as a data shift leaves it).
/// Returns the segments' (start, len, storage offset, spec, key, sector size, iv offset).
type Layout = Vec<(u64, u64, u64, &'static str, u8, u32, u64)>;
fn layout() -> Layout {
    vec![
        (0, 48 << 10, 16 << 10, "aes-xts-plain64", 1, 4096, 0),
        (48 << 10, 16 << 10, 64 << 10, "cipher_null-ecb", 0, 512, 0),
        (
            64 << 10,
            64 << 10,
            160 << 10,
            "aes-cbc-essiv:sha256",
            2,
            512,
            128,
        ),
    ]
}

fn volume(storage: Arc<MemStorage>) -> Volume {
    let segs = layout()
        .into_iter()
        .map(|(start, len, at, spec, key, ss, ivo)| DataSegment {
            start,
            len,
            storage_offset: at,
            cipher: cipher(spec, key, ss, ivo),
            zero: false,
            integrity: None,
        })
        .collect();
    Volume::with_segments(Box::new(storage), segs, false, true).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn random_io_across_segments_matches_model_and_each_segment_cipher(
        ops in prop::collection::vec((0u64..128 << 10, 1usize..40_000, any::<u8>(), any::<bool>()), 1..24),
    ) {
        let storage = Arc::new(MemStorage::new(256 << 10));
        let vol = volume(storage.clone());
        let size = vol.size();
        prop_assert_eq!(size, 128 << 10);
        prop_assert_eq!(vol.block_size(), 4096);
        let mut model = vec![0u8; size as usize];
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
        // The storage holds each segment's plaintext under its own cipher, at its place.
        for (start, len, at, spec, key, ss, ivo) in layout() {
            let mut ct = vec![0u8; len as usize];
            storage.read_at(&mut ct, at).unwrap();
            cipher(spec, key, ss, ivo).decrypt(0, &mut ct).unwrap();
            prop_assert!(ct[..] == model[start as usize..(start + len) as usize], "segment at {}", start);
        }
    }
}

#[test]
fn requests_straddling_segments_take_one_cipher_call_per_segment_and_no_split_path() {
    let vol = volume(Arc::new(MemStorage::new(256 << 10)));
    let calls = || {
        vol.stats()
            .crypto_calls
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = calls();
    let mut buf = vec![5u8; 128 << 10];
    vol.write_at(&buf, 0, false).unwrap();
    vol.read_at(&mut buf, 0).unwrap();
    assert_eq!(
        calls() - before,
        6,
        "three segments, one call each, each way"
    );
    assert!(
        vol.split_io().is_none(),
        "the split path maps one range only"
    );
    assert_eq!(vol.segment_spans().len(), 3);
    // A discard releases each segment's own storage range (the null one's plaintext too).
    vol.discard(40 << 10, 32 << 10).unwrap();
    let mut z = vec![1u8; 8 << 10];
    vol.read_at(&mut z, 56 << 10).unwrap();
    assert!(
        z.iter().all(|&b| b == 0),
        "linear segment reads its holes as zeroes"
    );
}

#[test]
fn bad_layouts_are_refused() {
    let mk = |v: Vec<(u64, u64, u64, u32)>| {
        let segs = v
            .into_iter()
            .map(|(start, len, at, ss)| DataSegment {
                start,
                len,
                storage_offset: at,
                cipher: cipher("aes-xts-plain64", 1, ss, 0),
                zero: false,
                integrity: None,
            })
            .collect();
        Volume::with_segments(Box::new(MemStorage::new(1 << 20)), segs, false, false)
    };
    assert!(mk(vec![]).is_err(), "no segment");
    assert!(
        mk(vec![(4096, 4096, 0, 512)]).is_err(),
        "does not start at 0"
    );
    assert!(
        mk(vec![(0, 4096, 0, 512), (8192, 4096, 8192, 512)]).is_err(),
        "gap"
    );
    assert!(
        mk(vec![(0, 4096 + 512, 0, 512), (4608, 4096, 8192, 4096)]).is_err(),
        "a segment not a whole number of the largest sector size"
    );
    assert!(
        mk(vec![(0, 4096, (1 << 20) - 2048, 512)]).is_err(),
        "beyond the storage"
    );
    assert!(mk(vec![(0, 4096, 0, 512), (4096, 4096, 4096, 4096)]).is_ok());
}
