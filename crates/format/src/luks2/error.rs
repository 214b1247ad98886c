//! Errors specific to LUKS2 metadata.

use std::fmt;

/// What can be wrong with LUKS2 metadata, or with an operation on it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Luks2Error {
    /// One header copy is unusable (bad magic, version, size, checksum, JSON, ...).
    InvalidCopy {
        /// Which copy: "primary" or "secondary".
        copy: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// Neither the primary nor the secondary header copy is usable.
    NoValidCopy {
        /// Why the primary copy (at offset 0) was rejected.
        primary: String,
        /// Why the secondary copy was rejected, or that none was found at any offset the
        /// format allows.
        secondary: String,
    },
    /// The JSON metadata parses but violates the LUKS2 rules (as cryptsetup validates them).
    InvalidMetadata(String),
    /// The header carries mandatory requirements this implementation does not support
    /// (e.g. an interrupted reencryption); the volume must not be opened or changed.
    UnmetRequirements(Vec<String>),
    /// One header copy is damaged and another format's signature (named) is on the
    /// device: the header is not used until `repair` says it is the one to keep.
    AmbiguousSignatures(String),
    /// A keyslot, digest or segment uses something this implementation cannot compute.
    Unsupported(String),
    /// The new JSON does not fit the JSON area.
    JsonTooLarge {
        /// Bytes the serialized JSON needs, its terminating NUL included.
        need: u64,
        /// Bytes of the JSON area (header copy size minus the 4096-byte binary header).
        have: u64,
    },
    /// No gap in the keyslots area is large enough for another keyslot.
    NoKeyslotSpace,
    /// The volume key given does not match the volume's digest.
    VolumeKeyMismatch,
    /// Label or subsystem too long (47 bytes max) or containing NUL.
    InvalidLabel(String),
    /// `--uuid` is not a UUID.
    InvalidUuid(String),
    /// The change must wait until the volume's unfinished reencryption is done.
    InReencryption,
    /// The reencryption verification digest is missing or does not match the keys and
    /// the reencryption metadata (which may have been tampered with).
    ReencryptionDigest(&'static str),
    /// A reencryption step was cut off (this regular segment is flagged
    /// `in-reencryption`); its hot zone must be recovered before the data can be used.
    ReencryptionCrashed(u32),
    /// The volume holds plaintext only (a decryption has finished): there is no key.
    PlainData(u64),
}

impl fmt::Display for Luks2Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Luks2Error::InvalidCopy { copy, reason } => {
                write!(f, "{copy} header invalid: {reason}")
            }
            Luks2Error::NoValidCopy { primary, secondary } => write!(
                f,
                "no valid header copy (primary: {primary}; secondary: {secondary})"
            ),
            Luks2Error::InvalidMetadata(s) => write!(f, "invalid JSON metadata: {s}"),
            Luks2Error::UnmetRequirements(r) => write!(
                f,
                "unmet mandatory requirements [{}]; refusing to use this device",
                r.join(", ")
            ),
            Luks2Error::AmbiguousSignatures(other) => write!(
                f,
                "Device contains ambiguous signatures ({other} beside a damaged LUKS2 header copy), cannot auto-recover LUKS2.\nPlease run \"repair\" for recovery."
            ),
            Luks2Error::Unsupported(s) => write!(f, "unsupported: {s}"),
            Luks2Error::JsonTooLarge { need, have } => {
                write!(
                    f,
                    "JSON metadata needs {need} bytes but the area has {have}"
                )
            }
            Luks2Error::NoKeyslotSpace => {
                write!(f, "no space for a new keyslot in the keyslots area")
            }
            Luks2Error::VolumeKeyMismatch => write!(f, "volume key does not match the volume"),
            Luks2Error::InvalidLabel(s) => write!(f, "invalid label or subsystem: {s}"),
            Luks2Error::InvalidUuid(s) => write!(f, "wrong LUKS UUID format provided: '{s}'"),
            Luks2Error::InReencryption => write!(
                f,
                "operation incompatible with a volume in LUKS2 reencryption; finish or \
                 resume the reencryption first"
            ),
            Luks2Error::ReencryptionDigest(why) => write!(
                f,
                "reencryption metadata is invalid: its verification digest {why}"
            ),
            Luks2Error::PlainData(off) => write!(
                f,
                "the volume is decrypted (no encrypted data, no key): its plaintext starts at \
                 byte {off} of the data device"
            ),
            Luks2Error::ReencryptionCrashed(seg) => write!(
                f,
                "a reencryption step was interrupted (segment {seg} is in reencryption): its \
                 hot zone must be recovered first (`cryptsetup repair` does it)"
            ),
        }
    }
}

impl std::error::Error for Luks2Error {}
