//! The results index (`runs.json` in the report directory): everything the report needs,
//! next to the raw fio JSON files it points to.

use crate::fio::Workload;
use serde::{Deserialize, Serialize};

pub const INDEX_FILE: &str = "runs.json";

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Meta {
    pub preset: String,
    /// Seconds per fio run.
    pub runtime: u32,
    /// Bytes per device or image.
    pub size: u64,
    pub repeats: u32,
    /// Unix time the run started.
    pub started: u64,
    /// Ordered facts: CPU, kernel, tool versions, ...
    pub env: Vec<(String, String)>,
    /// Caveats printed at the top of the report (TCG emulation, missing fonts, ...).
    #[serde(default)]
    pub notes: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Skipped,
    Failed,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TargetRecord {
    pub id: String,
    pub label: String,
    /// "host" (fio over NBD on this machine) or "vm" (block devices in the VM guest);
    /// charts never mix the two.
    pub env: String,
    /// Whether data is encrypted (cipher_null counts as not).
    pub encrypted: bool,
    /// The no-crypto target this one is compared with ("% of plain").
    pub baseline: Option<String>,
    pub status: Status,
    pub reason: Option<String>,
    /// How the server or device was set up.
    #[serde(default)]
    pub setup: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunRecord {
    pub target: String,
    pub workload: String,
    /// 1-based repetition.
    pub rep: u32,
    /// fio JSON, relative to the report directory.
    pub file: String,
    pub command: String,
    /// Why the run produced no usable result.
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Index {
    pub meta: Meta,
    pub workloads: Vec<Workload>,
    pub targets: Vec<TargetRecord>,
    pub runs: Vec<RunRecord>,
}

impl Index {
    pub fn load(dir: &std::path::Path) -> Result<Index, String> {
        let p = dir.join(INDEX_FILE);
        let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
    }

    pub fn save(&self, dir: &std::path::Path) -> Result<(), String> {
        let p = dir.join(INDEX_FILE);
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
    }
}
