//! `benchmark`: cipher and KDF speeds measured in-process on one core.

use crate::error::{CliError, CliResult};
use clap::Args;
use cryptblk_crypto::kdf::pbkdf2_iterations_per_second;
use cryptblk_crypto::{AeadSectorCipher, IvOptions, SectorCipher};
use cryptblk_crypto::{Argon2Variant, Backend, CipherSpec, HashAlg, Kdf, KdfKind, KdfRequest};
use serde_json::json;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub(crate) struct BenchmarkArgs {
    /// Only this cipher specification.
    #[arg(short = 'c', long)]
    pub cipher: Option<String>,
    /// Only this key size in bits.
    #[arg(short = 's', long = "key-size")]
    pub key_size: Option<usize>,
    /// Only this sector size.
    #[arg(long = "sector-size")]
    pub sector_size: Option<u32>,
    /// Bytes per call (the I/O request size); default: both the sector size and 4096.
    #[arg(long = "request-size")]
    pub request_size: Option<usize>,
    /// vaes512, vaes256, aesni or generic (default: the fastest this CPU has).
    #[arg(long, conflicts_with = "integrity")]
    pub backend: Option<String>,
    /// Authenticated sector encryption as LUKS2 `--integrity` volumes use it: aead,
    /// poly1305, hmac-sha1, hmac-sha256 or hmac-sha512 (sealing and opening with the tag;
    /// default ciphers: aes-gcm-random and aegis128-random for aead, chacha20-random for
    /// poly1305, aes-xts-plain64 for the HMACs).
    #[arg(long, value_name = "MODE")]
    pub integrity: Option<String>,
    /// Seconds per figure.
    #[arg(long, default_value_t = 0.25)]
    pub seconds: f64,
    /// Skip the KDF figures.
    #[arg(long = "no-kdf")]
    pub no_kdf: bool,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also draw the cipher figures: DIR (gets cipher-speed.svg and .png) or FILE.svg/.png.
    #[arg(long, value_name = "DIR|FILE")]
    pub chart: Option<std::path::PathBuf>,
}

fn key_sizes(spec: &CipherSpec) -> Vec<usize> {
    if spec.cipher == cryptblk_crypto::BlockCipherAlg::Null {
        return vec![0];
    }
    [16usize, 32, 64]
        .into_iter()
        .filter(|&k| spec.valid_key_len(k))
        .collect()
}

/// Where `--chart` draws, checked before anything is measured.
fn chart_base(a: &BenchmarkArgs) -> CliResult<Option<std::path::PathBuf>> {
    a.chart
        .as_deref()
        .map(cryptblk_bench::chart::chart_base)
        .transpose()
        .map_err(CliError::usage)
}

pub(crate) fn run(ctx: &crate::ctx::Ctx, a: BenchmarkArgs) -> CliResult<()> {
    if let Some(mode) = &a.integrity {
        return run_integrity(&a, mode);
    }
    let backend = chosen_backend(a.backend.as_deref())?;
    let dur = Duration::from_secs_f64(a.seconds.clamp(0.01, 60.0));
    let chart_base = chart_base(&a)?;
    if !a.json {
        outln!(
            "# Tests are approximate, in-process, one core, backend {backend} (no storage I/O)."
        );
        outln!("# MB = 10^6 bytes.");
        outln!(
            "{:>22} {:>6} {:>7} {:>8} {:>14} {:>14}",
            "Algorithm",
            "Key",
            "Sector",
            "Request",
            "Encryption",
            "Decryption"
        );
    }
    let mut rows = Vec::new();
    let cases = cipher_cases(&a)?;
    let mut progress = crate::progress::Progress::steps(ctx, "benchmark", cases.len() as u64);
    for case in cases {
        let s = cipher_speed(
            case.spec,
            case.key_len,
            case.sector,
            case.request,
            backend,
            dur,
        )?;
        progress.clear();
        print_cipher_speed(&s, a.json);
        progress.add(1);
        rows.push(chart_row(&s));
    }
    progress.finish();
    if let Some(base) = &chart_base {
        draw_chart(&rows, backend.name(), base)?;
    }
    if a.no_kdf || a.cipher.is_some() {
        return Ok(());
    }
    print_pbkdf2_speeds(a.json)?;
    print_argon2_costs(a.json)
}

fn chart_row(s: &CipherSpeed) -> cryptblk_bench::chart::CipherRow {
    cryptblk_bench::chart::CipherRow {
        cipher: s.cipher.to_string(),
        key_bits: s.key_bits,
        sector_size: s.sector_size,
        request_size: s.request_size,
        encrypt_mb_s: s.encrypt_mb_s,
        decrypt_mb_s: s.decrypt_mb_s,
    }
}

