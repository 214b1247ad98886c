//! The fio side: workloads, their command lines, and fio's JSON output.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;

/// Which published experiment a workload reproduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Family {
    /// Cloudflare's dm-crypt article: 4k mixed read/write, queue depth 1.
    Cloudflare,
    /// Cybozu's dm-crypt study: seq/rand read/write × block size × parallel jobs.
    Cybozu,
    /// Ceph's encryption tables: 4M and 4K random read/write at queue depth 32.
    Ceph,
    /// 4k writes, each followed by a flush (fdatasync on a block device, NBD_CMD_FLUSH over NBD).
    Sync,
}

impl Family {
    /// The heading of this family's section in the report.
    pub(crate) fn title(self) -> &'static str {
        match self {
            Family::Cloudflare => "Cloudflare test (4k readwrite, QD1)",
            Family::Cybozu => "Cybozu matrix (jobs = parallel clients, QD1 each)",
            Family::Ceph => "Ceph-like random I/O at QD32",
            Family::Sync => "Sync 4k write (flush after every write)",
        }
    }
}

/// One fio job description, independent of the target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Workload {
    /// Unique and file-name safe, e.g. `cybozu-randread-4k-j2`.
    pub id: String,
    /// The experiment this workload belongs to (decides its table and chart).
    pub family: Family,
    /// fio's `rw`: read, write, randread, randwrite, readwrite, randrw.
    pub rw: String,
    /// fio's `bs`, e.g. `4k`.
    pub bs: String,
    /// fio's `iodepth`: I/Os in flight per job.
    pub iodepth: u32,
    /// fio's `numjobs`: parallel jobs (one NBD connection or one thread each).
    pub numjobs: u32,
    /// Flush after every write.
    #[serde(default)]
    pub sync: bool,
}

impl Workload {
    /// A workload without a flush per write.
    pub(crate) fn new(
        id: &str,
        family: Family,
        rw: &str,
        bs: &str,
        iodepth: u32,
        numjobs: u32,
    ) -> Self {
        Workload {
            id: id.to_string(),
            family,
            rw: rw.to_string(),
            bs: bs.to_string(),
            iodepth,
            numjobs,
            sync: false,
        }
    }

    /// The pattern without the parallelism: what a throughput-vs-jobs chart plots as one chart.
    pub(crate) fn pattern(&self) -> String {
        format!("{} {}", self.rw, self.bs)
    }

    /// Whether the workload issues reads (it has read latencies).
    pub(crate) fn reads(&self) -> bool {
        self.rw.contains("read") || self.rw.contains("rw")
    }

    /// Whether the workload issues writes (it has write latencies).
    pub(crate) fn writes(&self) -> bool {
        self.rw.contains("write") || self.rw.contains("rw")
    }

    /// Short human description.
    pub(crate) fn describe(&self) -> String {
        let mut s = format!(
            "{} {} QD{} × {} job{}",
            self.rw,
            self.bs,
            self.iodepth,
            self.numjobs,
            if self.numjobs == 1 { "" } else { "s" }
        );
        if self.sync {
            s.push_str(", flush per write");
        }
        s
    }
}

/// Where fio sends the I/O.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum IoPath {
    /// fio's nbd engine (libnbd); each job opens its own connection.
    Nbd {
        /// The NBD URI, e.g. `nbd+unix:///?socket=/dev/shm/x/nbd.sock`.
        uri: String,
    },
    /// A block device (inside the VM), O_DIRECT.
    Block {
        /// The device node, e.g. `/dev/ram0`.
        path: String,
    },
}

/// Run length and data set size shared by every job of a run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunParams {
    /// Seconds per fio run.
    pub runtime: u32,
    /// Bytes of the device used (and of each image).
    pub size: u64,
}

/// The fio arguments (without the program name) for `w` on `io`, writing JSON to `output`.
pub(crate) fn fio_args(w: &Workload, io: &IoPath, p: &RunParams, output: &Path) -> Vec<String> {
    let mut a = vec![
        format!("--name={}", w.id),
        format!("--rw={}", w.rw),
        format!("--bs={}", w.bs),
        format!("--iodepth={}", w.iodepth),
        format!("--numjobs={}", w.numjobs),
        format!("--size={}", p.size),
        "--time_based".to_string(),
        format!("--runtime={}", p.runtime),
        "--group_reporting".to_string(),
        "--randrepeat=0".to_string(),
    ];
    match io {
        IoPath::Nbd { uri } => {
            a.push("--ioengine=nbd".into());
            a.push(format!("--uri={uri}"));
            if w.sync {
                // The nbd engine maps fsync to NBD_CMD_FLUSH; it rejects fdatasync (EINVAL).
                a.push("--fsync=1".into());
            }
        }
        IoPath::Block { path } => {
            a.push(format!("--filename={path}"));
            a.push("--direct=1".into());
            a.push(
                if w.iodepth > 1 {
                    "--ioengine=libaio"
                } else {
                    "--ioengine=psync"
                }
                .into(),
            );
            if w.sync {
                a.push("--fdatasync=1".into());
            }
        }
    }
    a.push("--output-format=json".into());
    a.push(format!("--output={}", output.display()));
    a
}

/// Quotes an argument for a shell command line shown to people (and run by the guest).
pub(crate) fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_=./:,+@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// `prog args...` as one shell-quoted line, for the report and the guest script.
pub(crate) fn command_line(prog: &str, args: &[String]) -> String {
    let mut s = shell_quote(prog);
    for a in args {
        s.push(' ');
        s.push_str(&shell_quote(a));
    }
    s
}

/// Completion-latency percentiles of one direction, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Percentiles {
    /// Median, µs.
    pub p50: f64,
    /// 99th percentile, µs.
    pub p99: f64,
    /// 99.9th percentile, µs.
    pub p999: f64,
}

