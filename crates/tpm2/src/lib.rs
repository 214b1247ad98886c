//! A TPM 2.0 for cryptblk's tokens: the few commands that seal and unseal a secret to a
//! key under a primary key, with PCR and PIN policies, through the TCG software stack's
//! Enhanced System API (`libtss2-esys`).
//!
//! The TSS libraries are loaded when a TPM is first opened (`dlopen`), not linked:
//! cryptblk builds and runs without them, and says which package to install when a TPM
//! token is used without them. No C structure layout is spelled out here: every structure
//! is built in the TPM's own wire format ([`wire`]) and handed to the TSS's unmarshalling
//! functions (`libtss2-mu`), which fill an opaque buffer the ESAPI call then reads; what
//! the ESAPI returns is marshalled back the same way. The TPM is reached through a TCTI
//! (`libtss2-tctildr`): a device (`device:/dev/tpmrm0`), or `swtpm:host=...,port=...`.

// FFI to the TSS: every block says why it is sound.
#![allow(unsafe_code)]

mod esys;
mod seal;
pub mod wire;

pub use esys::{Object, Session, Tpm};
pub use seal::{Authorized, FindSignature, Parent, Policy, policy_digest, seal, unseal};

/// TPM algorithm ids (TPM 2.0 part 2, table 9) used by the tokens.
pub mod alg {
    /// RSA keys.
    pub const RSA: u16 = 0x0001;
    /// SHA-1.
    pub const SHA1: u16 = 0x0004;
    /// RSASSA-PKCS1-v1_5 signatures.
    pub const RSASSA: u16 = 0x0014;
    /// AES.
    pub const AES: u16 = 0x0006;
    /// A keyed-hash object: what sealed data is.
    pub const KEYEDHASH: u16 = 0x0008;
    /// SHA-256.
    pub const SHA256: u16 = 0x000b;
    /// SHA-384.
    pub const SHA384: u16 = 0x000c;
    /// SHA-512.
    pub const SHA512: u16 = 0x000d;
    /// No algorithm.
    pub const NULL: u16 = 0x0010;
    /// Elliptic-curve keys.
    pub const ECC: u16 = 0x0023;
    /// Cipher feedback mode.
    pub const CFB: u16 = 0x0043;

    /// The id of a hash by the name systemd and tpm2-tools give it.
    pub fn hash_by_name(name: &str) -> Option<u16> {
        Some(match name.to_ascii_lowercase().as_str() {
            "sha1" => SHA1,
            "sha256" => SHA256,
            "sha384" => SHA384,
            "sha512" => SHA512,
            _ => return None,
        })
    }
}

/// Object templates (`TPM2B_PUBLIC`, wire form).
pub mod template {
    use super::alg;
    use crate::wire::Wire;

    /// restricted | decrypt | fixedTPM | fixedParent | sensitiveDataOrigin | userWithAuth:
    /// a storage key, as the TCG's provisioning guidance and systemd and tpm2-tools make
    /// their primary keys.
    pub const STORAGE_ATTRIBUTES: u32 = 0x0003_0072;

    /// The storage primary key of `key_alg` (ECC NIST P-256 or RSA 2048), AES-128-CFB for
    /// its children, name hash `name_hash`, no policy, empty unique: the same template
    /// always gives the same key in a hierarchy, which is how a sealed object's parent is
    /// found again without storing it.
    pub fn storage_primary(key_alg: u16, name_hash: u16) -> Option<Wire> {
        let head = Wire::new()
            .u16(key_alg)
            .u16(name_hash)
            .u32(STORAGE_ATTRIBUTES)
            .sized(&[])
            .u16(alg::AES)
            .u16(128)
            .u16(alg::CFB)
            .u16(alg::NULL);
        Some(
            match key_alg {
                alg::ECC => head.u16(0x0003).u16(alg::NULL).sized(&[]).sized(&[]),
                alg::RSA => head.u16(2048).u32(0).sized(&[]),
                _ => return None,
            }
            .into_sized(),
        )
    }

    /// fixedTPM | fixedParent: a sealed object systemd makes, usable through its policy
    /// only (no userWithAuth).
    pub const SYSTEMD_SEALED: u32 = 0x0000_0012;
    /// fixedTPM | fixedParent | noDA | adminWithPolicy: a sealed object clevis makes
    /// under a PCR policy (`CLEVIS_SEALED | USER_WITH_AUTH` without one).
    pub const CLEVIS_SEALED: u32 = 0x0000_0492;
    /// userWithAuth: the object's authorization value (empty) may be used directly.
    pub const USER_WITH_AUTH: u32 = 0x0000_0040;

