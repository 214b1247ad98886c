//! Typed view of the LUKS2 JSON metadata, built by validating the JSON the way
//! cryptsetup validates it (`LUKS2_hdr_validate` and the keyslot/digest handlers).
//!
//! The JSON itself stays the source of truth (see `Luks2Header::json`): this view is
//! rebuilt from it after every change, so unknown fields survive untouched.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use cryptblk_crypto::kdf::ARGON2_MAX_MEMORY_KIB;
use cryptblk_crypto::{Argon2Variant, CipherSpec, HashAlg, Kdf};
use serde_json::{Map, Value};

use super::Luks2Error;
use super::binary::BIN_HDR_LEN;

/// Keyslots, tokens and segments are numbered 0..32.
pub(super) const MAX_OBJECTS: u32 = 32;
/// cryptsetup's ceiling for the keyslots area.
pub(super) const MAX_KEYSLOTS_SIZE: u64 = 128 * 1024 * 1024;
/// The only AF stripe count cryptsetup reads or writes.
pub(super) const STRIPES: u32 = 4000;

type Obj = Map<String, Value>;

fn bad(msg: impl Into<String>) -> Luks2Error {
    Luks2Error::InvalidMetadata(msg.into())
}

fn as_obj<'a>(v: &'a Value, what: &str) -> Result<&'a Obj, Luks2Error> {
    v.as_object()
        .ok_or_else(|| bad(format!("{what} is not an object")))
}

fn get<'a>(o: &'a Obj, key: &str, what: &str) -> Result<&'a Value, Luks2Error> {
    o.get(key)
        .ok_or_else(|| bad(format!("{what} is missing \"{key}\"")))
}

fn get_obj<'a>(o: &'a Obj, key: &str, what: &str) -> Result<&'a Obj, Luks2Error> {
    as_obj(get(o, key, what)?, &format!("{what} \"{key}\""))
}

/// A non-empty string field.
fn get_str<'a>(o: &'a Obj, key: &str, what: &str) -> Result<&'a str, Luks2Error> {
    match get(o, key, what)? {
        Value::String(s) if !s.is_empty() => Ok(s),
        _ => Err(bad(format!("{what} \"{key}\" is not a non-empty string"))),
    }
}

/// A decimal number stored as a string (LUKS2 stores 64-bit values this way).
pub(super) fn parse_u64_str(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn get_u64_str(o: &Obj, key: &str, what: &str) -> Result<u64, Luks2Error> {
    let s = get_str(o, key, what)?;
    parse_u64_str(s).ok_or_else(|| {
        bad(format!(
            "{what} \"{key}\" is not a 64-bit number string: '{s}'"
        ))
    })
}

/// A JSON integer in 0..=u32::MAX.
fn get_u32_int(o: &Obj, key: &str, what: &str) -> Result<u32, Luks2Error> {
    get(o, key, what)?
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| bad(format!("{what} \"{key}\" is not a 32-bit unsigned integer")))
}

fn get_b64(o: &Obj, key: &str, what: &str) -> Result<Vec<u8>, Luks2Error> {
    B64.decode(get_str(o, key, what)?)
        .map_err(|e| bad(format!("{what} \"{key}\" is not base64: {e}")))
}

fn get_str_array<'a>(o: &'a Obj, key: &str, what: &str) -> Result<Vec<&'a str>, Luks2Error> {
    let arr = get(o, key, what)?
        .as_array()
        .ok_or_else(|| bad(format!("{what} \"{key}\" is not an array")))?;
    arr.iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| bad(format!("{what} \"{key}\" has a non-string member")))
        })
        .collect()
}

fn opt_str_array<'a>(o: &'a Obj, key: &str, what: &str) -> Result<Vec<&'a str>, Luks2Error> {
    if o.contains_key(key) {
        get_str_array(o, key, what)
    } else {
        Ok(Vec::new())
    }
}