fn draw_chart(
    rows: &[cryptblk_bench::chart::CipherRow],
    backend: &str,
    base: &std::path::Path,
) -> CliResult<()> {
    let svg = cryptblk_bench::chart::cipher_chart(rows, backend);
    cryptblk_bench::chart::write_svg_png(&svg, base).map_err(CliError::usage)?;
    eprintln!(
        "chart: {} and {}",
        base.with_extension("svg").display(),
        base.with_extension("png").display()
    );
    Ok(())
}

/// `benchmark --integrity MODE`: sealing (encryption + tag) and opening (verification +
/// decryption) speed of the sector engine LUKS2 volumes with integrity use, per cipher,
/// sector size and request size. No storage and no dm-integrity journal: the crypto alone,
/// as the plain cipher figures are.
fn run_integrity(a: &BenchmarkArgs, mode: &str) -> CliResult<()> {
    let dur = Duration::from_secs_f64(a.seconds.clamp(0.01, 60.0));
    let ciphers: Vec<&str> = match (&a.cipher, mode) {
        (Some(c), _) => vec![c.as_str()],
        (None, "aead") => vec!["aes-gcm-random", "aegis128-random"],
        (None, "poly1305") => vec!["chacha20-random"],
        (None, _) => vec!["aes-xts-plain64"],
    };
    // Every mode checked before anything is printed.
    let modes = ciphers
        .iter()
        .map(|&c| Ok((c, super::format::integrity_key(c, mode, a.key_size)?)))
        .collect::<CliResult<Vec<_>>>()?;
    let chart_base = chart_base(a)?;
    if !a.json {
        outln!("# Tests are approximate, in-process, one core (no storage I/O, no journal).");
        outln!("# MB = 10^6 bytes of data; each sector's tag is written or checked besides.");
        outln!(
            "{:>30} {:>6} {:>7} {:>8} {:>14} {:>14}",
            "Algorithm",
            "Key",
            "Sector",
            "Request",
            "Seal",
            "Open"
        );
    }
    let mut rows = Vec::new();
    for (cipher, (kind, key_len)) in modes {
        for (sector, request) in sector_and_request_sizes(a) {
            let s = aead_speed(cipher, &kind, key_len, sector, request, dur)?;
            print_cipher_speed(&s, a.json);
            rows.push(chart_row(&s));
        }
    }
    if let Some(base) = &chart_base {
        draw_chart(&rows, "integrity", base)?;
    }
    Ok(())
}

/// Sealing and opening speed of `cipher` + `kind` on one core, as [`cipher_speed`] measures
/// the plain ciphers (1 MiB in calls of `request_size` bytes); every open must verify.
fn aead_speed(
    cipher: &str,
    kind: &str,
    key_len: usize,
    sector_size: u32,
    request_size: usize,
    duration: Duration,
) -> CliResult<CipherSpeed> {
    let mut key = cryptblk_crypto::SecretBytes::zeroed(key_len);
    cryptblk_crypto::random_bytes(&mut key)?;
    let engine = AeadSectorCipher::new(cipher, kind, &key, sector_size, 0)?;
    let ss = sector_size as usize;
    let request_size = request_size.max(ss) / ss * ss;
    let total = ((1 << 20) / request_size * request_size).max(request_size);
    let per_req = request_size / ss;
    let mut data = vec![0x5au8; total];
    let mut meta = vec![0u8; total / ss * engine.tag_size()];
    let tag_req = per_req * engine.tag_size();
    // One pass over the buffer, request by request: sealing, or opening what was sealed.
    let mut pass = |seal: bool, bad: &mut Vec<usize>| -> CliResult<Duration> {
        let start = Instant::now();
        for (i, (d, m)) in data
            .chunks_mut(request_size)
            .zip(meta.chunks_mut(tag_req))
            .enumerate()
        {
            let sector = (i * per_req) as u64;
            if seal {
                engine.seal(sector, d, m)?;
            } else {
                engine.open(sector, d, m, bad)?;
            }
        }
        Ok(start.elapsed())
    };
    let mut bad = Vec::new();
    pass(true, &mut bad)?; // warm-up
    let (mut sealing, mut seal_bytes) = (Duration::ZERO, 0u64);
    while sealing < duration {
        sealing += pass(true, &mut bad)?;
        seal_bytes += total as u64;
    }
    // Opening decrypts in place: each timed open follows an untimed seal.
    let (mut opening, mut open_bytes) = (Duration::ZERO, 0u64);
    while opening < duration {
        pass(true, &mut bad)?;
        opening += pass(false, &mut bad)?;
        open_bytes += total as u64;
        if !bad.is_empty() {
            return Err(CliError::usage(format!(
                "{cipher} + {kind}: {} sectors failed to verify what was just sealed",
                bad.len()
            )));
        }
    }
    let mb_s = |b: u64, d: Duration| b as f64 / d.as_secs_f64().max(1e-9) / 1e6;
    let (seal_mb_s, open_mb_s) = (mb_s(seal_bytes, sealing), mb_s(open_bytes, opening));
    Ok(CipherSpeed {
        cipher: format!("{cipher} + {kind}"),
        key_bits: key_len * 8,
        sector_size,
        request_size,
        backend: None,
        encrypt_mb_s: seal_mb_s,
        decrypt_mb_s: open_mb_s,
    })
}