    /// A sealed data object with these attributes, name hash and policy.
    pub fn sealed(name_hash: u16, attributes: u32, policy: &[u8]) -> Wire {
        Wire::new()
            .u16(alg::KEYEDHASH)
            .u16(name_hash)
            .u32(attributes)
            .sized(policy)
            .u16(alg::NULL)
            .sized(&[])
            .into_sized()
    }

    /// decrypt | sign | userWithAuth: the attributes systemd gives the public key of its
    /// signed PCR policies when it loads it.
    pub const SYSTEMD_POLICY_KEY: u32 = 0x0006_0040;

    /// The public part of an RSA key (`n`, `e` big-endian, no leading zeros) as systemd
    /// loads the key that signs PCR policies (`--tpm2-public-key`): name hash SHA-256, no
    /// symmetric or signing scheme, [`SYSTEMD_POLICY_KEY`]. The key's name, which the
    /// policy digest holds, depends on every byte here. systemd writes the exponent's
    /// big-endian bytes at the start of a little-endian 32-bit field: what the TPM reads
    /// is that, which is the exponent itself for 65537 (01 00 01) and for any exponent of
    /// one byte. `None` for a modulus over 512 bytes or an exponent over 4.
    pub fn rsa_public(n: &[u8], e: &[u8]) -> Option<Wire> {
        if n.is_empty() || n.len() > 512 || e.is_empty() || e.len() > 4 {
            return None;
        }
        let mut exponent = [0u8; 4];
        exponent[..e.len()].copy_from_slice(e);
        rsa_public_with_exponent(n, u32::from_le_bytes(exponent))
    }

    /// [`rsa_public`] with the exponent field as given: systemd 255.0 to 255.2 wrote 0
    /// (the TPM's "default exponent"), which gives the key another name, and so tokens
    /// those versions enrolled another policy digest (systemd#30546; 255.4+ retry so).
    pub fn rsa_public_with_exponent(n: &[u8], exponent: u32) -> Option<Wire> {
        if n.is_empty() || n.len() > 512 {
            return None;
        }
        Some(
            Wire::new()
                .u16(alg::RSA)
                .u16(alg::SHA256)
                .u32(SYSTEMD_POLICY_KEY)
                .sized(&[])
                .u16(alg::NULL)
                .u16(alg::NULL)
                .u16(u16::try_from(n.len() * 8).ok()?)
                .u32(exponent)
                .sized(n)
                .into_sized(),
        )
    }

    /// An RSASSA-PKCS1-v1_5 signature with SHA-256 (`TPMT_SIGNATURE`), as systemd-measure
    /// signs PCR policies.
    pub fn rsassa_sha256_signature(signature: &[u8]) -> Wire {
        Wire::new()
            .u16(alg::RSASSA)
            .u16(alg::SHA256)
            .sized(signature)
    }

    /// The symmetric definition of salted sessions: AES-128-CFB.
    pub fn aes128_cfb() -> Wire {
        Wire::new().u16(alg::AES).u16(128).u16(alg::CFB)
    }
}

/// Why a TPM operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The TSS libraries are missing or too old.
    Library(String),
    /// No TPM could be reached (the TCTI would not start).
    Unreachable {
        /// The TCTI configuration tried.
        tcti: String,
        /// The TSS's response code.
        rc: u32,
    },
    /// The TPM (or the TSS) refused a command.
    Command {
        /// The ESAPI function.
        call: &'static str,
        /// Its response code.
        rc: u32,
    },
    /// A structure given to the TPM is malformed.
    Format(String),
    /// The policy reached is not the one the secret was sealed with: the PCRs do not hold
    /// the values they held at sealing (or another PCR selection).
    PolicyMismatch,
}

impl Error {
    /// The TPM's error number without the handle, session or parameter it names, when the
    /// TPM itself answered (layer 0).
    pub fn tpm_code(&self) -> Option<u32> {
        let Error::Command { rc, .. } = self else {
            return None;
        };
        if rc >> 16 != 0 {
            return None;
        }
        Some(if rc & 0x80 != 0 {
            rc & 0xbf
        } else {
            rc & 0xfff
        })
    }

    /// The TPM refused an authorization value: a wrong PIN.
    pub fn is_bad_auth(&self) -> bool {
        matches!(self.tpm_code(), Some(0x08e | 0x0a2))
    }

