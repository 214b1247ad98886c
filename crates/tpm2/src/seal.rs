//! Sealing a secret to a TPM under a PCR (and PIN) policy, and unsealing it: the scheme
//! systemd-cryptenroll and clevis's tpm2 pin share. The sealed object's parent is a
//! primary storage key regenerated from its template each time (or a persistent storage
//! root key); its use is bound to a policy session that proves the PCRs hold what they
//! held at sealing (PolicyPCR) and, with a PIN, that the PIN is known (PolicyAuthValue).
//! Sessions are salted with the parent key and the unsealed secret comes back encrypted
//! (AES-128-CFB), so nobody on the way to the TPM (a bus, a socket to swtpm) sees it.

use crate::esys::{Object, Session, Tpm};
use crate::template::{aes128_cfb, storage_primary};
use crate::wire::{Wire, pcr_selection, split_sized};
use crate::{Error, alg};
use zeroize::Zeroizing;

/// Where the sealed object's parent comes from.
#[derive(Debug, Clone, Copy)]
pub enum Parent<'a> {
    /// A primary storage key of this algorithm (ECC or RSA) and name hash, made again
    /// from the template each time.
    Primary {
        /// `alg::ECC` or `alg::RSA`.
        key_alg: u16,
        /// The primary's name hash (clevis: its `hash`; systemd: SHA-256).
        name_hash: u16,
    },
    /// A persistent key by its ESAPI serialization (systemd's `tpm2_srk`).
    Serialized(&'a [u8]),
}

/// Finds the signature (`TPMT_SIGNATURE`, wire form) of an approved policy digest.
pub type FindSignature<'a> = dyn Fn(&[u8]) -> Result<Wire, Error> + 'a;

/// A signed PCR policy (systemd's `--tpm2-public-key`): the PCRs may hold any values a
/// key's owner signed (the values a boot of a signed kernel image gives), not those they
/// held at sealing. PolicyAuthorize: the TPM checks the signature of the policy reached.
#[derive(Clone, Copy)]
pub struct Authorized<'a> {
    /// The signing key's public part (`TPM2B_PUBLIC`, wire form: see
    /// [`template::rsa_public`](crate::template::rsa_public)).
    pub key: &'a Wire,
    /// The PCRs the signatures cover (systemd: 11).
    pub pcrs: &'a [u32],
    /// The signature (`TPMT_SIGNATURE`, wire form) of an approved policy digest, when
    /// unsealing (the PCRs' current policy is passed); `None` when sealing.
    pub signature: Option<&'a FindSignature<'a>>,
}

/// What the sealed object's policy asks for.
#[derive(Clone, Copy)]
pub struct Policy<'a> {
    /// The PCR bank (`alg::SHA256`...).
    pub pcr_bank: u16,
    /// The PCRs whose values at sealing must hold (empty: none).
    pub pcrs: &'a [u32],
    /// The authorization value (a PIN's hash) shown with PolicyAuthValue, if any.
    pub auth: Option<&'a [u8]>,
    /// A signed PCR policy, if any (in the policy's bank).
    pub authorized: Option<Authorized<'a>>,
}

/// The TPM's `TPM_ST_VERIFIED` ticket with no digest: what PolicyAuthorize takes in a
/// trial session (systemd's enrollment), where signatures are not checked.
fn no_ticket() -> Vec<u8> {
    Wire::new().u16(0x8022).u32(0x4000_0001).sized(&[]).0
}

/// Runs `policy`'s assertions in `session`, in systemd's order: the signed PCR policy
/// (PolicyPCR over its PCRs, then PolicyAuthorize of the digest reached), PolicyPCR over
/// the PCRs whose values at sealing must hold, PolicyAuthValue.
fn assert_policy(tpm: &Tpm, session: &Session, policy: &Policy, trial: bool) -> Result<(), Error> {
    if let Some(a) = &policy.authorized {
        let (key, name) = tpm.load_external(a.key)?;
        tpm.policy_pcr(session, &[], &pcr_selection(policy.pcr_bank, a.pcrs), None)?;
        let approved = tpm.policy_digest(session)?;
        let ticket = match (trial, a.signature) {
            (true, _) => no_ticket(),
            (false, Some(find)) => {
                let signature = find(&approved)?;
                // The TPM checks RSASSA/ECDSA over a digest: that of the approved policy
                // (and the empty policyRef), which is what systemd-measure signs.
                use sha2::Digest as _;
                tpm.verify_signature(&key, &sha2::Sha256::digest(&approved), &signature)?
            }
            (false, None) => {
                return Err(Error::Format(
                    "a signed PCR policy needs a signature to unseal".into(),
                ));
            }
        };
        tpm.policy_authorize(session, &approved, &name, &ticket)?;
    }
    if !policy.pcrs.is_empty() {
        tpm.policy_pcr(
            session,
            &[],
            &pcr_selection(policy.pcr_bank, policy.pcrs),
            None,
        )?;
    }
    if policy.auth.is_some() {
        tpm.policy_auth_value(session, None)?;
    }
    Ok(())
}

/// The `nameAlg` and `authPolicy` of a `TPM2B_PUBLIC` (wire form).
fn name_alg_and_policy(public: &[u8]) -> Result<(u16, &[u8]), Error> {
    let short = || Error::Format("a sealed object's public part is truncated".into());
    let body = public.get(2..).ok_or_else(short)?;
    let name_alg = u16::from_be_bytes(body.get(2..4).ok_or_else(short)?.try_into().unwrap());
    let (policy, _) = split_sized(body.get(8..).ok_or_else(short)?).ok_or_else(short)?;
    Ok((name_alg, &policy[2..]))
}

