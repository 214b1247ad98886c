//! Sizes on the command line as cryptsetup takes them (`tools_string_to_size`): a number
//! with an optional unit: K, M, G, T, P or E alone or with `iB` (powers of 1024: `1M`,
//! `1MiB`), with `B` (powers of 1000: `1MB`), or S (512-byte sectors).

/// The bytes `s` stands for, or why it is not a size.
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = || format!("bad size '{s}'");
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let (letter, base) = match unit.as_bytes() {
        [] => return Ok(n),
        [b's' | b'S'] => return n.checked_mul(512).ok_or_else(bad),
        [l] => (*l, 1024u64),
        [l, b'i', b'B'] => (*l, 1024),
        [l, b'B'] => (*l, 1000),
        _ => return Err(format!("bad size suffix in '{s}'")),
    };
    let power = match letter.to_ascii_uppercase() {
        b'K' => 1,
        b'M' => 2,
        b'G' => 3,
        b'T' => 4,
        b'P' => 5,
        b'E' => 6,
        _ => return Err(format!("bad size suffix in '{s}'")),
    };
    base.checked_pow(power)
        .and_then(|m| n.checked_mul(m))
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_as_cryptsetup_reads_them() {
        for (s, want) in [
            ("4096", 4096),
            ("8s", 4096),
            ("1k", 1024),
            ("1M", 1 << 20),
            ("1MiB", 1 << 20),
            ("40MiB", 40 << 20),
            ("1MB", 1_000_000),
            ("2GB", 2_000_000_000),
            ("3g", 3 << 30),
            ("1TiB", 1 << 40),
            ("1E", 1 << 60),
        ] {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
        for s in [
            "",
            "M",
            "1x",
            "1MiBs",
            "1iB",
            "1sB",
            "-1",
            "1.5M",
            "16E",
            "99999999999999999999",
        ] {
            assert!(parse_size(s).is_err(), "{s} parsed");
        }
    }
}
