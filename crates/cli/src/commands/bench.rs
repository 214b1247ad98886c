//! `bench`: fio over NBD (and, with --vm, over kernel block devices in a VM: tests/vm/vm.sh), with a
//! report directory of raw fio JSON, report.md and charts. The work is in cryptblk-bench.

use crate::error::{CliError, CliResult};
use clap::Args;
use cryptblk_bench::{CipherChoice, Config, Preset};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// Small matrix, 1 s runs, 2 repetitions: under two minutes (the default).
    #[arg(long, conflicts_with_all = ["standard", "full"])]
    pub quick: bool,
    /// Full Cybozu matrix up to 4 jobs, Ceph 4M/4K, 2 s runs, 3 repetitions.
    #[arg(long, conflicts_with = "full")]
    pub standard: bool,
    /// Up to 16 jobs, 10 s runs, 5 repetitions.
    #[arg(long)]
    pub full: bool,
    /// Report directory (default: ./cryptblk-bench-UNIXTIME).
    #[arg(short, long)]
    pub out: Option<PathBuf>,
    /// Work directory for images and sockets (default: /dev/shm/cryptblk-bench-PID).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Device/image size, e.g. 64M, 1G (default: per preset).
    #[arg(long)]
    pub size: Option<String>,
    /// Seconds per fio run (default: per preset).
    #[arg(long)]
    pub runtime: Option<u32>,
    /// Repetitions per figure (default: per preset).
    #[arg(long)]
    pub repeats: Option<u32>,
    /// cryptblk/dm-crypt ciphers, comma separated SPEC[:KEY_BITS[:SECTOR_SIZE]]
    /// (default aes-xts-plain64:512:4096).
    #[arg(long, value_delimiter = ',')]
    pub cipher: Vec<String>,
    /// Only targets whose id starts with one of these (comma separated), e.g. plain,cryptblk.
    #[arg(long, value_delimiter = ',')]
    pub targets: Vec<String>,
    /// Only workloads whose id starts with one of these or of these families
    /// (cloudflare, cybozu, ceph, sync).
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Also run the kernel targets (brd, dm-crypt, ublk) in a throwaway VM (the
    /// repository's tests/vm/vm.sh; $CRYPTBLK_VM names another copy).
    #[arg(long)]
    pub vm: bool,
    /// Skip the host (NBD) targets.
    #[arg(long = "no-host")]
    pub no_host: bool,
    /// Only regenerate report.md and the charts of an existing report directory.
    #[arg(long = "report-only", value_name = "DIR")]
    pub report_only: Option<PathBuf>,
}

/// Parses 64M, 1G, 4096 (powers of 1024): at least 1 MiB, whole 4 KiB.
pub(crate) fn parse_size(s: &str) -> CliResult<u64> {
    Some(crate::units::parse_size(s).map_err(CliError::usage)?)
        .filter(|&n| n >= 1 << 20 && n % 4096 == 0)
        .ok_or_else(|| {
            CliError::usage(format!(
                "bad --size '{s}' (at least 1M, a multiple of 4K, e.g. 64M or 1G)"
            ))
        })
}

pub(crate) fn run(a: BenchArgs) -> CliResult<()> {
    if let Some(dir) = &a.report_only {
        let charts = cryptblk_bench::report::generate(dir).map_err(CliError::usage)?;
        outln!(
            "{} ({} chart files)",
            dir.join("report.md").display(),
            charts.len()
        );
        return Ok(());
    }
    let preset = if a.full {
        Preset::Full
    } else if a.standard {
        Preset::Standard
    } else {
        Preset::Quick
    };
    let ciphers = a
        .cipher
        .iter()
        .map(|c| c.parse::<CipherChoice>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(CliError::usage)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let work = a.dir.clone().unwrap_or_else(|| {
        let base = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        base.join(format!("cryptblk-bench-{}", std::process::id()))
    });
    let cryptblk = std::env::current_exe().map_err(|e| CliError::usage(e.to_string()))?;
    let cfg = Config {
        preset,
        runtime: a.runtime,
        size: a.size.as_deref().map(parse_size).transpose()?,
        repeats: a.repeats,
        ciphers,
        out: a
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("cryptblk-bench-{now}"))),
        work,
        cryptblk_version: format!(
            "cryptblk {} ({})",
            env!("CARGO_PKG_VERSION"),
            cryptblk.display()
        ),
        cryptblk,
        targets: a.targets.clone(),
        workloads: a.workloads.clone(),
        host: !a.no_host,
        vm: a.vm,
        vm_harness: vm_harness(),
    };
    let report = cryptblk_bench::run(&cfg).map_err(CliError::usage)?;
    outln!("{}", report.display());
    Ok(())
}

/// The VM harness: $CRYPTBLK_VM, else tests/vm/vm.sh of the repository we run in (the
/// current directory) or were built in (next to target/release/).
fn vm_harness() -> PathBuf {
    if let Some(p) = std::env::var_os("CRYPTBLK_VM") {
        return PathBuf::from(p);
    }
    let rel = std::path::Path::new("tests/vm/vm.sh");
    let from_exe = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.parent()?.join(rel)));
    [Some(rel.to_path_buf()), from_exe]
        .into_iter()
        .flatten()
        .find(|p| p.exists())
        .unwrap_or_else(|| rel.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert!(parse_size("12").is_err());
        assert!(parse_size("1X").is_err());
        assert!(parse_size("").is_err());
    }
}
