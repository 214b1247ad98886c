//! The results index (`runs.json` in the report directory): everything the report needs,
//! next to the raw fio JSON files it points to.

use crate::fio::Workload;
use serde::{Deserialize, Serialize};

/// The index's file name in the report directory.
pub(crate) const INDEX_FILE: &str = "runs.json";

/// How the benchmark was run, and on what.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Meta {
    /// The preset's name (`quick`, `standard`, `full`).
    pub preset: String,
    /// Seconds per fio run.
    pub runtime: u32,
    /// Bytes per device or image.
    pub size: u64,
    /// fio runs per figure (repetitions).
    pub repeats: u32,
    /// Unix time the run started.
    pub started: u64,
    /// Ordered facts: CPU, kernel, tool versions, ...
    pub env: Vec<(String, String)>,
    /// Caveats printed at the top of the report (TCG emulation, missing fonts, ...).
    #[serde(default)]
    pub notes: Vec<String>,
}

/// What became of a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Status {
    /// It was set up and its workloads ran (single runs may still have failed).
    Ok,
    /// It could not run here (a missing tool, no VM harness, ...).
    Skipped,
    /// Setting it up failed.
    Failed,
}

/// One target (server or device) of the run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct TargetRecord {
    /// Unique and file-name safe, e.g. `cryptblk-aes-xts-plain64-512-4096`.
    pub id: String,
    /// Its name in tables and charts.
    pub label: String,
    /// "host" (fio over NBD on this machine) or "vm" (block devices in the VM guest);
    /// charts never mix the two.
    pub env: String,
    /// Whether data is encrypted (cipher_null counts as not).
    pub encrypted: bool,
    /// The no-crypto target this one is compared with ("% of plain").
    pub baseline: Option<String>,
    /// Whether it ran.
    pub status: Status,
    /// Why it was skipped or failed.
    pub reason: Option<String>,
    /// How the server or device was set up.
    #[serde(default)]
    pub setup: Vec<String>,
}

/// One fio run: a repetition of a workload on a target.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RunRecord {
    /// The [`TargetRecord::id`] it ran on.
    pub target: String,
    /// The [`Workload::id`] it ran.
    pub workload: String,
    /// 1-based repetition.
    pub rep: u32,
    /// fio JSON, relative to the report directory.
    pub file: String,
    /// The fio command line, shell-quoted.
    pub command: String,
    /// Why the run produced no usable result.
    #[serde(default)]
    pub error: Option<String>,
}

/// The whole index: the contents of `runs.json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Index {
    /// How the benchmark was run.
    pub meta: Meta,
    /// The workloads, in report order.
    pub workloads: Vec<Workload>,
    /// Every target considered, including those skipped or failed.
    pub targets: Vec<TargetRecord>,
    /// Every fio run, in the order run.
    pub runs: Vec<RunRecord>,
}

impl Index {
    /// Reads `runs.json` from the report directory `dir`.
    pub(crate) fn load(dir: &std::path::Path) -> Result<Index, String> {
        let p = dir.join(INDEX_FILE);
        let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
    }

    /// Writes `runs.json` into the report directory `dir`.
    pub(crate) fn save(&self, dir: &std::path::Path) -> Result<(), String> {
        let p = dir.join(INDEX_FILE);
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
    }
}
