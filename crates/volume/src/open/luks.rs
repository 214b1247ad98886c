//! LUKS1 and LUKS2: a passphrase opens a keyslot; mid-reencryption the data has a
//! segment per key (an interrupted step is recovered first, as cryptsetup does).

use super::*;
use crate::storage::Storage;
use crate::{DataSegment, Error, Result, Volume, VolumeParams};
use cryptblk_device::DataDevice;
use cryptblk_format::{LuksHeader, SegmentKey, load_header};
use std::path::Path;

/// An unlocked LUKS volume with the header it came from.
pub struct UnlockedLuks {
    /// The volume, ready for I/O.
    pub volume: Volume,
    /// The LUKS1/LUKS2 header, as loaded from the data device or the detached header.
    pub header: Box<dyn LuksHeader>,
    /// Number of the keyslot the passphrase opened (`None`: opened with the volume key).
    pub keyslot: Option<u32>,
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
    let volume = if let [
        one @ SegmentKey {
            integrity: Some(_), ..
        },
    ] = segments.as_slice()
    {
        integrity_volume(data, one, opts)?
    } else if let [one] = segments.as_slice() {
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
        keyslot: Some(keyslot),
        header_file: hdev,
    })
}

/// A LUKS2 data segment with integrity as a volume: its dm-integrity device opened on the
/// data (the journal replayed; read-only, held in memory) and served with authenticated
/// sectors. Discards are refused as cryptsetup refuses them (a discarded block would read
/// as a failed tag), and O_DIRECT (tags are not sector-aligned).
fn integrity_volume(data: DataDevice, one: &SegmentKey, opts: &OpenOptions) -> Result<Volume> {
    if opts.allow_discards {
        return Err(Error::Invalid(
            "discards are not supported on volumes with integrity protection".into(),
        ));
    }
    if opts.io.direct {
        return Err(Error::Invalid(
            "--direct is not supported on volumes with integrity protection".into(),
        ));
    }
    let cipher = aead_cipher(one)?;
    let storage = opts.io.storage(data, one.sector_size)?;
    integrity_volume_on(
        storage,
        one.storage_offset,
        Box::new(cipher),
        opts.read_only,
        opts.integrity_mode(),
    )
}

/// The authenticated sector cipher of a LUKS2 segment with integrity, keyed.
fn aead_cipher(one: &SegmentKey) -> Result<cryptblk_crypto::AeadSectorCipher> {
    let i = one.integrity.as_ref().expect("a segment with integrity");
    Ok(cryptblk_crypto::AeadSectorCipher::new(
        &i.encryption,
        &i.kind,
        &one.key,
        one.sector_size,
        one.iv.offset,
    )?)
}

/// A LUKS2 segment with integrity as the data segment of a volume already served on
/// `storage` (a resume): its dm-integrity device opened again at `start` (the journal a
/// suspend emptied, or replayed), keyed from `one`.
pub(crate) fn integrity_segment_again(
    storage: &dyn Storage,
    one: &SegmentKey,
    (start, read_only, mode): (u64, bool, crate::IntegrityMode),
) -> Result<DataSegment> {
    if start != one.storage_offset {
        return Err(Error::Invalid(format!(
            "the header's segment starts at {}, the volume's dm-integrity device at {start}",
            one.storage_offset
        )));
    }
    integrity_segment(
        storage,
        start,
        Box::new(aead_cipher(one)?),
        crate::JournalKeys::default(),
        read_only,
        mode,
    )
    .map(|(seg, _)| seg)
}

/// The volume over the dm-integrity device at byte `start` of `storage` (its journal
/// replayed) with `auth`'s tags: LUKS2 with integrity below its header (dm-crypt's
/// authenticated sectors), or a standalone integritysetup volume (dm-integrity's checksum).
/// `mode`: how writes reach their place (dm-integrity's modes 'J', 'D', 'B').
pub fn integrity_volume_on(
    storage: Box<dyn Storage>,
    start: u64,
    auth: Box<dyn cryptblk_crypto::SectorTags>,
    read_only: bool,
    mode: crate::IntegrityMode,
) -> Result<Volume> {
    integrity_volume_with(
        storage,
        start,
        auth,
        crate::JournalKeys::default(),
        read_only,
        mode,
    )
}

