//! The 4096-byte binary header in front of each JSON area, and whole header copies
//! (binary header + JSON area, `hdr_size` bytes) with their checksum.
//!
//! Layout (big-endian integers), as in the LUKS2 on-disk format specification:
//! magic[6] @0, version u16 @6, hdr_size u64 @8, seqid u64 @16, label[48] @24,
//! checksum_alg[32] @72, salt[64] @104, uuid[40] @168, subsystem[48] @208,
//! hdr_offset u64 @256, padding @264, csum[64] @448, padding to 4096.

use cryptblk_crypto::HashAlg;
use serde_json::Value;

use crate::Storage;

pub(super) const BIN_HDR_LEN: usize = 4096;
pub(super) const PRIMARY_MAGIC: &[u8; 6] = b"LUKS\xba\xbe";
pub(super) const SECONDARY_MAGIC: &[u8; 6] = b"SKUL\xba\xbe";
/// The only valid sizes of one header copy; the secondary copy starts at `hdr_size`, so
/// these are also the offsets where a secondary copy can be found.
pub const HDR_SIZES: [u64; 9] = [
    0x4000, 0x8000, 0x1_0000, 0x2_0000, 0x4_0000, 0x8_0000, 0x10_0000, 0x20_0000, 0x40_0000,
];
/// Label and subsystem fields; the last byte is always NUL.
pub(super) const LABEL_LEN: usize = 48;
pub(super) const UUID_LEN: usize = 40;
const CSUM_ALG_LEN: usize = 32;
pub(super) const SALT_LEN: usize = 64;

const OFF_VERSION: usize = 6;
const OFF_HDR_SIZE: usize = 8;
const OFF_SEQID: usize = 16;
const OFF_LABEL: usize = 24;
const OFF_CSUM_ALG: usize = 72;
const OFF_SALT: usize = 104;
const OFF_UUID: usize = 168;
const OFF_SUBSYSTEM: usize = 208;
const OFF_HDR_OFFSET: usize = 256;
const OFF_CSUM: usize = 448;
const CSUM_LEN: usize = 64;

/// The fields of one binary header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BinHeader {
    pub secondary: bool,
    pub hdr_size: u64,
    pub seqid: u64,
    pub label: String,
    pub checksum_alg: String,
    pub salt: [u8; SALT_LEN],
    pub uuid: String,
    pub subsystem: String,
    pub hdr_offset: u64,
}

fn be64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(a)
}

/// A NUL-terminated string field (NUL at the end is implied if missing).
fn cstr(b: &[u8], off: usize, len: usize) -> String {
    let f = &b[off..off + len];
    let end = f.iter().position(|&c| c == 0).unwrap_or(len);
    String::from_utf8_lossy(&f[..end]).into_owned()
}

fn put_cstr(b: &mut [u8], off: usize, len: usize, s: &str) {
    // Callers validate lengths; truncation keeps the terminating NUL in any case.
    let n = s.len().min(len - 1);
    b[off..off + n].copy_from_slice(&s.as_bytes()[..n]);
}

/// The checksum algorithm named in a header, if we can compute it.
pub(super) fn checksum_hash(name: &str) -> Result<HashAlg, String> {
    HashAlg::from_name(name).map_err(|_| format!("unsupported checksum algorithm '{name}'"))
}

impl BinHeader {
    /// Serializes the binary header with a zeroed checksum field.
    pub(super) fn encode(&self) -> [u8; BIN_HDR_LEN] {
        let mut b = [0u8; BIN_HDR_LEN];
        b[..6].copy_from_slice(if self.secondary {
            SECONDARY_MAGIC
        } else {
            PRIMARY_MAGIC
        });
        b[OFF_VERSION..OFF_VERSION + 2].copy_from_slice(&2u16.to_be_bytes());
        b[OFF_HDR_SIZE..OFF_HDR_SIZE + 8].copy_from_slice(&self.hdr_size.to_be_bytes());
        b[OFF_SEQID..OFF_SEQID + 8].copy_from_slice(&self.seqid.to_be_bytes());
        put_cstr(&mut b, OFF_LABEL, LABEL_LEN, &self.label);
        put_cstr(&mut b, OFF_CSUM_ALG, CSUM_ALG_LEN, &self.checksum_alg);
        b[OFF_SALT..OFF_SALT + SALT_LEN].copy_from_slice(&self.salt);
        put_cstr(&mut b, OFF_UUID, UUID_LEN, &self.uuid);
        put_cstr(&mut b, OFF_SUBSYSTEM, LABEL_LEN, &self.subsystem);
        b[OFF_HDR_OFFSET..OFF_HDR_OFFSET + 8].copy_from_slice(&self.hdr_offset.to_be_bytes());
        b
    }