/// An object id ("0".."31"), in canonical decimal form so that no two keys map to one id.
pub(super) fn parse_id(key: &str, what: &str) -> Result<u32, Luks2Error> {
    let id = parse_u64_str(key)
        .filter(|&n| n < MAX_OBJECTS as u64 && n.to_string() == key)
        .ok_or_else(|| {
            bad(format!(
                "{what} id \"{key}\" is not a number below {MAX_OBJECTS}"
            ))
        })?;
    Ok(id as u32)
}

/// Keyslot priority (`priority` field; absent means normal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    /// Only used when the slot is named explicitly.
    Ignore = 0,
    /// Tried in keyslot order after "prefer" slots (`priority` 1 or absent).
    Normal = 1,
    /// Tried before normal slots.
    Prefer = 2,
}

/// The parameters of a `luks2` keyslot we can compute with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Luks2Keyslot {
    pub area_cipher: CipherSpec,
    pub area_key_size: usize,
    pub kdf: Kdf,
    pub salt: Vec<u8>,
    pub af_hash: HashAlg,
    pub stripes: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyslotEntry {
    pub kind: String,
    pub key_size: u32,
    pub area_offset: u64,
    pub area_size: u64,
    pub priority: Priority,
    /// `Err` when the slot's type or algorithms are not supported here (it is kept and
    /// preserved, only not usable).
    pub params: Result<Luks2Keyslot, String>,
    /// The parameters of a `reencrypt` keyslot (the one a volume mid-reencryption has).
    pub reencrypt: Option<ReencryptKeyslot>,
}

/// What a reencryption does to the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReencryptMode {
    /// Old key to new key.
    Reencrypt,
    /// Plaintext (a `linear` segment) to the new key.
    Encrypt,
    /// The old key to plaintext.
    Decrypt,
}

/// Which end the reencryption starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReencryptDirection {
    /// From the first sector up.
    Forward,
    /// From the last sector down.
    Backward,
}

/// How the hot zone (the stretch being rewritten) survives a crash, and where its
/// protection lives: the `reencrypt` keyslot's binary area.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resilience {
    /// A hash of each block of the hot zone's old bytes.
    Checksum {
        /// The hash (e.g. `sha256`).
        hash: String,
        /// Bytes per hashed block.
        sector_size: u32,
    },
    /// A copy of the hot zone's old bytes.
    Journal,
    /// No protection (a crash mid-hot-zone loses it).
    None,
    /// Data moved by `shift_size` bytes; the old copy still exists at its old place.
    Datashift {
        /// Bytes the data moves.
        shift_size: u64,
    },
    /// Data shift; checksums protect the last, in-place step of the moved segment.
    DatashiftChecksum {
        /// The hash (e.g. `sha256`).
        hash: String,
        /// Bytes per hashed block.
        sector_size: u32,
        /// Bytes the data moves.
        shift_size: u64,
    },
    /// Data shift; the journal protects the last, in-place step of the moved segment.
    DatashiftJournal {
        /// Bytes the data moves.
        shift_size: u64,
    },
}

impl Resilience {
    /// The name in the metadata (`area.type`).
    pub fn name(&self) -> &'static str {
        match self {
            Resilience::Checksum { .. } => "checksum",
            Resilience::Journal => "journal",
            Resilience::None => "none",
            Resilience::Datashift { .. } => "datashift",
            Resilience::DatashiftChecksum { .. } => "datashift-checksum",
            Resilience::DatashiftJournal { .. } => "datashift-journal",
        }
    }
    /// Bytes the data moves (0 without a data shift).
    pub fn shift_size(&self) -> u64 {
        match self {
            Resilience::Datashift { shift_size }
            | Resilience::DatashiftChecksum { shift_size, .. }
            | Resilience::DatashiftJournal { shift_size } => *shift_size,
            _ => 0,
        }
    }
}

/// The `reencrypt` keyslot: the state of an unfinished reencryption.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReencryptKeyslot {
    pub mode: ReencryptMode,
    pub direction: ReencryptDirection,
    pub resilience: Resilience,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Segment {
    pub kind: String,
    pub offset: u64,
    /// `None` = "dynamic" (to the end of the device).
    pub size: Option<u64>,
    pub iv_tweak: u64,
    pub encryption: String,
    pub sector_size: u32,
    pub flags: Vec<String>,
    /// The segment's `integrity` object (dm-integrity / AEAD under the encryption).
    pub integrity: Option<crate::SegmentIntegrity>,
}