    /// The TPM refused a policy: the PCRs are not what the secret was sealed to.
    pub fn is_policy_failure(&self) -> bool {
        matches!(self.tpm_code(), Some(0x099 | 0x09d | 0x128))
    }

    /// The TPM is locked out after too many wrong PINs.
    pub fn is_lockout(&self) -> bool {
        matches!(self.tpm_code(), Some(0x921))
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Library(m) => f.write_str(m),
            Error::Unreachable { tcti, rc } => {
                write!(f, "no TPM reached through '{tcti}' (TSS error {rc:#x})")
            }
            Error::Command { call, rc } => {
                let why = if self.is_bad_auth() {
                    ": wrong PIN (authorization failed)"
                } else if self.is_policy_failure() {
                    ": the policy does not hold (PCRs changed since enrollment?)"
                } else if self.is_lockout() {
                    ": the TPM is in dictionary-attack lockout"
                } else {
                    ""
                };
                write!(f, "{call} failed with TPM/TSS error {rc:#x}{why}")
            }
            Error::Format(m) => f.write_str(m),
            Error::PolicyMismatch => f.write_str(
                "the TPM's PCRs do not hold the values the secret was sealed to (changed since \
                 enrollment?)",
            ),
        }
    }
}

impl std::error::Error for Error {}

/// The TCTI configuration for a `--tpm2-device` value as systemd takes it: `auto` (or
/// nothing) is the first kernel resource manager device (`/dev/tpmrm0`...), a path is that
/// device, anything else (`swtpm:host=...`, `mssim:...`) is a TCTI configuration as it is.
pub fn tcti_for(device: Option<&str>) -> Result<String, Error> {
    match device {
        None | Some("auto") => {
            let mut found: Vec<String> = std::fs::read_dir("/sys/class/tpmrm")
                .map(|d| {
                    d.filter_map(|e| Some(e.ok()?.file_name().to_str()?.to_owned()))
                        .collect()
                })
                .unwrap_or_default();
            found.sort();
            match found.first() {
                Some(name) => Ok(format!("device:/dev/{name}")),
                None => Err(Error::Library(
                    "no TPM2 device found (no /sys/class/tpmrm/*): name one with --tpm2-device"
                        .into(),
                )),
            }
        }
        Some(path) if path.starts_with('/') => Ok(format!("device:{path}")),
        Some(tcti) => Ok(tcti.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_codes_are_decoded() {
        let e = |rc| Error::Command {
            call: "Esys_Unseal",
            rc,
        };
        assert!(e(0x98e).is_bad_auth(), "session 1, TPM_RC_AUTH_FAIL");
        assert!(e(0x9a2).is_bad_auth(), "session 1, TPM_RC_BAD_AUTH");
        assert!(
            e(0x99d).is_policy_failure(),
            "session 1, TPM_RC_POLICY_FAIL"
        );
        assert!(e(0x128).is_policy_failure(), "TPM_RC_PCR_CHANGED");
        assert!(e(0x921).is_lockout());
        assert!(
            !e(0x7_098e).is_bad_auth(),
            "an ESAPI-layer code is not the TPM's"
        );
        assert!(e(0x98e).to_string().contains("wrong PIN"));
        assert_eq!(tcti_for(Some("/dev/tpmrm1")).unwrap(), "device:/dev/tpmrm1");
        // systemd's policy key: RSA, SHA-256 name, decrypt|sign|userWithAuth, no scheme,
        // the key's bits, the exponent as systemd's little-endian copy leaves it.
        let n = [0xc5u8; 256];
        let k = template::rsa_public(&n, &[1, 0, 1]).unwrap().0;
        assert_eq!(
            &k[..18],
            &[
                0x01, 0x16, 0x00, 0x01, 0x00, 0x0b, 0x00, 0x06, 0x00, 0x40, 0x00, 0x00, 0x00, 0x10,
                0x00, 0x10, 0x08, 0x00
            ]
        );
        assert_eq!(&k[18..22], &65537u32.to_be_bytes());
        assert_eq!(&k[22..24], &[0x01, 0x00]);
        assert_eq!(k.len(), 24 + 256);
        let k3 = template::rsa_public(&n, &[3]).unwrap().0;
        assert_eq!(&k3[18..22], &3u32.to_be_bytes());
        assert!(template::rsa_public(&n, &[1, 0, 0, 0, 1]).is_none());
        assert_eq!(
            tcti_for(Some("swtpm:host=127.0.0.1,port=2321")).unwrap(),
            "swtpm:host=127.0.0.1,port=2321"
        );
    }
}
