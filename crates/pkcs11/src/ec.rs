//! Enrolling an EC key (systemd 255+'s systemd-pkcs11 tokens): an ephemeral key pair on
//! the token's curve, made here; its ECDH with the token's public key is the secret, and
//! its public point is what the token stores (the token derives the same secret from it
//! with its private key at unlock).

use crate::Error;
use zeroize::Zeroizing;

/// A named curve systemd-pkcs11 tokens use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Curve {
    /// NIST P-256 (prime256v1).
    P256,
    /// NIST P-384 (secp384r1).
    P384,
    /// NIST P-521 (secp521r1).
    P521,
}

impl Curve {
    /// The curve an X.509 `namedCurve` OID (its DER contents) names.
    pub(crate) fn from_oid(oid: &[u8]) -> Option<Curve> {
        match oid {
            [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07] => Some(Curve::P256),
            [0x2b, 0x81, 0x04, 0x00, 0x22] => Some(Curve::P384),
            [0x2b, 0x81, 0x04, 0x00, 0x23] => Some(Curve::P521),
            _ => None,
        }
    }
}

/// ECDH with `peer` (a SEC1 point on `curve`) from a fresh ephemeral key: the shared
/// secret (the x-coordinate, the curve's field size, no KDF) and the ephemeral public
/// point (uncompressed SEC1).
pub fn ecdh_ephemeral(curve: Curve, peer: &[u8]) -> Result<(Zeroizing<Vec<u8>>, Vec<u8>), Error> {
    fn with<C>(peer: &[u8]) -> Result<(Zeroizing<Vec<u8>>, Vec<u8>), Error>
    where
        C: elliptic_curve::CurveArithmetic,
        elliptic_curve::FieldBytesSize<C>: elliptic_curve::sec1::ModulusSize,
        elliptic_curve::AffinePoint<C>:
            elliptic_curve::sec1::FromEncodedPoint<C> + elliptic_curve::sec1::ToEncodedPoint<C>,
    {
        use elliptic_curve::sec1::ToEncodedPoint;
        let peer = elliptic_curve::PublicKey::<C>::from_sec1_bytes(peer)
            .map_err(|_| Error::Key("the token's EC point is not on its curve".into()))?;
        // A random scalar from the kernel's generator, drawn again in the (negligible)
        // case it is zero or not below the order.
        let secret = loop {
            let mut bytes = Zeroizing::new(elliptic_curve::FieldBytes::<C>::default());
            crate::rsa::random(&mut bytes)?;
            if let Ok(k) = elliptic_curve::SecretKey::<C>::from_bytes(&bytes) {
                break k;
            }
        };
        let shared =
            elliptic_curve::ecdh::diffie_hellman(secret.to_nonzero_scalar(), peer.as_affine());
        let public = secret
            .public_key()
            .to_encoded_point(false)
            .as_bytes()
            .to_vec();
        Ok((Zeroizing::new(shared.raw_secret_bytes().to_vec()), public))
    }
    match curve {
        Curve::P256 => with::<p256::NistP256>(peer),
        Curve::P384 => with::<p384::NistP384>(peer),
        Curve::P521 => with::<p521::NistP521>(peer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_of_an_ecdh_agree_and_bad_points_are_refused() {
        use elliptic_curve::sec1::ToEncodedPoint;
        // The token's side: a key whose private half the test holds.
        let token = p256::SecretKey::from_bytes(&[7u8; 32].into()).unwrap();
        let token_point = token.public_key().to_encoded_point(false);
        let (secret, eph) = ecdh_ephemeral(Curve::P256, token_point.as_bytes()).unwrap();
        assert_eq!(secret.len(), 32);
        assert_eq!(eph.len(), 65);
        assert_eq!(eph[0], 4, "uncompressed SEC1");
        let eph = p256::PublicKey::from_sec1_bytes(&eph).unwrap();
        let theirs =
            elliptic_curve::ecdh::diffie_hellman(token.to_nonzero_scalar(), eph.as_affine());
        assert_eq!(&secret[..], &theirs.raw_secret_bytes()[..]);
        // Two enrollments never share an ephemeral key.
        let (again, _) = ecdh_ephemeral(Curve::P256, token_point.as_bytes()).unwrap();
        assert_ne!(&secret[..], &again[..]);
        assert!(ecdh_ephemeral(Curve::P256, &[4; 65]).is_err());
        assert!(ecdh_ephemeral(Curve::P384, token_point.as_bytes()).is_err());
        assert_eq!(
            Curve::from_oid(&[0x2b, 0x81, 0x04, 0x00, 0x22]),
            Some(Curve::P384)
        );
    }
}