/// [`integrity_volume_on`] with the journal's MAC and encryption (standalone volumes
/// formatted with integritysetup's `--journal-integrity`, `--journal-crypt`).
pub fn integrity_volume_with(
    storage: Box<dyn Storage>,
    start: u64,
    auth: Box<dyn cryptblk_crypto::SectorTags>,
    journal: crate::JournalKeys,
    read_only: bool,
    mode: crate::IntegrityMode,
) -> Result<Volume> {
    let (seg, _) = integrity_segment(&*storage, start, auth, journal, read_only, mode)?;
    Volume::with_segments(storage, vec![seg], read_only, false)
}

/// The one data segment over the dm-integrity device at `start` of `storage` (opened:
/// its journal replayed), and the bytes it serves.
fn integrity_segment(
    storage: &dyn Storage,
    start: u64,
    auth: Box<dyn cryptblk_crypto::SectorTags>,
    journal: crate::JournalKeys,
    read_only: bool,
    mode: crate::IntegrityMode,
) -> Result<(DataSegment, u64)> {
    let sector_size = auth.sector_size();
    let (integrity, size) =
        crate::Integrity::open_with(storage, start, auth, journal, read_only, mode)?;
    let seg = DataSegment {
        start: 0,
        len: size,
        storage_offset: start,
        cipher: SectorCipher::new(
            cryptblk_crypto::CipherSpec::parse("cipher_null-ecb")?,
            &[],
            sector_size,
            cryptblk_crypto::IvOptions::default(),
        )?,
        zero: false,
        integrity: Some(std::sync::Arc::new(integrity)),
    };
    Ok((seg, size))
}

/// Opens a LUKS volume with its volume key (`open --volume-key-file`): no keyslot is
/// used; the key is checked against the header's digest. A reencryption in progress (or
/// a step a crash cut off) needs the passphrase instead.
pub(crate) fn unlock_luks_with_key(
    device: &Path,
    opts: &OpenOptions,
    volume_key: &[u8],
) -> Result<UnlockedLuks> {
    let data = opts.devices.open(device, opts.read_only)?;
    let mut hdev = match &opts.header {
        Some(h) => opts.devices.open_header(h, true)?,
        None => data.clone(),
    };
    let header = load_header(&mut hdev)?;
    let data_size = data.size()?;
    let segments = header.segments_from_volume_key(volume_key, data_size)?;
    let [one] = segments.as_slice() else {
        return Err(Error::Invalid("a volume key opens one data segment".into()));
    };
    if one.integrity.is_some() {
        return Ok(UnlockedLuks {
            volume: integrity_volume(data, one, opts)?,
            header,
            keyslot: None,
            header_file: hdev,
        });
    }
    let params = VolumeParams {
        cipher: one.cipher,
        sector_size: one.sector_size,
        iv: one.iv,
        data_offset: one.storage_offset,
        data_length: header.data_length().map(|_| one.len),
        read_only: opts.read_only,
        allow_discards: opts.allow_discards,
    };
    let storage = opts.io.storage(data, params.sector_size)?;
    let volume = volume_from_key(storage, &one.key, &params)?;
    Ok(UnlockedLuks {
        volume,
        header,
        keyslot: None,
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

/// The segments' keys as `passphrase` unlocks them from the header (`luksResume` of a
/// volume whose segments the volume builds itself: [`crate::Suspended::resume_keys`]).
pub fn unlock_keys(
    header: &dyn LuksHeader,
    dev: &mut dyn cryptblk_format::Storage,
    passphrase: &[u8],
    slot: Option<u32>,
    data_size: u64,
) -> Result<Vec<SegmentKey>> {
    Ok(header.unlock_segments(dev, passphrase, slot, data_size)?.1)
}
