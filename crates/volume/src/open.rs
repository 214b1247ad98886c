//! Opening volumes: LUKS, TrueCrypt/VeraCrypt, BitLocker and FileVault 2 (unlock with a passphrase) or a raw key
//! (plain mode, tests).

use crate::storage::{FileStorage, IoEngine, Storage};
use crate::{DataSegment, Error, Result, Volume, VolumeParams};
use cryptblk_crypto::SectorCipher;
use cryptblk_device::{DataDevice, DeviceOpener, LocalDevices};
use cryptblk_format::bitlk::BitlkHeader;
use cryptblk_format::fvault2::Fvault2Header;
use cryptblk_format::tcrypt::{TcryptHeader, TcryptOptions};
use cryptblk_format::{LuksHeader, SegmentKey, load_header};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How to open a volume.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Who opens the DEVICE (and header) arguments: local files and block devices unless
    /// told otherwise (`cryptblk_storage::Devices` adds NBD exports and RBD images).
    pub devices: Devices,
    /// Detached header file.
    pub header: Option<PathBuf>,
    /// Open the data file read-only (under a shared lock); the volume then refuses writes,
    /// write-zeroes and discards.
    pub read_only: bool,
    /// dm-crypt's `allow_discards`: pass discards down as hole punches (reveals which
    /// sectors are unused; off by default).
    pub allow_discards: bool,
    /// Only try this keyslot.
    pub key_slot: Option<u32>,
    /// How the data file is read and written.
    pub io: FileIo,
}

/// The [`DeviceOpener`] a volume's devices are opened with (local files by default).
#[derive(Clone)]
pub struct Devices(pub Arc<dyn DeviceOpener>);

impl Default for Devices {
    fn default() -> Self {
        Devices(Arc::new(LocalDevices))
    }
}

impl std::fmt::Debug for Devices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Devices")
    }
}

impl Devices {
    /// The data device `path` names, locked (shared when `read_only`).
    pub fn open(&self, path: &Path, read_only: bool) -> Result<DataDevice> {
        self.0.open(path, read_only).map_err(busy)
    }
    /// A detached header `path` names (a local file is not locked: a header command that
    /// writes it takes its own lock).
    pub fn open_header(&self, path: &Path, read_only: bool) -> Result<DataDevice> {
        self.0.open_header(path, read_only).map_err(busy)
    }
}

/// A device another process holds, as [`Error::Busy`].
fn busy(e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::ResourceBusy {
        Error::Busy(
            e.to_string()
                .trim_end_matches(" is in use by another process")
                .to_string(),
        )
    } else {
        Error::Io(e)
    }
}

/// How the data file is read and written.
#[derive(Debug, Clone, Copy, Default)]
pub struct FileIo {
    /// auto (mmap on tmpfs/ramfs, else pread/pwrite), pread/pwrite, io_uring or mmap.
    pub engine: IoEngine,
    /// O_DIRECT (bypass the page cache); an error if the file system cannot.
    pub direct: bool,
}

impl FileIo {
    /// The data path's storage on `data`: a file with this engine and O_DIRECT choice, or a
    /// remote export as it is (engines and O_DIRECT are about local files).
    fn storage(&self, data: DataDevice, sector_size: u32) -> Result<Box<dyn Storage>> {
        let file = match data {
            DataDevice::File(f) => f.try_clone()?,
            DataDevice::Remote(r) => {
                if self.direct || self.engine != IoEngine::Auto {
                    return Err(Error::Invalid(format!(
                        "{}: --io-engine and --direct apply to local files only",
                        r.describe()
                    )));
                }
                return Ok(Box::new(r));
            }
        };
        let mut st = FileStorage::new(file)?;
        if self.direct {
            st = st.direct(sector_size)?;
        }
        Ok(Box::new(st.with_engine(self.engine)?))
    }
}

/// An unlocked LUKS volume with the header it came from.
pub struct UnlockedLuks {
    /// The volume, ready for I/O.
    pub volume: Volume,
    /// The LUKS1/LUKS2 header, as loaded from the data device or the detached header.
    pub header: Box<dyn LuksHeader>,
    /// Number of the keyslot the passphrase opened.
    pub keyslot: u32,
    /// Where the header lives, open read-write unless the volume is read-only (the data
    /// device, under the same lock, or the detached header): for a reencryption run while
    /// the volume serves.
    pub header_file: DataDevice,
}

