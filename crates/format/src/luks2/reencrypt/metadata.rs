//! An unfinished LUKS2 reencryption (cryptsetup's `online-reencrypt-v2`/`-v3` metadata):
//! which stretch of the data is under which key, and the digest that binds both keys to
//! that metadata (CVE-2021-4122: without it, forged "half-decrypted" metadata could make a
//! tool write plaintext over ciphertext); how a step cut off would be recovered.
//!
//! The layout rules follow cryptsetup 2.6 (lib/luks2/luks2_reencrypt.c,
//! luks2_reencrypt_digest.c); the on-disk format is `docs/on-disk-format-luks2.pdf` §4.9.

use crate::luks2::Luks2Error;
use crate::luks2::model::{
    KeyslotEntry, Model, ReencryptDirection, ReencryptKeyslot, ReencryptMode, Resilience, Segment,
};
use cryptblk_crypto::HashAlg;
use zeroize::Zeroizing;

/// The requirement an unfinished reencryption sets, by metadata version.
pub const REQUIREMENT_V2: &str = "online-reencrypt-v2";

/// ... the version written for decryption that moves the first segment.
pub const REQUIREMENT_V3: &str = "online-reencrypt-v3";

/// cryptsetup 2.2-2.4.2's unversioned flag (no verification digest).
const REQUIREMENT_LEGACY: &str = "online-reencrypt";

/// Requirements this implementation knows how to honour.
pub(crate) fn is_known_requirement(r: &str) -> bool {
    r == REQUIREMENT_V2 || r == REQUIREMENT_V3
}

/// The reencryption metadata of a header, validated.
#[derive(Debug)]
pub(crate) struct Reencryption<'m> {
    /// 2 or 3 (the requirement's version; part of the digest input).
    pub version: u8,
    pub keyslot_id: u32,
    pub keyslot: &'m KeyslotEntry,
    pub params: &'m ReencryptKeyslot,
    /// The layout before (`backup-previous`): the old key, cipher, sector size, offset.
    pub previous: (u32, &'m Segment),
    /// The layout after (`backup-final`).
    pub final_: (u32, &'m Segment),
    /// Where the moved first stretch of data lives (`backup-moved-segment`), if any.
    pub moved: Option<(u32, &'m Segment)>,
    /// The regular segment of a step that was cut off (flag `in-reencryption`).
    pub hot: Option<u32>,
}

pub(super) fn bad(s: impl Into<String>) -> Luks2Error {
    Luks2Error::InvalidMetadata(s.into())
}

fn backup<'m>(model: &'m Model, flag: &str) -> Result<Option<(u32, &'m Segment)>, Luks2Error> {
    let mut found = model
        .segments
        .iter()
        .filter(|(_, s)| s.flags.iter().any(|f| f == flag));
    let first = found.next().map(|(id, s)| (*id, s));
    if found.next().is_some() {
        return Err(bad(format!("more than one '{flag}' segment")));
    }
    Ok(first)
}

/// Same type, and for crypt segments the same cipher and sector size.
pub(super) fn matches(a: &Segment, b: &Segment) -> bool {
    a.kind == b.kind
        && (a.kind != "crypt" || (a.encryption == b.encryption && a.sector_size == b.sector_size))
}

impl Model {
    /// The unfinished reencryption this metadata records, or `None` when there is none.
    pub(crate) fn reencryption(&self) -> Result<Option<Reencryption<'_>>, Luks2Error> {
        let mut versions = self.requirements.iter().filter_map(|r| match r.as_str() {
            REQUIREMENT_V2 => Some(Ok(2u8)),
            REQUIREMENT_V3 => Some(Ok(3u8)),
            REQUIREMENT_LEGACY => Some(Err(())),
            _ => None,
        });
        let version = match (versions.next(), versions.next()) {
            (None, _) => return Ok(None),
            (Some(_), Some(_)) => return Err(bad("more than one online-reencrypt requirement")),
            (Some(Err(())), None) => {
                return Err(Luks2Error::Unsupported(
                    "reencryption metadata of cryptsetup before 2.4.3 (no verification \
                     digest); run `cryptsetup repair` on it first"
                        .into(),
                ));
            }
            (Some(Ok(v)), None) => v,
        };
        let mut slots = self
            .keyslots
            .iter()
            .filter_map(|(id, k)| k.reencrypt.as_ref().map(|p| (*id, k, p)));
        let (keyslot_id, keyslot, params) = match (slots.next(), slots.next()) {
            (Some(s), None) => s,
            (None, _) => return Err(bad("reencryption requirement without a reencrypt keyslot")),
            (Some(_), Some(_)) => return Err(bad("more than one reencrypt keyslot")),
        };
        let previous =
            backup(self, "backup-previous")?.ok_or_else(|| bad("no backup-previous segment"))?;
        let final_ = backup(self, "backup-final")?.ok_or_else(|| bad("no backup-final segment"))?;
        let moved = backup(self, "backup-moved-segment")?;
        let mut hot = None;
        for (id, s) in self.segments.iter().filter(|(_, s)| !s.is_backup()) {
            if s.in_reencryption() {
                if hot.replace(*id).is_some() {
                    return Err(bad("more than one segment in reencryption"));
                }
                if !matches(s, final_.1) {
                    return Err(bad(format!(
                        "segment {id} in reencryption does not match backup-final"
                    )));
                }
            } else if !matches(s, final_.1) && !matches(s, previous.1) {
                return Err(bad(format!(
                    "segment {id} matches neither backup-previous nor backup-final"
                )));
            }
        }
        Ok(Some(Reencryption {
            version,
            keyslot_id,
            keyslot,
            params,
            previous,
            final_,
            moved,
            hot,
        }))
    }
}