    /// Parses and sanity-checks a binary header found at `offset`.
    pub(super) fn decode(b: &[u8; BIN_HDR_LEN], offset: u64) -> Result<Self, String> {
        let secondary = match &b[..6] {
            m if m == PRIMARY_MAGIC => false,
            m if m == SECONDARY_MAGIC => true,
            _ => return Err("bad magic".into()),
        };
        if secondary != (offset != 0) {
            return Err(format!(
                "{} magic at offset {offset}",
                if secondary { "secondary" } else { "primary" }
            ));
        }
        let version = u16::from_be_bytes([b[OFF_VERSION], b[OFF_VERSION + 1]]);
        if version != 2 {
            return Err(format!("version {version} is not 2"));
        }
        let hdr_size = be64(b, OFF_HDR_SIZE);
        if !HDR_SIZES.contains(&hdr_size) {
            return Err(format!("invalid header size {hdr_size}"));
        }
        let hdr_offset = be64(b, OFF_HDR_OFFSET);
        if hdr_offset != offset {
            return Err(format!(
                "header offset field {hdr_offset} does not match its position {offset}"
            ));
        }
        if secondary && hdr_offset != hdr_size {
            return Err(format!(
                "secondary header at {hdr_offset} but header size is {hdr_size}"
            ));
        }
        let mut salt = [0u8; SALT_LEN];
        salt.copy_from_slice(&b[OFF_SALT..OFF_SALT + SALT_LEN]);
        Ok(BinHeader {
            secondary,
            hdr_size,
            seqid: be64(b, OFF_SEQID),
            label: cstr(b, OFF_LABEL, LABEL_LEN),
            checksum_alg: cstr(b, OFF_CSUM_ALG, CSUM_ALG_LEN),
            salt,
            uuid: cstr(b, OFF_UUID, UUID_LEN),
            subsystem: cstr(b, OFF_SUBSYSTEM, LABEL_LEN),
            hdr_offset,
        })
    }
}

/// Checksum of a whole copy (`hdr_size` bytes) with the checksum field taken as zeros.
fn checksum(alg: HashAlg, area: &[u8]) -> Vec<u8> {
    let zeros = [0u8; CSUM_LEN];
    let mut out = vec![0u8; alg.output_len()];
    alg.digest_parts(
        &[&area[..OFF_CSUM], &zeros, &area[OFF_CSUM + CSUM_LEN..]],
        &mut out,
    );
    out
}

/// Builds one complete copy: binary header, JSON text, zero padding and checksum.
pub(super) fn encode_copy(bin: &BinHeader, json_text: &[u8]) -> Result<Vec<u8>, String> {
    let alg = checksum_hash(&bin.checksum_alg)?;
    let size = usize::try_from(bin.hdr_size).map_err(|_| "header size")?;
    if json_text.len() >= size - BIN_HDR_LEN {
        return Err("JSON does not fit".into());
    }
    let mut area = vec![0u8; size];
    area[..BIN_HDR_LEN].copy_from_slice(&bin.encode());
    area[BIN_HDR_LEN..BIN_HDR_LEN + json_text.len()].copy_from_slice(json_text);
    let sum = checksum(alg, &area);
    area[OFF_CSUM..OFF_CSUM + sum.len()].copy_from_slice(&sum);
    Ok(area)
}

/// One header copy read from disk with a good checksum and well-formed JSON
/// (not yet validated against the LUKS2 rules).
#[derive(Debug, Clone)]
pub(super) struct RawCopy {
    pub bin: BinHeader,
    pub json: Value,
}

/// Why a copy could not be read; `magic` tells whether a LUKS2 magic was there at all.
#[derive(Debug, Clone)]
pub(super) struct CopyFailure {
    pub magic: bool,
    pub reason: String,
}

/// Reads and checks the copy at `offset` (0 for the primary).
pub(super) fn read_copy(dev: &mut dyn Storage, offset: u64) -> Result<RawCopy, CopyFailure> {
    let fail = |magic: bool, reason: String| CopyFailure { magic, reason };
    let dev_size = dev
        .size()
        .map_err(|e| fail(false, format!("I/O error: {e}")))?;
    if dev_size < offset.saturating_add(BIN_HDR_LEN as u64) {
        return Err(fail(
            false,
            format!("device too small ({dev_size} bytes) for a header at {offset}"),
        ));
    }
    let mut b = [0u8; BIN_HDR_LEN];
    dev.read_at(&mut b, offset)
        .map_err(|e| fail(false, format!("I/O error: {e}")))?;
    let magic = b[..6] == *PRIMARY_MAGIC || b[..6] == *SECONDARY_MAGIC;
    let bin = BinHeader::decode(&b, offset).map_err(|r| fail(magic, r))?;
    let alg = checksum_hash(&bin.checksum_alg).map_err(|r| fail(true, r))?;
    if dev_size < offset + bin.hdr_size {
        return Err(fail(
            true,
            format!("truncated: header needs {} bytes at {offset}", bin.hdr_size),
        ));
    }
    // hdr_size is at most 4 MiB (checked in decode).
    let mut area = vec![0u8; bin.hdr_size as usize];
    dev.read_at(&mut area, offset)
        .map_err(|e| fail(true, format!("I/O error: {e}")))?;
    let sum = checksum(alg, &area);
    if area[OFF_CSUM..OFF_CSUM + sum.len()] != sum[..] {
        return Err(fail(true, "checksum mismatch".into()));
    }
    let json_area = &area[BIN_HDR_LEN..];
    // cryptsetup's rules for the area: the JSON object starts at its first byte, and
    // every byte after the object's closing brace is NUL (at least one).
    if json_area.first() != Some(&b'{') {
        return Err(fail(true, "JSON area does not start with '{'".into()));
    }
    let end = json_area
        .iter()
        .position(|&c| c == 0)
        .ok_or_else(|| fail(true, "JSON area is not NUL-terminated".into()))?;
    let mut values = serde_json::Deserializer::from_slice(&json_area[..end]).into_iter::<Value>();
    let json: Value = values
        .next()
        .unwrap_or_else(|| Err(serde::de::Error::custom("empty")))
        .map_err(|e| fail(true, format!("JSON does not parse: {e}")))?;
    let json_len = values.byte_offset();
    if json_area[json_len..].iter().any(|&c| c != 0) {
        return Err(fail(
            true,
            format!("bytes other than NUL after the JSON text (at {json_len})"),
        ));
    }
    if !json.is_object() {
        return Err(fail(true, "JSON metadata is not an object".into()));
    }
    Ok(RawCopy { bin, json })
}