impl Segment {
    /// A reencryption's record of a layout (`backup-previous`, `backup-final`,
    /// `backup-moved-segment`), not a stretch of live data.
    pub(crate) fn is_backup(&self) -> bool {
        self.flags.iter().any(|f| f.starts_with("backup-"))
    }
    /// The hot zone of a reencryption step that was running when the process stopped.
    pub(crate) fn in_reencryption(&self) -> bool {
        self.flags.iter().any(|f| f == "in-reencryption")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pbkdf2Digest {
    pub hash: HashAlg,
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub digest: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Digest {
    pub kind: String,
    pub keyslots: Vec<u32>,
    pub segments: Vec<u32>,
    pub pbkdf2: Result<Pbkdf2Digest, String>,
}

/// The validated metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Model {
    pub json_size: u64,
    pub keyslots_size: u64,
    pub flags: Vec<String>,
    pub requirements: Vec<String>,
    pub keyslots: BTreeMap<u32, KeyslotEntry>,
    pub segments: BTreeMap<u32, Segment>,
    pub digests: BTreeMap<u32, Digest>,
    pub tokens: BTreeMap<u32, Vec<u32>>,
}

fn parse_kdf(kdf: &Obj, what: &str) -> Result<Result<(Kdf, Vec<u8>), String>, Luks2Error> {
    let ty = get_str(kdf, "type", what)?;
    let salt = get_b64(kdf, "salt", what)?;
    let kdf = match ty {
        "pbkdf2" => {
            let hash = get_str(kdf, "hash", what)?;
            let iterations = get_u32_int(kdf, "iterations", what)?;
            let Ok(hash) = HashAlg::from_name(hash) else {
                return Ok(Err(format!("PBKDF2 hash '{hash}'")));
            };
            if iterations == 0 {
                return Err(bad(format!("{what}: PBKDF2 iterations 0")));
            }
            Kdf::Pbkdf2 { hash, iterations }
        }
        "argon2i" | "argon2id" => {
            let time = get_u32_int(kdf, "time", what)?;
            let memory_kib = get_u32_int(kdf, "memory", what)?;
            let parallel = get_u32_int(kdf, "cpus", what)?;
            if time == 0 || memory_kib == 0 || parallel == 0 {
                return Err(bad(format!("{what}: zero Argon2 cost")));
            }
            if memory_kib > ARGON2_MAX_MEMORY_KIB || parallel > 16 {
                return Ok(Err(format!(
                    "Argon2 costs memory={memory_kib} cpus={parallel}"
                )));
            }
            let variant = if ty == "argon2i" {
                Argon2Variant::Argon2i
            } else {
                Argon2Variant::Argon2id
            };
            Kdf::Argon2 {
                variant,
                time,
                memory_kib,
                parallel,
            }
        }
        other => return Ok(Err(format!("KDF type '{other}'"))),
    };
    Ok(Ok((kdf, salt)))
}

fn parse_keyslot(v: &Value, what: &str) -> Result<KeyslotEntry, Luks2Error> {
    let o = as_obj(v, what)?;
    let kind = get_str(o, "type", what)?.to_string();
    let key_size = get_u32_int(o, "key_size", what)?;
    let area = get_obj(o, "area", what)?;
    get_str(area, "type", what)?;
    let area_offset = get_u64_str(area, "offset", what)?;
    let area_size = get_u64_str(area, "size", what)?;
    let priority = match o.get("priority") {
        None => Priority::Normal,
        Some(p) => match p.as_u64() {
            Some(0) => Priority::Ignore,
            Some(1) => Priority::Normal,
            Some(2) => Priority::Prefer,
            _ => return Err(bad(format!("{what}: invalid priority {p}"))),
        },
    };
    let params = if kind == "luks2" {
        parse_luks2_params(o, key_size, area_size, what)?
    } else {
        Err(format!("keyslot type '{kind}'"))
    };
    let reencrypt = if kind == "reencrypt" {
        Some(parse_reencrypt_keyslot(o, key_size, what)?)
    } else {
        None
    };
    Ok(KeyslotEntry {
        kind,
        key_size,
        area_offset,
        area_size,
        priority,
        params,
        reencrypt,
    })
}

/// The `reencrypt` keyslot's fields, validated as cryptsetup validates them
/// (lib/luks2/luks2_keyslot_reenc.c): key_size 1, a known mode and direction, and the area
/// fields each resilience type needs.
fn parse_reencrypt_keyslot(
    o: &Obj,
    key_size: u32,
    what: &str,
) -> Result<ReencryptKeyslot, Luks2Error> {
    if key_size != 1 {
        return Err(bad(format!(
            "{what}: reencrypt keyslot key_size {key_size}"
        )));
    }
    let mode = match get_str(o, "mode", what)? {
        "reencrypt" => ReencryptMode::Reencrypt,
        "encrypt" => ReencryptMode::Encrypt,
        "decrypt" => ReencryptMode::Decrypt,
        m => return Err(bad(format!("{what}: reencryption mode '{m}'"))),
    };
    let direction = match get_str(o, "direction", what)? {
        "forward" => ReencryptDirection::Forward,
        "backward" => ReencryptDirection::Backward,
        d => return Err(bad(format!("{what}: reencryption direction '{d}'"))),
    };
    let area = get_obj(o, "area", what)?;
    let checksum = || -> Result<(String, u32), Luks2Error> {
        let hash = get_str(area, "hash", what)?.to_string();
        let sector_size = get_u32_int(area, "sector_size", what)?;
        if sector_size < 512 || !sector_size.is_power_of_two() {
            return Err(bad(format!("{what}: checksum sector_size {sector_size}")));
        }
        Ok((hash, sector_size))
    };
    let shift = || -> Result<u64, Luks2Error> {
        let s = get_u64_str(area, "shift_size", what)?;
        if s == 0 || !s.is_multiple_of(512) {
            return Err(bad(format!("{what}: shift_size {s}")));
        }
        Ok(s)
    };
    let resilience = match get_str(area, "type", what)? {
        "checksum" => {
            let (hash, sector_size) = checksum()?;
            Resilience::Checksum { hash, sector_size }
        }
        "journal" => Resilience::Journal,
        "none" => Resilience::None,
        "datashift" => Resilience::Datashift {
            shift_size: shift()?,
        },
        "datashift-checksum" => {
            let (hash, sector_size) = checksum()?;
            Resilience::DatashiftChecksum {
                hash,
                sector_size,
                shift_size: shift()?,
            }
        }
        "datashift-journal" => Resilience::DatashiftJournal {
            shift_size: shift()?,
        },
        t => return Err(bad(format!("{what}: reencryption area type '{t}'"))),
    };
    Ok(ReencryptKeyslot {
        mode,
        direction,
        resilience,
    })
}

/// The `luks2` keyslot fields: structural problems are errors, unsupported algorithms `Err`.
fn parse_luks2_params(
    o: &Obj,
    key_size: u32,
    area_size: u64,
    what: &str,
) -> Result<Result<Luks2Keyslot, String>, Luks2Error> {
    let area = get_obj(o, "area", what)?;
    let area_type = get_str(area, "type", what)?;
    let encryption = get_str(area, "encryption", what)?;
    let area_key_size = get_u32_int(area, "key_size", what)?;
    let kdf = parse_kdf(get_obj(o, "kdf", what)?, what)?;
    let af = get_obj(o, "af", what)?;
    let af_type = get_str(af, "type", what)?;
    let stripes = get_u32_int(af, "stripes", what)?;
    let af_hash = get_str(af, "hash", what)?;
    if key_size == 0 {
        return Err(bad(format!("{what}: key_size 0")));
    }
    // The AF material must fit the area (this also bounds what unlock allocates).
    let material = (key_size as u64)
        .checked_mul(stripes as u64)
        .map(|n| n.div_ceil(512) * 512)
        .ok_or_else(|| bad(format!("{what}: key material size overflows")))?;
    if material > area_size {
        return Err(bad(format!(
            "{what}: key material ({material} bytes) larger than its area ({area_size})"
        )));
    }
    Ok((|| {
        if area_type != "raw" {
            return Err(format!("keyslot area type '{area_type}'"));
        }
        if af_type != "luks1" || stripes != STRIPES {
            return Err(format!("AF type '{af_type}' with {stripes} stripes"));
        }
        let area_cipher =
            CipherSpec::parse(encryption).map_err(|_| format!("keyslot cipher '{encryption}'"))?;
        if !area_cipher.valid_key_len(area_key_size as usize) {
            return Err(format!(
                "keyslot cipher '{encryption}' with a {area_key_size}-byte key"
            ));
        }
        let af_hash = HashAlg::from_name(af_hash).map_err(|_| format!("AF hash '{af_hash}'"))?;
        let (kdf, salt) = kdf?;
        Ok(Luks2Keyslot {
            area_cipher,
            area_key_size: area_key_size as usize,
            kdf,
            salt,
            af_hash,
            stripes,
        })
    })())
}

fn parse_segment(v: &Value, what: &str) -> Result<Segment, Luks2Error> {
    let o = as_obj(v, what)?;
    let kind = get_str(o, "type", what)?.to_string();
    let offset = get_u64_str(o, "offset", what)?;
    let size = match get_str(o, "size", what)? {
        "dynamic" => None,
        s => Some(parse_u64_str(s).ok_or_else(|| bad(format!("{what}: invalid size '{s}'")))?),
    };
    let flags = opt_str_array(o, "flags", what)?
        .into_iter()
        .map(String::from)
        .collect();
    let mut seg = Segment {
        kind,
        offset,
        size,
        iv_tweak: 0,
        encryption: String::new(),
        sector_size: 512,
        flags,
        integrity: None,
    };
    if let Some(i) = o.get("integrity") {
        let w = format!("{what} integrity");
        let io = as_obj(i, &w)?;
        seg.integrity = Some(crate::SegmentIntegrity {
            kind: get_str(io, "type", &w)?.to_string(),
            journal_encryption: get_str(io, "journal_encryption", &w)?.to_string(),
            journal_integrity: get_str(io, "journal_integrity", &w)?.to_string(),
            encryption: String::new(),
        });
    }
    if seg.kind == "crypt" {
        seg.iv_tweak = get_u64_str(o, "iv_tweak", what)?;
        seg.encryption = get_str(o, "encryption", what)?.to_string();
        seg.sector_size = get_u32_int(o, "sector_size", what)?;
        if !matches!(seg.sector_size, 512 | 1024 | 2048 | 4096) {
            return Err(bad(format!(
                "{what}: illegal sector size {}",
                seg.sector_size
            )));
        }
        if seg.size.is_some_and(|s| s % seg.sector_size as u64 != 0) {
            return Err(bad(format!("{what}: size not aligned to the sector size")));
        }
        if let Some(i) = seg.integrity.as_mut() {
            i.encryption = seg.encryption.clone();
        }
    }
    Ok(seg)
}

fn parse_digest(v: &Value, what: &str) -> Result<Digest, Luks2Error> {
    let o = as_obj(v, what)?;
    let kind = get_str(o, "type", what)?.to_string();
    let ids = |key: &str| -> Result<Vec<u32>, Luks2Error> {
        get_str_array(o, key, what)?
            .into_iter()
            .map(|s| parse_id(s, what))
            .collect()
    };
    let keyslots = ids("keyslots")?;
    let segments = ids("segments")?;
    let pbkdf2 = if kind == "pbkdf2" {
        let hash = get_str(o, "hash", what)?;
        let iterations = get_u32_int(o, "iterations", what)?;
        let salt = get_b64(o, "salt", what)?;
        let digest = get_b64(o, "digest", what)?;
        if iterations == 0 || digest.is_empty() {
            return Err(bad(format!("{what}: empty digest or zero iterations")));
        }
        match HashAlg::from_name(hash) {
            // The hash's length, or LUKS1's 20 bytes in a volume converted from LUKS1
            // (cryptsetup accepts exactly these two).
            Ok(hash) if digest.len() == hash.output_len() || digest.len() == 20 => {
                Ok(Pbkdf2Digest {
                    hash,
                    iterations,
                    salt,
                    digest,
                })
            }
            Ok(_) => return Err(bad(format!("{what}: digest length does not match {hash}"))),
            Err(_) => Err(format!("digest hash '{hash}'")),
        }
    } else {
        Err(format!("digest type '{kind}'"))
    };
    Ok(Digest {
        kind,
        keyslots,
        segments,
        pbkdf2,
    })
}

fn section<'a>(root: &'a Obj, key: &str) -> Result<&'a Obj, Luks2Error> {
    get_obj(root, key, "JSON area")
}