/// The backend `--backend` names (refused if this CPU cannot run it), or the one chosen.
fn chosen_backend(name: Option<&str>) -> CliResult<Backend> {
    let Some(name) = name else {
        return Ok(Backend::current()?);
    };
    let b = Backend::from_name(name)?;
    if !b.is_supported() {
        return Err(CliError::usage(format!(
            "backend {b} is not supported by this CPU"
        )));
    }
    Ok(b)
}

/// One cipher figure to measure.
struct CipherCase {
    spec: CipherSpec,
    key_len: usize,
    sector: u32,
    request: usize,
}

/// Every (cipher, key size, sector size, request size) the arguments select, in table order.
fn cipher_cases(a: &BenchmarkArgs) -> CliResult<Vec<CipherCase>> {
    let ciphers: Vec<CipherSpec> = match &a.cipher {
        Some(c) => vec![CipherSpec::parse(c)?],
        None => CipherSpec::SUPPORTED
            .iter()
            .map(|c| CipherSpec::parse(c).expect("built-in spec"))
            .collect(),
    };
    let mut cases = Vec::new();
    for spec in ciphers {
        let keys = match a.key_size {
            Some(bits) if !spec.valid_key_len(bits / 8) => {
                return Err(CliError::usage(format!(
                    "key size {bits} is not valid for {spec}"
                )));
            }
            Some(bits) => vec![bits / 8],
            None => key_sizes(&spec),
        };
        for key_len in keys {
            for (sector, request) in sector_and_request_sizes(a) {
                cases.push(CipherCase {
                    spec,
                    key_len,
                    sector,
                    request,
                });
            }
        }
    }
    Ok(cases)
}

/// The (sector size, request size) pairs the arguments select: `--sector-size` or 512 and
/// 4096; `--request-size` or both one sector and 4096.
fn sector_and_request_sizes(a: &BenchmarkArgs) -> Vec<(u32, usize)> {
    let sectors = match a.sector_size {
        Some(s) => vec![s],
        None => vec![512, 4096],
    };
    let mut pairs = Vec::new();
    for sector in sectors {
        let mut reqs = match a.request_size {
            Some(r) => vec![r],
            None => vec![sector as usize, 4096],
        };
        reqs.dedup();
        pairs.extend(reqs.into_iter().map(|r| (sector, r)));
    }
    pairs
}

fn print_cipher_speed(s: &CipherSpeed, json: bool) {
    if json {
        outln!(
            "{}",
            json!({
                "cipher": s.cipher, "key_bits": s.key_bits, "sector_size": s.sector_size,
                "request_size": s.request_size, "backend": s.backend.map(|b| b.name()),
                "encrypt_mb_s": (s.encrypt_mb_s * 10.0).round() / 10.0,
                "decrypt_mb_s": (s.decrypt_mb_s * 10.0).round() / 10.0,
            })
        );
    } else {
        outln!(
            "{:>w$} {:>5}b {:>7} {:>8} {:>9.1} MB/s {:>9.1} MB/s",
            s.cipher,
            s.key_bits,
            s.sector_size,
            s.request_size,
            s.encrypt_mb_s,
            s.decrypt_mb_s,
            // The authenticated modes' names are longer (their header is as wide).
            w = if s.backend.is_some() { 22 } else { 30 }
        );
    }
}

