//! The TPM's wire format (big-endian, sized buffers as a 16-bit length and bytes): what
//! is sent to the TSS's unmarshalling functions and read back from its marshalling ones,
//! so that no C structure layout is spelled out here.

/// A marshalled structure being built.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Wire(pub Vec<u8>);

impl Wire {
    /// An empty buffer.
    pub fn new() -> Wire {
        Wire(Vec::new())
    }
    /// Appends a byte.
    pub fn u8(mut self, v: u8) -> Wire {
        self.0.push(v);
        self
    }
    /// Appends a 16-bit value.
    pub fn u16(mut self, v: u16) -> Wire {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// Appends a 32-bit value.
    pub fn u32(mut self, v: u32) -> Wire {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// Appends bytes as they are.
    pub fn raw(mut self, b: &[u8]) -> Wire {
        self.0.extend_from_slice(b);
        self
    }
    /// Appends a sized buffer (`TPM2B_*`): its length, then its bytes.
    pub fn sized(self, b: &[u8]) -> Wire {
        let len = u16::try_from(b.len()).expect("a TPM2B holds under 64 KiB");
        self.u16(len).raw(b)
    }
    /// The bytes so far as a sized structure (`TPM2B_PUBLIC` around a `TPMT_PUBLIC`).
    pub fn into_sized(self) -> Wire {
        Wire::new().sized(&self.0)
    }
}

/// The `TPM2B_*` at the start of `b` (its length and bytes) and what follows it; `None`
/// when `b` is shorter than the length says.
pub fn split_sized(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u16::from_be_bytes(b.get(..2)?.try_into().ok()?) as usize;
    let end = 2usize.checked_add(len)?;
    Some((b.get(..end)?, b.get(end..)?))
}

/// A `TPML_PCR_SELECTION` of one bank: `pcrs` (0-23) of the bank `hash` (a TPM hash
/// algorithm id); an empty `pcrs` selects none.
pub fn pcr_selection(hash: u16, pcrs: &[u32]) -> Wire {
    let mut select = [0u8; 3];
    for &p in pcrs {
        if let Some(byte) = select.get_mut(p as usize / 8) {
            *byte |= 1 << (p % 8);
        }
    }
    Wire::new().u32(1).u16(hash).u8(3).raw(&select)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sized_buffers_and_selections_are_big_endian() {
        assert_eq!(Wire::new().sized(b"ab").0, [0, 2, b'a', b'b']);
        assert_eq!(
            Wire::new().u16(0x23).u32(1).into_sized().0,
            [0, 6, 0, 0x23, 0, 0, 0, 1]
        );
        assert_eq!(
            pcr_selection(0x000b, &[0, 7, 23]).0,
            [0, 0, 0, 1, 0, 0x0b, 3, 0x81, 0, 0x80]
        );
        let two = Wire::new().sized(b"xyz").sized(b"");
        let (first, rest) = split_sized(&two.0).unwrap();
        assert_eq!((first, rest), (&[0, 3, b'x', b'y', b'z'][..], &[0, 0][..]));
        assert_eq!(split_sized(&[0, 5, 1]), None);
        assert_eq!(split_sized(&[0]), None);
    }
}