impl Model {
    /// Validates `json` for a header copy of `hdr_size` bytes.
    pub(crate) fn from_json(json: &Value, hdr_size: u64) -> Result<Model, Luks2Error> {
        let root = as_obj(json, "JSON metadata")?;

        // config
        let config = section(root, "config")?;
        let json_size = get_u64_str(config, "json_size", "config")?;
        let keyslots_size = get_u64_str(config, "keyslots_size", "config")?;
        if json_size.checked_add(BIN_HDR_LEN as u64) != Some(hdr_size) {
            return Err(bad(format!(
                "config json_size {json_size} does not match header size {hdr_size}"
            )));
        }
        if keyslots_size % 4096 != 0 || keyslots_size > MAX_KEYSLOTS_SIZE {
            return Err(bad(format!("unsupported keyslots_size {keyslots_size}")));
        }
        let flags = opt_str_array(config, "flags", "config")?
            .into_iter()
            .map(String::from)
            .collect();
        let requirements = match config.get("requirements") {
            None => Vec::new(),
            Some(r) => opt_str_array(
                as_obj(r, "config requirements")?,
                "mandatory",
                "requirements",
            )?
            .into_iter()
            .map(String::from)
            .collect(),
        };

        // keyslots
        let mut keyslots = BTreeMap::new();
        for (k, v) in section(root, "keyslots")? {
            let id = parse_id(k, "keyslot")?;
            keyslots.insert(id, parse_keyslot(v, &format!("keyslot {k}"))?);
        }

        // tokens
        let mut tokens = BTreeMap::new();
        for (k, v) in section(root, "tokens")? {
            let id = parse_id(k, "token")?;
            let what = format!("token {k}");
            let o = as_obj(v, &what)?;
            get_str(o, "type", &what)?;
            let mut slots = Vec::new();
            for s in get_str_array(o, "keyslots", &what)? {
                let ks = parse_id(s, &what)?;
                if !keyslots.contains_key(&ks) {
                    return Err(bad(format!("{what} references missing keyslot {s}")));
                }
                slots.push(ks);
            }
            tokens.insert(id, slots);
        }

        // segments
        let mut segments = BTreeMap::new();
        for (k, v) in section(root, "segments")? {
            let id = parse_id(k, "segment")?;
            segments.insert(id, parse_segment(v, &format!("segment {k}"))?);
        }

        // digests
        let mut digests = BTreeMap::new();
        for (k, v) in section(root, "digests")? {
            let id = parse_id(k, "digest")?;
            let what = format!("digest {k}");
            let d = parse_digest(v, &what)?;
            if let Some(ks) = d.keyslots.iter().find(|ks| !keyslots.contains_key(ks)) {
                return Err(bad(format!("{what} references missing keyslot {ks}")));
            }
            if let Some(s) = d.segments.iter().find(|s| !segments.contains_key(s)) {
                return Err(bad(format!("{what} references missing segment {s}")));
            }
            digests.insert(id, d);
        }

        let model = Model {
            json_size,
            keyslots_size,
            flags,
            requirements,
            keyslots,
            segments,
            digests,
            tokens,
        };
        model.check_layout(hdr_size)?;
        Ok(model)
    }