/// Unlocks a LUKS1/LUKS2 volume with `passphrase` and binds it to its data device.
pub fn open_luks(device: &Path, opts: &OpenOptions, passphrase: &[u8]) -> Result<Volume> {
    unlock_luks(device, opts, passphrase).map(|u| u.volume)
}

/// A reencryption step cut off by a crash leaves data that cannot be read until its hot
/// zone is recovered. cryptsetup recovers it whenever it activates the volume, read-only
/// included; so does a read-only open here: the device (and a detached header) are opened
/// read-write just for the recovery, under the exclusive lock, and closed again. Without
/// write access the error says what to run.
fn recover_for_reading(device: &Path, opts: &OpenOptions, passphrase: &[u8]) -> Result<()> {
    {
        let data = opts.devices.open(device, true)?;
        let mut hdev = match &opts.header {
            Some(h) => opts.devices.open_header(h, true)?,
            None => data.clone(),
        };
        if !load_header(&mut hdev)?.interrupted_step() {
            return Ok(());
        }
    }
    let needs_write = |e: Error| match e {
        Error::Io(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            Error::Invalid(format!(
                "a reencryption step was interrupted on {}: recovering it needs write access \
                 (`cryptblk repair` as a user who may write it, or open it read-write)",
                device.display()
            ))
        }
        e => e,
    };
    let data = opts.devices.open(device, false).map_err(needs_write)?;
    let mut hdev = match &opts.header {
        Some(h) => opts.devices.open_header(h, false).map_err(needs_write)?,
        None => data.clone(),
    };
    let mut header = load_header(&mut hdev)?;
    let size = data.size()?;
    header.recover_interrupted_step(&mut hdev, &data, passphrase, opts.key_slot, size)?;
    Ok(())
}

/// Like [`open_luks`], also returning the header and the keyslot that opened it.
pub fn unlock_luks(device: &Path, opts: &OpenOptions, passphrase: &[u8]) -> Result<UnlockedLuks> {
    if opts.read_only {
        recover_for_reading(device, opts, passphrase)?;
    }
    let data = opts.devices.open(device, opts.read_only)?;
    let mut hdev = match &opts.header {
        // Read-write only where a crashed reencryption step may have to be recovered.
        Some(h) => opts.devices.open_header(h, opts.read_only)?,
        None => data.clone(),
    };
    let mut header = load_header(&mut hdev)?;
    let data_size = data.size()?;
    if !opts.read_only {
        // A reencryption step cut off by a crash is finished first, as cryptsetup does on
        // activation (a read-only open refuses such a volume instead).
        header.recover_interrupted_step(&mut hdev, &data, passphrase, opts.key_slot, data_size)?;
    }
    let (keyslot, mut segments) =
        header.unlock_segments(&mut hdev, passphrase, opts.key_slot, data_size)?;
    let volume = if let [one] = segments.as_slice() {
        let params = VolumeParams {
            cipher: one.cipher,
            sector_size: one.sector_size,
            iv: one.iv,
            data_offset: one.storage_offset,
            // The layout's own length (mid-reencryption the header's segment is the
            // final layout's, not the data's).
            data_length: if header.data_length().is_some() || header.in_reencryption() {
                Some(one.len)
            } else {
                None
            },
            read_only: opts.read_only,
            allow_discards: opts.allow_discards,
        };
        let storage = opts.io.storage(data, params.sector_size)?;
        volume_from_key(storage, &one.key, &params)?
    } else {
        // A LUKS2 volume mid-reencryption: one cipher per stretch of the data.
        let largest = segments.iter().map(|s| s.sector_size).max().unwrap_or(512);
        let storage = opts.io.storage(data, largest)?;
        let parts = segments
            .drain(..)
            .map(data_segment)
            .collect::<Result<Vec<_>>>()?;
        Volume::with_segments(storage, parts, opts.read_only, opts.allow_discards)?
    };
    Ok(UnlockedLuks {
        volume,
        header,
        keyslot,
        header_file: hdev,
    })
}

/// The layout a volume serves, unlocked again from its header (`luksResume`): each
/// segment keyed with what `passphrase` opens.
pub fn unlock_layout(
    header: &dyn LuksHeader,
    dev: &mut dyn cryptblk_format::Storage,
    passphrase: &[u8],
    slot: Option<u32>,
    data_size: u64,
) -> Result<Vec<DataSegment>> {
    let (_, segments) = header.unlock_segments(dev, passphrase, slot, data_size)?;
    segments.into_iter().map(data_segment).collect()
}