/// One stretch of the volume as the metadata lays it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stretch {
    pub segment: u32,
    /// First plaintext byte it covers.
    pub start: u64,
    pub len: u64,
}

impl Reencryption<'_> {
    /// Where the data starts for the size computation: the final layout's offset, plus the
    /// shift once a forward data shift has begun (cryptsetup's `LUKS2_reencrypt_data_offset`).
    fn data_offset(&self) -> u64 {
        let mut off = self.final_.1.offset;
        if self.hot.is_none() && self.params.direction == ReencryptDirection::Forward {
            off += self.params.resilience.shift_size();
        }
        off
    }

    /// The regular segments in order, each with the plaintext stretch it covers, for a data
    /// device of `data_size` bytes. All fixed sizes: the volume is their sum; a dynamic last
    /// segment runs to the end of the device as cryptsetup sizes it.
    pub(crate) fn layout(&self, model: &Model, data_size: u64) -> Result<Vec<Stretch>, Luks2Error> {
        let data_offset = self.data_offset();
        let device_size = data_size.checked_sub(data_offset).ok_or_else(|| {
            bad(format!(
                "the data device ({data_size} bytes) ends before the reencryption's data \
                 offset {data_offset}"
            ))
        })?;
        let mut out = Vec::new();
        let mut start = 0u64;
        for (id, s) in model.segments.iter().filter(|(_, s)| !s.is_backup()) {
            let len = match s.size {
                Some(len) => len,
                None => device_size
                    .checked_sub(start)
                    .filter(|&l| l > 0)
                    .ok_or_else(|| {
                        bad(format!(
                            "segment {id} starts at byte {start} of a {device_size}-byte volume"
                        ))
                    })?,
            };
            out.push(Stretch {
                segment: *id,
                start,
                len,
            });
            start = start
                .checked_add(len)
                .ok_or_else(|| bad("segment sizes overflow"))?;
        }
        if out.is_empty() {
            return Err(bad("no data segment"));
        }
        Ok(out)
    }

    /// The bytes the verification digest is computed over (cryptsetup's
    /// `reencrypt_assembly_verification_data`): "v", the version digit, the old and the new
    /// volume key (each only if that side is encrypted; one key if both sides share it),
    /// then the reencrypt keyslot and the backup segments, field by field.
    pub(crate) fn verification_data(
        &self,
        old_key: Option<&[u8]>,
        new_key: Option<&[u8]>,
    ) -> Result<Zeroizing<Vec<u8>>, Luks2Error> {
        // Sized once: a reallocation would leave a copy of the keys in freed memory.
        let keys = old_key.map_or(0, <[u8]>::len) + new_key.map_or(0, <[u8]>::len);
        let mut b = Zeroizing::new(Vec::with_capacity(2 + keys + 1024));
        b.extend_from_slice(&[b'v', b'0' + self.version]);
        if old_key.is_none() && new_key.is_none() {
            return Err(bad("reencryption digest without any volume key"));
        }
        for key in [old_key, new_key].into_iter().flatten() {
            b.extend_from_slice(key);
        }
        let str_ = |b: &mut Vec<u8>, s: &str| -> Result<(), Luks2Error> {
            if s.len() > 64 {
                return Err(bad(format!(
                    "reencryption field '{s}' longer than 64 bytes"
                )));
            }
            b.extend_from_slice(s.as_bytes());
            Ok(())
        };
        let p = self.params;
        str_(
            &mut b,
            match p.mode {
                ReencryptMode::Reencrypt => "reencrypt",
                ReencryptMode::Encrypt => "encrypt",
                ReencryptMode::Decrypt => "decrypt",
            },
        )?;
        str_(
            &mut b,
            match p.direction {
                ReencryptDirection::Forward => "forward",
                ReencryptDirection::Backward => "backward",
            },
        )?;
        str_(&mut b, p.resilience.name())?;
        b.extend_from_slice(&self.keyslot.area_offset.to_be_bytes());
        b.extend_from_slice(&self.keyslot.area_size.to_be_bytes());
        match &p.resilience {
            Resilience::Checksum { hash, sector_size } => {
                str_(&mut b, hash)?;
                b.extend_from_slice(&sector_size.to_be_bytes());
            }
            Resilience::DatashiftChecksum {
                hash,
                sector_size,
                shift_size,
            } => {
                str_(&mut b, hash)?;
                b.extend_from_slice(&sector_size.to_be_bytes());
                b.extend_from_slice(&shift_size.to_be_bytes());
            }
            Resilience::Datashift { shift_size } | Resilience::DatashiftJournal { shift_size } => {
                b.extend_from_slice(&shift_size.to_be_bytes());
            }
            Resilience::Journal | Resilience::None => {}
        }
        let segments = [Some(self.previous), Some(self.final_), self.moved];
        for (_, s) in segments.into_iter().flatten() {
            str_(&mut b, &s.kind)?;
            b.extend_from_slice(&s.offset.to_be_bytes());
            match s.size {
                None => b.extend_from_slice(b"dynamic"),
                Some(n) => b.extend_from_slice(&n.to_be_bytes()),
            }
            if s.kind == "crypt" {
                b.extend_from_slice(&s.iv_tweak.to_be_bytes());
                str_(&mut b, &s.encryption)?;
                b.extend_from_slice(&s.sector_size.to_be_bytes());
            }
        }
        Ok(b)
    }
}