    /// cryptsetup's rule for whole metadata (read from disk, or about to be written): a
    /// luks2 keyslot belongs to exactly one digest, whose key it holds. Metadata being
    /// built may break it for a moment, so it is checked apart from [`Model::from_json`].
    pub(crate) fn check_digest_assignment(&self) -> Result<(), Luks2Error> {
        for (id, k) in &self.keyslots {
            let n = self
                .digests
                .values()
                .filter(|d| d.keyslots.contains(id))
                .count();
            if k.kind == "luks2" && n != 1 {
                return Err(bad(format!(
                    "keyslot {id} is assigned to {n} digests, not exactly one"
                )));
            }
        }
        Ok(())
    }

    /// Segments and keyslot areas: no overlaps, areas inside the keyslots area, data after it.
    fn check_layout(&self, hdr_size: u64) -> Result<(), Luks2Error> {
        // Crypt segments must have a digest; segments must not overlap; only the last may be dynamic.
        let mut segs: Vec<(u64, Option<u64>)> = Vec::new();
        for (id, s) in &self.segments {
            if s.kind == "crypt" && !self.digests.values().any(|d| d.segments.contains(id)) {
                return Err(bad(format!(
                    "crypt segment {id} is not assigned to a key digest"
                )));
            }
            // Backup segments (a reencryption's record of the old and new layouts) describe
            // the same data as the live ones and overlap them by design.
            if !s.is_backup() {
                segs.push((s.offset, s.size));
            }
        }
        segs.sort();
        for w in segs.windows(2) {
            match w[0].1 {
                None => return Err(bad("only the last segment may have a dynamic size")),
                // A size up to 2^64-1 is valid (cryptsetup's validation takes it): a sum
                // past u64 reaches past any following segment.
                Some(len) if w[0].0.saturating_add(len) > w[1].0 => {
                    return Err(bad("overlapping segments"));
                }
                Some(_) => {}
            }
        }

        let meta_end = 2 * hdr_size;
        let area_end = meta_end + self.keyslots_size;
        // Data must start after the keyslots area, unless the header is detached (offset 0).
        if let Some(min_off) = self.segments.values().map(|s| s.offset).min()
            && min_off != 0
            && min_off < area_end
        {
            return Err(bad(format!(
                "keyslots area (ends at {area_end}) overlaps the data segment at {min_off}"
            )));
        }
        let mut areas: Vec<(u64, u64, u32)> = Vec::new();
        for (id, k) in &self.keyslots {
            let (off, len) = (k.area_offset, k.area_size);
            if off < meta_end {
                return Err(bad(format!(
                    "keyslot {id} area offset {off} is inside the metadata"
                )));
            }
            if len == 0 {
                return Err(bad(format!("keyslot {id} area is empty")));
            }
            match off.checked_add(len) {
                Some(end) if end <= area_end => {}
                _ => {
                    return Err(bad(format!(
                        "keyslot {id} area [{off}, +{len}] overflows the keyslots area (ends at {area_end})"
                    )));
                }
            }
            areas.push((off, len, *id));
        }
        areas.sort();
        for w in areas.windows(2) {
            if w[0].0 + w[0].1 > w[1].0 {
                return Err(bad(format!(
                    "keyslot areas {} and {} overlap",
                    w[0].2, w[1].2
                )));
            }
        }
        Ok(())
    }

    /// The segment data goes through: the lowest-numbered crypt segment that is not a backup.
    pub(crate) fn default_segment(&self) -> Option<(u32, &Segment)> {
        self.segments
            .iter()
            .find(|(_, s)| !s.is_backup())
            .map(|(id, s)| (*id, s))
    }

    /// The digest that checks the volume key of segment `seg`.
    pub(crate) fn segment_digest(&self, seg: u32) -> Option<(u32, &Digest)> {
        self.digests
            .iter()
            .find(|(_, d)| d.segments.contains(&seg))
            .map(|(id, d)| (*id, d))
    }
}
