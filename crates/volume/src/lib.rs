//! An unlocked cryptblk volume (the data path): plaintext I/O with inline crypto on the
//! data segments of any volume type cryptsetup opens (LUKS1, LUKS2, plain, loop-AES,
//! TrueCrypt/VeraCrypt, BitLocker, FileVault 2), over any [`Storage`]: a file or block
//! device here, remote storage through the [`DeviceOpener`] the caller passes in
//! ([`OpenOptions::devices`]). Opening goes through [`probe`] and [`open`], one module per
//! type under `open/`; online reencryption and suspend/resume act on a serving volume.
//!
//! ```no_run
//! use cryptblk_volume::{OpenOptions, open_luks};
//! let vol = open_luks("disk.img".as_ref(), &OpenOptions::default(), b"passphrase").unwrap();
//! let mut buf = vec![0u8; 4096];
//! vol.read_sectors(0, &mut buf).unwrap();
//! ```

// Only the io_uring engine (the kernel reads and writes our buffers), the mmap engine
// (a shared mapping and its SIGBUS handler) and one scheduler call (online reencryption's
// idle-priority threads) need unsafe.
#![deny(unsafe_code)]

mod error;
mod integrity;
mod mmap;
mod online;
mod open;
mod request_metrics;
mod storage;
mod suspend;
mod uring;
mod volume;

pub use cryptblk_device::{
    DataDevice, DeviceOpener, LocalDevices, MemStorage, Partition, Storage, partition_of,
};
pub use error::{Error, Result};
pub use integrity::{Integrity, IntegrityMode, JournalKeys};
pub use online::{ONLINE_HOTZONE, reencrypt_online};
pub use open::{
    DEFAULT_INTEGRITY_ALGORITHM, Devices, FileIo, IntegrityOptions, LoopAesOptions, OpenOptions,
    Opened, Probe, Secret, Unlock, UnlockedBitlk, UnlockedFvault2, UnlockedLuks, UnlockedTcrypt,
    VolumeInfo, VolumeType, bitlk_header, fvault2_header, integrity_volume_on,
    integrity_volume_with, open, open_bitlk, open_fvault2, open_integrity, open_loopaes, open_luks,
    open_plain, open_plain_on, open_plain_with, open_tcrypt, probe, tcrypt_header, unlock_keys,
    unlock_layout, unlock_luks, volume_from_key,
};
pub use request_metrics::{LATENCY_BOUNDS, Op, OpMetrics, RequestMetrics};
pub use storage::{FileStorage, IoEngine};
pub use suspend::Suspended;
pub use volume::{CipherSummary, DataSegment, Volume, VolumeParams, VolumeStats};