fn parent<'t>(tpm: &'t Tpm, parent: &Parent) -> Result<Object<'t>, Error> {
    match *parent {
        Parent::Primary { key_alg, name_hash } => {
            let template = storage_primary(key_alg, name_hash).ok_or_else(|| {
                Error::Format(format!("primary key algorithm {key_alg:#x} (ECC or RSA)"))
            })?;
            tpm.create_primary(&template, None)
        }
        Parent::Serialized(b) => tpm.deserialize(b),
    }
}

/// Unseals the object (`TPM2B_PRIVATE`, `TPM2B_PUBLIC`, wire form) under `parent`,
/// satisfying `policy`. Before unsealing, the policy reached is compared with the one the
/// object was sealed with: a mismatch (the PCRs moved) is [`Error::PolicyMismatch`].
pub fn unseal(
    tpm: &Tpm,
    from: &Parent,
    private: &[u8],
    public: &[u8],
    policy: &Policy,
) -> Result<Zeroizing<Vec<u8>>, Error> {
    let (name_hash, wanted) = name_alg_and_policy(public)?;
    let primary = parent(tpm, from)?;
    let key = tpm.load(&primary, private, public, None)?;
    if let Some(auth) = policy.auth {
        tpm.set_auth(&key, auth)?;
    }
    // Response encryption only: Unseal has no parameter to encrypt on the way in.
    let protect = tpm.start_session(Some(&primary), 0, &aes128_cfb(), alg::SHA256, 0x41)?;
    if wanted.is_empty() {
        // No policy: the object's authorization value (clevis without PCRs).
        return tpm.unseal(&key, None, Some(&protect));
    }
    let session = tpm.start_session(Some(&primary), 1, &aes128_cfb(), name_hash, 0x01)?;
    assert_policy(tpm, &session, policy, false)?;
    if tpm.policy_digest(&session)? != wanted {
        return Err(Error::PolicyMismatch);
    }
    tpm.unseal(&key, Some(&session), Some(&protect))
}

/// The policy digest of `policy` (PCRs at their current values), computed by the TPM in
/// a trial session with the hash `name_hash`.
pub fn policy_digest(tpm: &Tpm, name_hash: u16, policy: &Policy) -> Result<Vec<u8>, Error> {
    let trial = tpm.start_session(None, 3, &Wire::new().u16(alg::NULL), name_hash, 0x01)?;
    assert_policy(tpm, &trial, policy, true)?;
    tpm.policy_digest(&trial)
}

/// Seals `secret` under `parent` to `policy` (the PCRs' current values, the PIN's hash as
/// the object's authorization value): an object of `attributes` (e.g.
/// [`SYSTEMD_SEALED`](crate::template::SYSTEMD_SEALED)) with name hash `name_hash`, its
/// policy computed with that hash. Returns its `TPM2B_PRIVATE` and `TPM2B_PUBLIC` (wire
/// form) and the policy digest.
#[allow(clippy::type_complexity)]
pub fn seal(
    tpm: &Tpm,
    to: &Parent,
    policy: &Policy,
    name_hash: u16,
    attributes: u32,
    secret: &[u8],
) -> Result<(Vec<u8>, Vec<u8>, Vec<u8>), Error> {
    // An object usable with its (empty) authorization value needs no policy; one that
    // is not gets the policy even when it is empty (all zeros: any policy session).
    let open = attributes & crate::template::USER_WITH_AUTH != 0;
    let digest =
        if open && policy.pcrs.is_empty() && policy.auth.is_none() && policy.authorized.is_none() {
            Vec::new()
        } else {
            policy_digest(tpm, name_hash, policy)?
        };
    let primary = parent(tpm, to)?;
    let protect = tpm.start_session(Some(&primary), 0, &aes128_cfb(), alg::SHA256, 0x21)?;
    let (private, public) = tpm.seal(
        &primary,
        &crate::template::sealed(name_hash, attributes, &digest),
        policy.auth.unwrap_or_default(),
        secret,
        Some(&protect),
    )?;
    Ok((private, public, digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_objects_policy_is_read_from_its_public_part() {
        let public = crate::template::sealed(alg::SHA256, 0x12, &[7u8; 32]);
        let (name_alg, policy) = name_alg_and_policy(&public.0).unwrap();
        assert_eq!((name_alg, policy), (alg::SHA256, &[7u8; 32][..]));
        assert!(name_alg_and_policy(&public.0[..20]).is_err());
        // tpm2-tools' ECC storage primary for SHA-256, byte for byte.
        assert_eq!(
            storage_primary(alg::ECC, alg::SHA256).unwrap().0,
            [
                0x00, 0x1a, 0x00, 0x23, 0x00, 0x0b, 0x00, 0x03, 0x00, 0x72, 0x00, 0x00, 0x00, 0x06,
                0x00, 0x80, 0x00, 0x43, 0x00, 0x10, 0x00, 0x03, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00
            ]
        );
        assert_eq!(
            storage_primary(alg::RSA, alg::SHA256).unwrap().0.len(),
            0x1a + 2
        );
    }
}
