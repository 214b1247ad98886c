//! Opening volumes of every type through one function, [`open`]: the [`VolumeType`]
//! (cryptsetup's `--type`), the [`Secret`] the caller read (once, after [`probe`] checked
//! the device), the [`OpenOptions`]. One module per type: `luks`, `plain`, `loopaes`,
//! `tcrypt`, `bitlk`, `fvault2`, `integrity`. A new type: its module here, its variant and arms below.

use crate::storage::{FileStorage, IoEngine, Storage};
use crate::{DataSegment, Error, Result, Volume, VolumeParams};
use cryptblk_crypto::SectorCipher;
use cryptblk_device::{DataDevice, DeviceOpener, LocalDevices};
use cryptblk_format::SegmentKey;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod bitlk;
mod fvault2;
mod integrity;
mod loopaes;
mod luks;
mod plain;
mod tcrypt;

pub use bitlk::*;
pub use fvault2::*;
pub use integrity::*;
pub use loopaes::*;
pub use luks::*;
pub use plain::*;
pub use tcrypt::*;

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
    /// LUKS2 with integrity: write blocks and tags straight home, without dm-integrity's
    /// journal (cryptsetup's `--integrity-no-journal`, the kernel's mode 'D'): faster, but a
    /// crash during a write can leave that block failing verification.
    pub integrity_no_journal: bool,
    /// Standalone integrity volumes: dm-integrity's bitmap mode (integritysetup's
    /// `--integrity-bitmap-mode`): writes straight home, their regions marked first, the
    /// marked regions' tags recalculated after a crash.
    pub integrity_bitmap: bool,
    /// Standalone integrity volumes: the checksum.
    pub integrity: IntegrityOptions,
    /// Only try this keyslot.
    pub key_slot: Option<u32>,
    /// How the data file is read and written.
    pub io: FileIo,
    /// Plain mode: cipher, key size, hash, offset, skip, size, sector size.
    pub plain: cryptblk_format::plain::PlainParams,
    /// loop-AES: cipher, key size, hash, offset, skip, size.
    pub loopaes: LoopAesOptions,
    /// TrueCrypt/VeraCrypt: the header to find and the keyfiles.
    pub tcrypt: cryptblk_format::tcrypt::TcryptOptions,
}

impl OpenOptions {
    /// How a dm-integrity device's writes reach their place, as the options say.
    pub fn integrity_mode(&self) -> crate::IntegrityMode {
        if self.integrity_bitmap {
            crate::IntegrityMode::Bitmap
        } else if self.integrity_no_journal {
            crate::IntegrityMode::Direct
        } else {
            crate::IntegrityMode::Journal
        }
    }
}

/// A volume type: cryptsetup's `--type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum VolumeType {
    /// LUKS1 or LUKS2, as the header says.
    #[default]
    Luks,
    /// LUKS1 only.
    Luks1,
    /// LUKS2 only.
    Luks2,
    /// A plain dm-crypt mapping: no header.
    Plain,
    /// loop-AES: keys from a key file.
    Loopaes,
    /// TrueCrypt or VeraCrypt.
    Tcrypt,
    /// BitLocker or BitLocker To Go.
    Bitlk,
    /// FileVault 2 (Core Storage).
    Fvault2,
    /// A standalone dm-integrity volume (integritysetup's): checksums, no encryption.
    Integrity,
}

impl VolumeType {
    /// Every type, in cryptsetup's order.
    pub const ALL: [VolumeType; 9] = [
        VolumeType::Luks,
        VolumeType::Luks1,
        VolumeType::Luks2,
        VolumeType::Plain,
        VolumeType::Loopaes,
        VolumeType::Tcrypt,
        VolumeType::Bitlk,
        VolumeType::Fvault2,
        VolumeType::Integrity,
    ];

    /// cryptsetup's name: `luks`, `plain`, `tcrypt`...
    pub fn name(self) -> &'static str {
        match self {
            VolumeType::Luks => "luks",
            VolumeType::Luks1 => "luks1",
            VolumeType::Luks2 => "luks2",
            VolumeType::Plain => "plain",
            VolumeType::Loopaes => "loopaes",
            VolumeType::Tcrypt => "tcrypt",
            VolumeType::Bitlk => "bitlk",
            VolumeType::Fvault2 => "fvault2",
            VolumeType::Integrity => "integrity",
        }
    }

    /// LUKS of either version.
    pub fn is_luks(self) -> bool {
        matches!(
            self,
            VolumeType::Luks | VolumeType::Luks1 | VolumeType::Luks2
        )
    }
}

impl std::fmt::Display for VolumeType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for VolumeType {
    type Err = Error;
    fn from_str(s: &str) -> Result<VolumeType> {
        VolumeType::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| Error::Invalid(format!("unknown volume type '{s}'")))
    }
}

