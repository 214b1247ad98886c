//! PKCS#11 URIs (RFC 7512): `pkcs11:` then `name=value` path attributes separated by `;`
//! (and an optional `?` query, of which nothing is used here), values percent-encoded.

use crate::Error;

/// A parsed PKCS#11 URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uri {
    text: String,
    attributes: Vec<(String, Vec<u8>)>,
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

fn decode(v: &str) -> Result<Vec<u8>, Error> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let (h, l) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            );
            let (Some(h), Some(l)) = (h, l) else {
                return Err(Error::Uri(format!("a bad %-escape in '{v}'")));
            };
            out.push(h << 4 | l);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

impl Uri {
    /// Parses `pkcs11:...`.
    pub fn parse(s: &str) -> Result<Uri, Error> {
        let rest = s
            .strip_prefix("pkcs11:")
            .ok_or_else(|| Error::Uri(format!("'{s}' is not a pkcs11: URI")))?;
        let path = rest.split('?').next().unwrap_or_default();
        let mut attributes = Vec::new();
        for part in path.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| Error::Uri(format!("'{part}' is not name=value")))?;
            attributes.push((k.to_owned(), decode(v)?));
        }
        Ok(Uri {
            text: s.to_owned(),
            attributes,
        })
    }

    /// A path attribute's value (`token`, `manufacturer`, `model`, `serial`, `object`,
    /// `id`, `type`), percent-decoded.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.attributes
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The URI as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc7512_uris_parse() {
        let u = Uri::parse(
            "pkcs11:model=SoftHSM%20v2;manufacturer=SoftHSM%20project;serial=68453e32;token=test;id=%01%ff;object=key;type=cert?pin-value=1",
        )
        .unwrap();
        assert_eq!(u.get("model"), Some(&b"SoftHSM v2"[..]));
        assert_eq!(u.get("token"), Some(&b"test"[..]));
        assert_eq!(u.get("id"), Some(&[1u8, 0xff][..]));
        assert_eq!(u.get("type"), Some(&b"cert"[..]));
        assert_eq!(
            u.get("pin-value"),
            None,
            "the query is not a path attribute"
        );
        assert!(Uri::parse("pkcs11:").unwrap().get("token").is_none());
        assert!(Uri::parse("pkcs12:token=x").is_err());
        assert!(Uri::parse("pkcs11:token=%zz").is_err());
        assert!(Uri::parse("pkcs11:token").is_err());
    }
}
