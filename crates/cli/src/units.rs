//! Sizes on the command line: a number with an optional K, M, G or T suffix (powers of
//! 1024) or S (512-byte sectors), as cryptsetup takes them.

/// The bytes `s` stands for, or `None` when it is not a size or overflows.
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'S' => 512u64,
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return None,
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}