fn print_pbkdf2_speeds(json: bool) -> CliResult<()> {
    for hash in [HashAlg::Sha1, HashAlg::Sha256, HashAlg::Sha512] {
        let ips = pbkdf2_iterations_per_second(hash, 32)?;
        if json {
            outln!(
                "{}",
                json!({"kdf": "pbkdf2", "hash": hash.name(), "key_bits": 256, "iterations_per_second": ips})
            );
        } else {
            outln!(
                "PBKDF2-{:<7} {:>10} iterations per second for 256-bit key",
                hash.name(),
                ips
            );
        }
    }
    Ok(())
}

/// The Argon2 costs LUKS2's default time target gives on this machine.
fn print_argon2_costs(json: bool) -> CliResult<()> {
    for variant in [Argon2Variant::Argon2i, Argon2Variant::Argon2id] {
        let mut req = KdfRequest::luks2_default();
        req.kind = KdfKind::Argon2(variant);
        if let Kdf::Argon2 {
            time,
            memory_kib,
            parallel,
            ..
        } = req.resolve(32)?
        {
            if json {
                outln!(
                    "{}",
                    json!({"kdf": variant.name(), "key_bits": 256, "time": time, "memory_kib": memory_kib,
                    "parallel": parallel, "target_ms": req.iter_time_ms})
                );
            } else {
                outln!(
                    "{:<9} {time:>3} iterations, {memory_kib:>7} memory, {parallel} parallel threads (CPUs) for 256-bit key (requested {} ms time)",
                    variant.name(),
                    req.iter_time_ms
                );
            }
        }
    }
    Ok(())
}

/// In-process cipher speed: one core, a 1 MiB buffer processed in requests of the size
/// the data path would issue.
/// One measured figure.
#[derive(Debug, Clone, PartialEq)]
struct CipherSpeed {
    /// The cipher specification measured, e.g. `aes-xts-plain64`.
    cipher: String,
    /// Key size in bits (for XTS, both halves together: 512 means AES-256).
    key_bits: usize,
    /// Encryption sector size in bytes (512, 1024, 2048 or 4096).
    sector_size: u32,
    /// Bytes handed to one encrypt/decrypt call (the I/O request size), rounded down to a
    /// whole number of sectors and at least one sector.
    request_size: usize,
    /// The AES implementation that ran (none named for the authenticated modes: each
    /// engine picks its own).
    backend: Option<Backend>,
    /// Encryption throughput in MB/s, MB = 10^6 bytes.
    encrypt_mb_s: f64,
    /// Decryption throughput in MB/s, MB = 10^6 bytes.
    decrypt_mb_s: f64,
}

/// Measures encryption and decryption speed on one core for `duration` each, processing a
/// 1 MiB buffer in calls of `request_size` bytes, as the data path would issue them.
fn cipher_speed(
    spec: CipherSpec,
    key_len: usize,
    sector_size: u32,
    request_size: usize,
    backend: Backend,
    duration: Duration,
) -> cryptblk_crypto::Result<CipherSpeed> {
    let mut key = cryptblk_crypto::SecretBytes::zeroed(key_len);
    cryptblk_crypto::random_bytes(&mut key)?;
    let cipher =
        SectorCipher::with_backend(spec, &key, sector_size, IvOptions::default(), backend)?;
    let request_size =
        request_size.max(sector_size as usize) / sector_size as usize * sector_size as usize;
    let total = (1 << 20) / request_size * request_size;
    let mut buf = vec![0x5au8; total.max(request_size)];
    let sectors_per_req = (request_size / sector_size as usize) as u64;
    let mut run = |enc: bool| -> cryptblk_crypto::Result<f64> {
        // Warm up caches and frequency before timing.
        for (i, chunk) in buf.chunks_mut(request_size).enumerate() {
            cipher.encrypt(i as u64 * sectors_per_req, chunk)?;
        }
        let start = Instant::now();
        let mut bytes = 0u64;
        while start.elapsed() < duration {
            for (i, chunk) in buf.chunks_mut(request_size).enumerate() {
                let s = i as u64 * sectors_per_req;
                if enc {
                    cipher.encrypt(s, chunk)?
                } else {
                    cipher.decrypt(s, chunk)?
                }
            }
            bytes += buf.len() as u64;
        }
        Ok(bytes as f64 / start.elapsed().as_secs_f64() / 1e6)
    };
    let encrypt_mb_s = run(true)?;
    let decrypt_mb_s = run(false)?;
    Ok(CipherSpeed {
        cipher: spec.to_string(),
        key_bits: key_len * 8,
        sector_size,
        request_size,
        backend: Some(backend),
        encrypt_mb_s,
        decrypt_mb_s,
    })
}
