//! Shared helpers for the crypto integration tests: the test-vector file format, a small
//! deterministic PRNG, and the list of backends to exercise.
//!
//! # Data file format (`tests/data/*.txt`)
//!
//! * A record is a run of `name = value` lines; records are separated by blank lines.
//! * Lines starting with `#` are comments (anywhere, also inside a record).
//! * A line starting with whitespace continues the previous value (long hex strings are
//!   wrapped this way); the pieces are concatenated without separators.
//! * Hex values may use either case; numbers are decimal or `0x`-prefixed hex.

#![allow(dead_code)]

use cryptblk_crypto::Backend;

/// One record of a data file.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    /// File name and 1-based line of the record's first field, for failure messages.
    pub origin: String,
    fields: Vec<(String, String)>,
}

impl Record {
    pub(crate) fn opt(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        self.opt(name).is_some()
    }

    pub(crate) fn get(&self, name: &str) -> &str {
        self.opt(name)
            .unwrap_or_else(|| panic!("{}: missing field `{name}`", self.origin))
    }

    pub(crate) fn hex(&self, name: &str) -> Vec<u8> {
        hex::decode(self.get(name))
            .unwrap_or_else(|e| panic!("{}: field `{name}`: {e}", self.origin))
    }

    pub(crate) fn u64(&self, name: &str) -> u64 {
        let v = self.get(name);
        let parsed = match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16),
            None => v.parse(),
        };
        parsed.unwrap_or_else(|e| panic!("{}: field `{name}` = {v:?}: {e}", self.origin))
    }

    pub(crate) fn u32(&self, name: &str) -> u32 {
        u32::try_from(self.u64(name))
            .unwrap_or_else(|_| panic!("{}: `{name}` exceeds u32", self.origin))
    }

    pub(crate) fn flag(&self, name: &str) -> bool {
        match self.get(name) {
            "1" | "yes" | "true" => true,
            "0" | "no" | "false" => false,
            v => panic!("{}: field `{name}` = {v:?} is not a boolean", self.origin),
        }
    }

    /// The record's `name` field if it has one, else its origin.
    pub(crate) fn label(&self) -> String {
        match self.opt("name") {
            Some(n) => format!("{n} ({})", self.origin),
            None => self.origin.clone(),
        }
    }
}

/// Parses the text of a data file; `file` is used in messages only.
pub(crate) fn parse(file: &str, text: &str) -> Vec<Record> {
    let mut out = Vec::new();
    let mut cur: Option<Record> = None;
    for (i, raw) in text.lines().enumerate() {
        let lineno = i + 1;
        if raw.trim_start().starts_with('#') {
            continue;
        }
        if raw.trim().is_empty() {
            out.extend(cur.take());
            continue;
        }
        if raw.starts_with(char::is_whitespace) {
            let rec = cur
                .as_mut()
                .unwrap_or_else(|| panic!("{file}:{lineno}: continuation outside a record"));
            let last = rec
                .fields
                .last_mut()
                .expect("a record has at least one field");
            last.1.push_str(raw.trim());
            continue;
        }
        let (k, v) = raw
            .split_once('=')
            .unwrap_or_else(|| panic!("{file}:{lineno}: expected `name = value`"));
        let rec = cur.get_or_insert_with(|| Record {
            origin: format!("{file}:{lineno}"),
            fields: Vec::new(),
        });
        let k = k.trim().to_string();
        assert!(
            !rec.fields.iter().any(|(n, _)| *n == k),
            "{file}:{lineno}: duplicate field `{k}`"
        );
        rec.fields.push((k, v.trim().to_string()));
    }
    out.extend(cur);
    out
}

/// Loads `tests/data/<name>`.
pub(crate) fn load(name: &str) -> Vec<Record> {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let recs = parse(name, &text);
    assert!(!recs.is_empty(), "{path}: no records");
    recs
}

/// The lines of `tests/data/<name>` in the one-case-per-line format (whitespace-separated
/// hex fields, `-` for an empty one; `#` comments and blank lines skipped): each line with
/// its fields decoded.
pub(crate) fn load_lines(name: &str) -> Vec<(String, Vec<Vec<u8>>)> {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let fields = l
                .split_whitespace()
                .map(|f| match f {
                    "-" => Vec::new(),
                    _ => hex::decode(f).unwrap_or_else(|e| panic!("{path}: {f}: {e}")),
                })
                .collect();
            (l.to_string(), fields)
        })
        .collect()
}

/// Every backend this CPU runs; the generic one is always among them.
pub(crate) fn backends() -> Vec<Backend> {
    static WARN: std::sync::Once = std::sync::Once::new();
    WARN.call_once(|| {
        let missing: Vec<&str> = Backend::ALL
            .into_iter()
            .filter(|b| !b.is_supported())
            .map(|b| b.name())
            .collect();
        if !missing.is_empty() {
            // Loud on purpose: these paths are not exercised by this run. Run the tests on
            // a CPU that has them (docs/benchmarks.md lists where each was last tested).
            // Written to the stream itself: the test harness captures eprintln! output.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "\n*** NOT TESTED ON THIS CPU: crypto backend(s) {} (this CPU lacks their \
                 instructions); tested here: {} ***\n",
                missing.join(", "),
                Backend::supported()
                    .iter()
                    .map(|b| b.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    });
    let b = Backend::supported();
    assert!(
        b.contains(&Backend::Generic),
        "generic backend missing from {b:?}"
    );
    b
}

/// SplitMix64: a tiny deterministic generator so failures reproduce from the printed seed.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0; the tiny modulo bias is irrelevant here).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.fill(&mut v);
        v
    }
}

/// Hex of at most the first 64 bytes, for readable assertion messages on long buffers.
pub(crate) fn short_hex(b: &[u8]) -> String {
    if b.len() <= 64 {
        hex::encode(b)
    } else {
        format!("{}... ({} bytes)", hex::encode(&b[..64]), b.len())
    }
}

/// Asserts two byte strings are equal, reporting the first differing 16-byte block.
#[track_caller]
pub(crate) fn assert_bytes_eq(got: &[u8], want: &[u8], what: &str) {
    if got == want {
        return;
    }
    assert_eq!(got.len(), want.len(), "{what}: length differs");
    let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
    let blk = first / 16 * 16;
    let end = (blk + 16).min(got.len());
    panic!(
        "{what}: first difference at byte {first} (block {}):\n  got  {}\n  want {}\n  (got {}, want {})",
        first / 16,
        hex::encode(&got[blk..end]),
        hex::encode(&want[blk..end]),
        short_hex(got),
        short_hex(want)
    );
}