/// One direction (read or write) of a fio result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct DirStats {
    /// I/Os completed in this direction (0: the workload does not read, or write).
    pub ios: u64,
    /// Bytes per second.
    pub bw_bytes: f64,
    /// I/Os per second.
    pub iops: f64,
    /// Completion latency percentiles, µs.
    pub clat_us: Percentiles,
}

/// What the report uses of one fio JSON output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct FioResult {
    /// The read side.
    pub read: DirStats,
    /// The write side.
    pub write: DirStats,
}

impl DirStats {
    /// Folds in another job entry of the same direction: rates add up, percentiles keep
    /// the worst.
    fn merge(&mut self, d: DirStats) {
        self.ios += d.ios;
        self.bw_bytes += d.bw_bytes;
        self.iops += d.iops;
        self.clat_us.p50 = self.clat_us.p50.max(d.clat_us.p50);
        self.clat_us.p99 = self.clat_us.p99.max(d.clat_us.p99);
        self.clat_us.p999 = self.clat_us.p999.max(d.clat_us.p999);
    }
}

impl FioResult {
    /// Read + write, in MB/s (10^6 bytes).
    pub(crate) fn mb_s(&self) -> f64 {
        (self.read.bw_bytes + self.write.bw_bytes) / 1e6
    }

    /// Read + write I/Os per second.
    pub(crate) fn iops(&self) -> f64 {
        self.read.iops + self.write.iops
    }
}

fn dir_stats(job: &Value, dir: &str) -> Result<DirStats, String> {
    let d = job
        .get(dir)
        .ok_or_else(|| format!("fio JSON: job has no '{dir}' section"))?;
    let num = |k: &str| -> Result<f64, String> {
        d.get(k)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("fio JSON: '{dir}.{k}' missing or not a number"))
    };
    let ios = d.get("total_ios").and_then(Value::as_u64).unwrap_or(0);
    let pct = |key: &str| -> f64 {
        d.get("clat_ns")
            .and_then(|c| c.get("percentile"))
            .and_then(|p| p.get(key))
            .and_then(Value::as_f64)
            .map_or(0.0, |ns| ns / 1000.0)
    };
    Ok(DirStats {
        ios,
        bw_bytes: num("bw_bytes")?,
        iops: num("iops")?,
        clat_us: Percentiles {
            p50: pct("50.000000"),
            p99: pct("99.000000"),
            p999: pct("99.900000"),
        },
    })
}

/// Parses fio's `--output-format=json` (run with `--group_reporting`: one job entry).
/// A job that reports an error fails the parse.
pub(crate) fn parse_fio_json(text: &str) -> Result<FioResult, String> {
    let v = json_object(text)?;
    let jobs = v
        .get("jobs")
        .and_then(Value::as_array)
        .filter(|j| !j.is_empty())
        .ok_or_else(|| "fio JSON: no jobs".to_string())?;
    let mut out = FioResult::default();
    for job in jobs {
        if let Some(e) = job.get("error").and_then(Value::as_i64)
            && e != 0
        {
            return Err(format!("fio job failed with error {e} ({})", errno_name(e)));
        }
        let r = dir_stats(job, "read")?;
        let w = dir_stats(job, "write")?;
        // Several entries only without group_reporting.
        out.read.merge(r);
        out.write.merge(w);
    }
    Ok(out)
}

/// The first character of fio's JSON output.
const JSON_START: char = '{';

/// The JSON object in fio's output; fio may print warnings before it.
fn json_object(text: &str) -> Result<Value, String> {
    let start = text
        .find(JSON_START)
        .ok_or_else(|| "fio output has no JSON object".to_string())?;
    serde_json::from_str(&text[start..]).map_err(|e| format!("fio JSON: {e}"))
}

fn errno_name(e: i64) -> &'static str {
    match e {
        5 => "EIO",
        22 => "EINVAL",
        28 => "ENOSPC",
        95 => "EOPNOTSUPP",
        110 => "ETIMEDOUT",
        111 => "ECONNREFUSED",
        _ => "see the .err file",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nbd_sync_uses_fsync_and_block_uses_fdatasync() {
        let mut w = Workload::new("sync-4k", Family::Sync, "write", "4k", 1, 1);
        w.sync = true;
        let p = RunParams {
            runtime: 3,
            size: 1 << 20,
        };
        let nbd = fio_args(
            &w,
            &IoPath::Nbd {
                uri: "nbd+unix:///?socket=/s".into(),
            },
            &p,
            Path::new("/o.json"),
        );
        assert!(nbd.contains(&"--fsync=1".to_string()));
        assert!(nbd.contains(&"--ioengine=nbd".to_string()));
        assert!(!nbd.iter().any(|a| a.starts_with("--fdatasync")));
        let blk = fio_args(
            &w,
            &IoPath::Block {
                path: "/dev/ram0".into(),
            },
            &p,
            Path::new("/o.json"),
        );
        assert!(blk.contains(&"--fdatasync=1".to_string()));
        assert!(blk.contains(&"--ioengine=psync".to_string()));
        assert!(blk.contains(&"--runtime=3".to_string()));
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("--rw=read"), "--rw=read");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(
            shell_quote("nbd+unix:///?socket=/x"),
            "'nbd+unix:///?socket=/x'"
        );
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn errors_are_reported() {
        let j = r#"{"jobs":[{"error":22,"read":{"bw_bytes":0,"iops":0},"write":{"bw_bytes":0,"iops":0}}]}"#;
        let e = parse_fio_json(j).unwrap_err();
        assert!(e.contains("EINVAL"), "{e}");
        assert!(parse_fio_json("no json").is_err());
    }
}