/// Which side of the reencryption a regular segment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    /// Not yet reencrypted (the `backup-previous` layout).
    Old,
    /// Done (the `backup-final` layout).
    New,
}

/// How a crash in the middle of a reencryption step is recovered: where the zone's old
/// bytes are found again. It decides whether a write under the new key into the part of
/// the zone already rewritten survives that recovery (only with checksums, see
/// [`StepRecovery::keeps_rewritten_writes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepRecovery {
    /// Each block whose bytes still hash to its old checksum is converted; a block that
    /// was rewritten (by the step or a client since) is left as it is.
    Checksums,
    /// The whole zone is rewritten from the old bytes copied to the keyslot area.
    Journal,
    /// The whole zone is rewritten from the old bytes at their old place (a data shift
    /// or a data move, whose source is not overwritten before the step ends).
    Shift,
    /// None (resilience `none`): a step cut short loses its zone.
    Nothing,
}

impl StepRecovery {
    /// Whether a client's write under the new key to a rewritten part of the step's zone
    /// outlives a crash recovery of that step. Only checksums tell a client's block from
    /// an old one; every other recovery rewrites the whole zone from its old bytes (or
    /// has none), so such writes must wait for the step to be committed.
    pub fn keeps_rewritten_writes(self) -> bool {
        self == StepRecovery::Checksums
    }
}

/// Where an interrupted step's old bytes are found again.
pub(super) enum Protection<'a> {
    /// Hashes of the old bytes of each `bs`-byte block, in the keyslot area.
    Checksum { hash: &'a str, bs: u64 },
    /// The old bytes themselves, in the keyslot area.
    Journal,
    /// The old bytes at their old place on the data device, with their old IV base.
    Shift { source: u64, iv_base: u64 },
}

/// The metadata after a recovered step and what to wipe once it is committed.
pub(crate) struct AfterRecovery {
    pub json: serde_json::Value,
    /// Keyslot areas no longer referenced (header device).
    pub wipe_header: Vec<(u64, u64)>,
    /// The job's data is all done but it left stale copies ([`Reencryption::stale_copies`]):
    /// after this commit they are overwritten, then a second commit finishes the job
    /// ([`Reencryption::finished`]), so a crash never leaves a copy nothing records.
    pub finish_after_wipe: bool,
}

/// How the hot zone survives a crash (`--resilience`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResilienceRequest {
    /// A hash of each block's old bytes (cryptsetup's default).
    Checksum(HashAlg),
    /// A copy of the old bytes.
    Journal,
    /// Nothing: a crash in a step loses that step's data.
    None,
}
