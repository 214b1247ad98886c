//! What enrolling needs besides the token: the RSA public key in the token's X.509
//! certificate (a minimal DER walk to its SubjectPublicKeyInfo), and RSA encryption with
//! PKCS#1 v1.5 padding, as systemd-cryptenroll encrypts the key the token will decrypt.

use crate::Error;
use crypto_bigint::U4096;
use crypto_bigint::modular::runtime_mod::{DynResidue, DynResidueParams};
use zeroize::Zeroizing;

fn bad(what: &str) -> Error {
    Error::Key(format!("the token's certificate: {what}"))
}

/// One DER element at the start of `b`: (tag, contents, what follows).
fn tlv(b: &[u8]) -> Result<(u8, &[u8], &[u8]), Error> {
    let short = || bad("truncated DER");
    let (&tag, rest) = b.split_first().ok_or_else(short)?;
    let (&len0, rest) = rest.split_first().ok_or_else(short)?;
    let (len, rest) = if len0 < 0x80 {
        (len0 as usize, rest)
    } else {
        let n = (len0 & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return Err(bad("a bad DER length"));
        }
        let len = rest[..n].iter().fold(0usize, |a, &d| a << 8 | d as usize);
        (len, &rest[n..])
    };
    if rest.len() < len {
        return Err(short());
    }
    Ok((tag, &rest[..len], &rest[len..]))
}

fn expect(b: &[u8], want: u8) -> Result<(&[u8], &[u8]), Error> {
    let (tag, body, rest) = tlv(b)?;
    if tag != want {
        return Err(bad(&format!(
            "DER tag {tag:#x} where {want:#x} was expected"
        )));
    }
    Ok((body, rest))
}

/// rsaEncryption, 1.2.840.113549.1.1.1.
const RSA_ENCRYPTION: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
/// id-ecPublicKey, 1.2.840.10045.2.1.
const EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];

/// The public key of a token's X.509 certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicKey {
    /// RSA: modulus and public exponent, big-endian, no leading zeros.
    Rsa {
        /// The modulus.
        n: Vec<u8>,
        /// The public exponent.
        e: Vec<u8>,
    },
    /// EC: the named curve and the point (SEC1, as the certificate holds it).
    Ec {
        /// The curve.
        curve: crate::Curve,
        /// The point.
        point: Vec<u8>,
    },
}

/// The public key of an X.509 certificate (DER): RSA, or EC on P-256, P-384 or P-521.
pub fn public_key(cert: &[u8]) -> Result<PublicKey, Error> {
    let (cert, _) = expect(cert, 0x30)?;
    let (tbs, _) = expect(cert, 0x30)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = tlv(rest)?.2; // version
    }
    for _ in 0..5 {
        rest = tlv(rest)?.2; // serial, signature, issuer, validity, subject
    }
    let (spki, _) = expect(rest, 0x30)?;
    let (alg, key) = expect(spki, 0x30)?;
    let (oid, params) = expect(alg, 0x06)?;
    if oid == EC_PUBLIC_KEY {
        let (curve, _) = expect(params, 0x06)?;
        let curve = crate::Curve::from_oid(curve).ok_or_else(|| {
            Error::Key(
                "the token's certificate holds an EC key on a curve other than P-256, P-384 \
                 or P-521"
                    .into(),
            )
        })?;
        let (bits, _) = expect(key, 0x03)?;
        let point = bits.get(1..).ok_or_else(|| bad("an empty key"))?.to_vec();
        return Ok(PublicKey::Ec { curve, point });
    }
    if oid != RSA_ENCRYPTION {
        return Err(Error::Key(
            "the token's certificate holds neither an RSA nor an EC key (systemd-pkcs11 \
             tokens need one)"
                .into(),
        ));
    }
    let (bits, _) = expect(key, 0x03)?;
    let (seq, _) = expect(bits.get(1..).ok_or_else(|| bad("an empty key"))?, 0x30)?;
    let (n, rest) = expect(seq, 0x02)?;
    let (e, _) = expect(rest, 0x02)?;
    let strip = |v: &[u8]| {
        let first = v.iter().position(|&b| b != 0).unwrap_or(v.len());
        v[first..].to_vec()
    };
    Ok(PublicKey::Rsa {
        n: strip(n),
        e: strip(e),
    })
}

pub(crate) fn random(buf: &mut [u8]) -> Result<(), Error> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: getrandom writes at most the given length into the buffer's rest.
        let r = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if r < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::Library("no random numbers (getrandom)".into()));
        }
        done += r as usize;
    }
    Ok(())
}

/// `message` encrypted to the RSA key (`n`, `e`) with PKCS#1 v1.5 padding (RFC 8017
/// §7.2.1): `00 02 PS 00 M`, PS at least 8 random non-zero bytes.
pub fn rsa_encrypt_pkcs1(n: &[u8], e: &[u8], message: &[u8]) -> Result<Vec<u8>, Error> {
    let k = n.len();
    if !(256..=512).contains(&k) || n[k - 1] & 1 == 0 || e.is_empty() || e.len() > 8 {
        return Err(Error::Key(format!(
            "an RSA key of {} bits: 2048 to 4096 bits are supported",
            k * 8
        )));
    }
    if message.len() + 11 > k {
        return Err(Error::Key("the message is too long for the RSA key".into()));
    }
    let mut em = Zeroizing::new(vec![0u8; k]);
    em[1] = 2;
    let ps_end = k - message.len() - 1;
    random(&mut em[2..ps_end])?;
    for b in &mut em[2..ps_end] {
        while *b == 0 {
            let mut one = [0u8];
            random(&mut one)?;
            *b = one[0];
        }
    }
    em[k - message.len()..].copy_from_slice(message);
    let wide = |v: &[u8]| {
        let mut w = Zeroizing::new([0u8; 512]);
        w[512 - v.len()..].copy_from_slice(v);
        U4096::from_be_slice(&w[..])
    };
    let modulus = wide(n);
    let params = DynResidueParams::new(&modulus);
    let m = wide(&em);
    let exp = crypto_bigint::U64::from_be_slice(&{
        let mut w = [0u8; 8];
        w[8 - e.len()..].copy_from_slice(e);
        w
    });
    let c = DynResidue::new(&m, params).pow(&exp).retrieve();
    let mut out = vec![0u8; 512];
    let width = std::mem::size_of::<crypto_bigint::Word>();
    for (chunk, w) in out.rchunks_mut(width).zip(c.as_words()) {
        chunk.copy_from_slice(&w.to_be_bytes());
    }
    Ok(out[512 - k..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A textbook check with a tiny key is not possible at 2048 bits and up, so the
    /// round trip runs through openssl in the integration tests; here, the padding's
    /// shape and the DER walk's refusals.
    #[test]
    fn ders_that_are_not_certificates_are_refused() {
        assert!(public_key(&[]).is_err());
        assert!(public_key(&[0x30, 0x05, 0x30]).is_err());
        assert!(public_key(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(
            rsa_encrypt_pkcs1(&[0xff; 128], &[1, 0, 1], b"x").is_err(),
            "1024 bits"
        );
        assert!(
            rsa_encrypt_pkcs1(&[0xff; 256], &[1, 0, 1], &[0; 246]).is_err(),
            "too long"
        );
    }
}