/// A header's unlocked segment as the volume serves it.
pub(crate) fn data_segment(s: SegmentKey) -> Result<DataSegment> {
    Ok(DataSegment {
        start: s.start,
        len: s.len,
        storage_offset: s.storage_offset,
        cipher: SectorCipher::new(s.cipher, &s.key, s.sector_size, s.iv)?,
        zero: false,
    })
}

/// A volume from a raw volume key (plain mode, memory volumes, tests).
pub fn volume_from_key(
    storage: Box<dyn Storage>,
    key: &[u8],
    params: &VolumeParams,
) -> Result<Volume> {
    let cipher = SectorCipher::new(params.cipher, key, params.sector_size, params.iv)?;
    Volume::new(storage, cipher, params)
}

/// Opens a plain dm-crypt mapping of `device` with an already derived key.
pub fn open_plain(device: &Path, key: &[u8], params: &VolumeParams) -> Result<Volume> {
    open_plain_with(device, key, params, FileIo::default())
}

/// [`open_plain`] with a choice of I/O engine and O_DIRECT (a local file or block device).
pub fn open_plain_with(
    device: &Path,
    key: &[u8],
    params: &VolumeParams,
    io: FileIo,
) -> Result<Volume> {
    let data = Devices::default().open(device, params.read_only)?;
    open_plain_on(data, key, params, io)
}

/// A plain dm-crypt mapping of the opened device `data` with an already derived key.
pub fn open_plain_on(
    data: DataDevice,
    key: &[u8],
    params: &VolumeParams,
    io: FileIo,
) -> Result<Volume> {
    let storage = io.storage(data, params.sector_size)?;
    volume_from_key(storage, key, params)
}

/// An unlocked TrueCrypt/VeraCrypt volume with its decrypted header.
pub struct UnlockedTcrypt {
    /// The volume, ready for I/O.
    pub volume: Volume,
    /// The header that opened it (for `status` and `tcryptDump`).
    pub header: TcryptHeader,
    /// Where the data starts, in 512-byte sectors.
    pub data_offset: u64,
}

/// Decrypts the TrueCrypt/VeraCrypt header of `data` (or of the header file `header`)
/// without mapping anything (`test-passphrase`, `tcryptDump`).
pub fn tcrypt_header(
    data: &DataDevice,
    header: Option<&Path>,
    devices: &Devices,
    tc: &TcryptOptions,
    passphrase: &[u8],
) -> Result<TcryptHeader> {
    let dev = match header {
        Some(h) => devices.open_header(h, true)?,
        None => data.clone(),
    };
    let size = dev.size()?;
    Ok(TcryptHeader::open(&dev, size, tc, passphrase)?)
}

/// Unlocks a TrueCrypt/VeraCrypt volume (`cryptsetup open --type tcrypt`): the header
/// `tc` selects (outer, hidden, system, backup; from `opts.header` if given) opened with
/// `passphrase` and `tc`'s keyfiles, the data mapped where cryptsetup maps it.
pub fn open_tcrypt(
    device: &Path,
    opts: &OpenOptions,
    tc: &TcryptOptions,
    passphrase: &[u8],
) -> Result<UnlockedTcrypt> {
    let data = opts.devices.open(device, opts.read_only)?;
    let data_size = data.size()?;
    let header = match &opts.header {
        Some(h) => {
            let f = opts.devices.open_header(h, true)?;
            let size = f.size()?;
            TcryptHeader::open(&f, size, tc, passphrase)?
        }
        None => TcryptHeader::open(&data, data_size, tc, passphrase)?,
    };
    let offset = header.data_offset(tc, data_size);
    let cipher = header.sector_cipher(header.iv_offset(tc, data_size))?;
    let params = VolumeParams {
        cipher: *cipher.spec(),
        sector_size: cipher.sector_size(),
        iv: cipher.iv_options(),
        data_offset: offset * 512,
        data_length: Some(header.data_len(tc, data_size)),
        read_only: opts.read_only,
        allow_discards: opts.allow_discards,
    };
    let storage = opts.io.storage(data, params.sector_size)?;
    let volume = Volume::new(storage, cipher, &params)?;
    Ok(UnlockedTcrypt {
        volume,
        header,
        data_offset: offset,
    })
}

/// An unlocked BitLocker volume and the metadata that opened it.
pub struct UnlockedBitlk {
    /// The volume, ready for I/O: the whole device as cryptsetup maps it.
    pub volume: Volume,
    /// The metadata (for `status` and `bitlkDump`).
    pub header: BitlkHeader,
}