/// What unlocks a volume, read by the caller once [`probe`] has checked the device.
pub enum Secret {
    /// A passphrase (or a key file read as one): LUKS, plain mode (hashed), TrueCrypt (may
    /// be empty with keyfiles), BitLocker (passphrase, recovery password or a startup key
    /// file's contents), FileVault 2.
    Passphrase(cryptblk_crypto::SecretBytes),
    /// A key file's bytes used as keys: plain mode's raw key, loop-AES's key file, a
    /// standalone integrity volume's HMAC key.
    KeyFile(cryptblk_crypto::SecretBytes),
    /// The volume key itself (BitLocker, FileVault 2: `--volume-key-file`).
    VolumeKey(cryptblk_crypto::SecretBytes),
    /// Nothing: a BitLocker volume whose protection is suspended opens with its clear key.
    None,
}

/// What [`probe`] learnt before any secret is read.
#[derive(Debug, Clone, Default)]
pub struct Probe {
    /// A BitLocker volume whose protection is suspended: it needs no secret.
    pub clear_key: bool,
    /// The volume key's length where the metadata gives it (BitLocker, FileVault 2,
    /// LUKS), for a `--volume-key-file` of exactly that size.
    pub key_len: Option<usize>,
}

/// How a volume was unlocked, as `status` reports it.
#[derive(Debug, Clone)]
pub struct VolumeInfo {
    /// "LUKS1", "LUKS2", "PLAIN", "LOOPAES", "TCRYPT", "VERACRYPT", "BITLK", "FVAULT2"...
    pub kind: String,
    /// Volume key bits.
    pub key_bits: usize,
    /// The keyslot that opened it (LUKS).
    pub keyslot: Option<u32>,
    /// The header's UUID (LUKS; BitLocker's GUID; FileVault 2's family UUID).
    pub uuid: Option<String>,
    /// The LUKS2 token (id, type) whose passphrase opened it, when one did.
    pub token: Option<(u32, String)>,
}

/// An opened volume.
pub struct Opened {
    /// The volume, ready for I/O.
    pub volume: Volume,
    /// What `status` reports.
    pub info: VolumeInfo,
    /// The LUKS header's storage, for a reencryption while the volume serves.
    pub header_file: Option<DataDevice>,
}

/// Checks the device before any secret is read: it opens (a missing or busy device is an
/// error now, not after a passphrase prompt), and where the type has metadata it is there
/// (a device that is not LUKS, BitLocker or FileVault 2 is refused).
pub fn probe(kind: VolumeType, device: &Path, opts: &OpenOptions) -> Result<Probe> {
    let data = opts.devices.open(device, true)?;
    let mut probe = Probe::default();
    match kind {
        VolumeType::Luks | VolumeType::Luks1 | VolumeType::Luks2 => {
            let mut hdev = match &opts.header {
                Some(h) => opts.devices.open_header(h, true)?,
                None => data,
            };
            let h = cryptblk_format::load_header(&mut hdev)?;
            check_luks_version(kind, h.version())?;
            probe.key_len = Some(h.key_len());
        }
        VolumeType::Bitlk => {
            let h = cryptblk_format::bitlk::BitlkHeader::read(&data)?;
            probe.clear_key = h.has_clear_key();
            probe.key_len = Some(h.encryption.key_bits() / 8);
        }
        VolumeType::Fvault2 => {
            cryptblk_format::fvault2::Fvault2Header::read(&data)?;
            probe.key_len = Some(FVAULT2_KEY_LEN);
        }
        VolumeType::Integrity => {
            integrity_superblock(device, opts)?;
        }
        VolumeType::Plain | VolumeType::Loopaes | VolumeType::Tcrypt => {}
    }
    Ok(probe)
}

/// A LUKS header of the version `kind` asks for (any for [`VolumeType::Luks`]).
fn check_luks_version(kind: VolumeType, version: u8) -> Result<()> {
    match (kind, version) {
        (VolumeType::Luks1, 2) | (VolumeType::Luks2, 1) => Err(Error::Invalid(format!(
            "the device holds a LUKS{version} header, not {}",
            kind.name().to_uppercase()
        ))),
        _ => Ok(()),
    }
}

/// Opens a volume of type `kind` on `device` with `secret`: the one way in for every type.
pub fn open(
    kind: VolumeType,
    device: &Path,
    secret: &Secret,
    opts: &OpenOptions,
) -> Result<Opened> {
    let wrong = |what: &str| {
        Err(Error::Invalid(format!(
            "a {} volume does not open with {what}",
            kind.name()
        )))
    };
    match (kind, secret) {
        (
            VolumeType::Luks | VolumeType::Luks1 | VolumeType::Luks2,
            Secret::Passphrase(_) | Secret::VolumeKey(_),
        ) => {
            let u = if let Secret::VolumeKey(k) = secret {
                luks::unlock_luks_with_key(device, opts, k)?
            } else if let Secret::Passphrase(p) = secret {
                unlock_luks(device, opts, p)?
            } else {
                return wrong("this secret");
            };
            check_luks_version(kind, u.header.version())?;
            Ok(Opened {
                info: VolumeInfo {
                    kind: format!("LUKS{}", u.header.version()),
                    key_bits: u.header.key_len() * 8,
                    keyslot: u.keyslot,
                    uuid: Some(u.header.uuid().to_string()),
                    token: None,
                },
                volume: u.volume,
                header_file: Some(u.header_file),
            })
        }
        (VolumeType::Plain, Secret::Passphrase(_) | Secret::KeyFile(_)) => {
            let p = &opts.plain;
            let key = match secret {
                Secret::KeyFile(raw) => p.key_from_keyfile(raw, 0)?,
                Secret::Passphrase(pass) => p.derive_key(pass)?,
                _ => unreachable!("matched above"),
            };
            let params = VolumeParams {
                cipher: p.cipher,
                sector_size: p.sector_size,
                iv: p.iv_options(),
                data_offset: p.data_offset_bytes(),
                data_length: p.data_length_bytes(),
                read_only: opts.read_only,
                allow_discards: opts.allow_discards,
            };
            let data = opts.devices.open(device, opts.read_only)?;
            Ok(Opened {
                volume: open_plain_on(data, &key, &params, opts.io)?,
                info: VolumeInfo {
                    kind: "PLAIN".into(),
                    key_bits: p.key_len * 8,
                    keyslot: None,
                    uuid: None,
                    token: None,
                },
                header_file: None,
            })
        }
        (VolumeType::Loopaes, Secret::KeyFile(file)) => Ok(Opened {
            volume: open_loopaes(device, opts, file)?,
            info: VolumeInfo {
                kind: "LOOPAES".into(),
                key_bits: opts.loopaes.key_len * 8,
                keyslot: None,
                uuid: None,
                token: None,
            },
            header_file: None,
        }),
        (VolumeType::Tcrypt, Secret::Passphrase(p)) => {
            let u = open_tcrypt(device, opts, &opts.tcrypt, p)?;
            Ok(Opened {
                info: VolumeInfo {
                    kind: if u.header.veracrypt {
                        "VERACRYPT"
                    } else {
                        "TCRYPT"
                    }
                    .into(),
                    key_bits: u.header.key_bits(),
                    keyslot: None,
                    uuid: None,
                    token: None,
                },
                volume: u.volume,
                header_file: None,
            })
        }
        (VolumeType::Bitlk, Secret::Passphrase(_) | Secret::VolumeKey(_) | Secret::None) => {
            let unlock = match secret {
                Secret::VolumeKey(k) => Unlock::VolumeKey(k),
                Secret::Passphrase(p) => Unlock::Passphrase(p),
                _ => Unlock::Passphrase(&[]),
            };
            let u = open_bitlk(device, opts, unlock)?;
            Ok(Opened {
                info: VolumeInfo {
                    kind: if u.header.togo {
                        "BITLK (To Go)"
                    } else {
                        "BITLK"
                    }
                    .into(),
                    key_bits: u.header.encryption.key_bits(),
                    keyslot: None,
                    uuid: Some(u.header.guid.clone()),
                    token: None,
                },
                volume: u.volume,
                header_file: None,
            })
        }
        (VolumeType::Fvault2, Secret::Passphrase(_) | Secret::VolumeKey(_)) => {
            let unlock = match secret {
                Secret::VolumeKey(k) => Unlock::VolumeKey(k),
                Secret::Passphrase(p) => Unlock::Passphrase(p),
                _ => unreachable!("matched above"),
            };
            let u = open_fvault2(device, opts, unlock)?;
            Ok(Opened {
                info: VolumeInfo {
                    kind: "FVAULT2".into(),
                    key_bits: FVAULT2_KEY_LEN * 8,
                    keyslot: None,
                    uuid: Some(u.header.family_uuid.clone()),
                    token: None,
                },
                volume: u.volume,
                header_file: None,
            })
        }
        (VolumeType::Integrity, Secret::None | Secret::KeyFile(_)) => {
            let key = match secret {
                Secret::KeyFile(k) => Some(&k[..]),
                _ => None,
            };
            let volume = open_integrity(device, opts, key)?;
            Ok(Opened {
                info: VolumeInfo {
                    kind: "INTEGRITY".into(),
                    key_bits: key.map_or(0, |k| k.len() * 8),
                    keyslot: None,
                    uuid: None,
                    token: None,
                },
                volume,
                header_file: None,
            })
        }
        (_, Secret::Passphrase(_)) => wrong("a passphrase"),
        (_, Secret::KeyFile(_)) => wrong("a key file's keys"),
        (_, Secret::VolumeKey(_)) => wrong("a volume key"),
        (_, Secret::None) => wrong("no secret"),
    }
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

/// A header's unlocked segment as the volume serves it.
pub(crate) fn data_segment(s: SegmentKey) -> Result<DataSegment> {
    if s.integrity.is_some() {
        // Only `unlock_luks` opens these: the dm-integrity device needs the storage.
        return Err(Error::Invalid(
            "a segment with integrity protection in a layout of several".into(),
        ));
    }
    Ok(DataSegment {
        start: s.start,
        len: s.len,
        storage_offset: s.storage_offset,
        cipher: SectorCipher::new(s.cipher, &s.key, s.sector_size, s.iv)?,
        zero: false,
        integrity: None,
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