/// Reads the BitLocker metadata of `device` without unlocking anything.
pub fn bitlk_header(device: &Path, devices: &Devices) -> Result<BitlkHeader> {
    let dev = devices.open_header(device, true)?;
    Ok(BitlkHeader::read(&dev)?)
}

/// FileVault 2's volume key: AES-128-XTS.
const FVAULT2_KEY_LEN: usize = 32;

fn wrong_key_len(k: &[u8], want: usize) -> Error {
    Error::Invalid(format!(
        "the volume key has {} bytes; this volume takes {want}",
        k.len()
    ))
}

/// What opens a BitLocker or FileVault 2 volume.
pub enum Unlock<'a> {
    /// A passphrase or recovery password/key; for BitLocker also a startup key file's
    /// contents, or nothing: the clear key of a volume whose protection is suspended.
    Passphrase(&'a [u8]),
    /// The volume key itself (`--volume-key-file`).
    VolumeKey(&'a [u8]),
}

/// Unlocks a BitLocker volume (`cryptsetup open --type bitlk`) and maps it as cryptsetup
/// does: the metadata areas read as zeros, the relocated boot sectors appear at the start.
pub fn open_bitlk(device: &Path, opts: &OpenOptions, secret: Unlock<'_>) -> Result<UnlockedBitlk> {
    let data = opts.devices.open(device, opts.read_only)?;
    let header = BitlkHeader::read(&data)?;
    header.check_mappable()?;
    let key = match secret {
        Unlock::Passphrase(s) => header.volume_key(s)?,
        Unlock::VolumeKey(k) if k.len() * 8 == header.encryption.key_bits() => {
            cryptblk_crypto::SecretBytes::from_slice(k)
        }
        Unlock::VolumeKey(k) => return Err(wrong_key_len(k, header.encryption.key_bits() / 8)),
    };
    let size = data.size()?;
    let zero_spec = cryptblk_crypto::CipherSpec::parse("cipher_null-ecb")?;
    let segments = header
        .segments(size)?
        .into_iter()
        .map(|s| {
            let (storage_offset, cipher, zero) = match s.crypt {
                Some((at, iv)) => (at, header.sector_cipher(&key, iv)?, false),
                None => (
                    s.start,
                    SectorCipher::new(zero_spec, &[], header.sector_size, Default::default())?,
                    true,
                ),
            };
            Ok(DataSegment {
                start: s.start,
                len: s.len,
                storage_offset,
                cipher,
                zero,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let storage = opts.io.storage(data, header.sector_size)?;
    let volume = Volume::with_segments(storage, segments, opts.read_only, opts.allow_discards)?;
    Ok(UnlockedBitlk { volume, header })
}

/// An unlocked FileVault 2 volume and the metadata that opened it.
pub struct UnlockedFvault2 {
    /// The volume, ready for I/O: the logical volume as cryptsetup maps it.
    pub volume: Volume,
    /// The Core Storage metadata (for `status` and `fvault2Dump`).
    pub header: Fvault2Header,
}

/// Reads the FileVault 2 (Core Storage) metadata of `device` without unlocking anything.
pub fn fvault2_header(device: &Path, devices: &Devices) -> Result<Fvault2Header> {
    let dev = devices.open_header(device, true)?;
    Ok(Fvault2Header::read(&dev)?)
}

/// Unlocks a FileVault 2 volume (`cryptsetup open --type fvault2`) and maps its logical
/// volume as cryptsetup does: aes-xts-plain64 from the volume's offset, IVs from 0.
pub fn open_fvault2(
    device: &Path,
    opts: &OpenOptions,
    secret: Unlock<'_>,
) -> Result<UnlockedFvault2> {
    let data = opts.devices.open(device, opts.read_only)?;
    let header = Fvault2Header::read(&data)?;
    let cipher = match secret {
        Unlock::Passphrase(p) => header.sector_cipher(&header.volume_key(p)?)?,
        Unlock::VolumeKey(k) if k.len() == FVAULT2_KEY_LEN => header.sector_cipher(k)?,
        Unlock::VolumeKey(k) => return Err(wrong_key_len(k, FVAULT2_KEY_LEN)),
    };
    let params = VolumeParams {
        cipher: *cipher.spec(),
        sector_size: 512,
        iv: cipher.iv_options(),
        data_offset: header.volume_offset,
        data_length: Some(header.volume_size / 512 * 512),
        read_only: opts.read_only,
        allow_discards: opts.allow_discards,
    };
    let storage = opts.io.storage(data, 512)?;
    let volume = Volume::new(storage, cipher, &params)?;
    Ok(UnlockedFvault2 { volume, header })
}
