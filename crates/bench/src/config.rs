//! What `cryptblk bench` was asked to do, and what follows from it.

use crate::fio::{RunParams, Workload};
use crate::preset::Preset;
use crate::target::CipherChoice;
use std::path::PathBuf;

/// What `cryptblk bench` was asked to do.
#[derive(Clone, Debug)]
pub struct Config {
    /// The workload matrix, and the defaults of the three overrides below.
    pub preset: Preset,
    /// Seconds per fio run, instead of the preset's.
    pub runtime: Option<u32>,
    /// Bytes per device or image, instead of the preset's.
    pub size: Option<u64>,
    /// fio runs per figure, instead of the preset's.
    pub repeats: Option<u32>,
    /// cryptblk targets (one per entry); empty: aes-xts-plain64:512:4096.
    pub ciphers: Vec<CipherChoice>,
    /// Report directory.
    pub out: PathBuf,
    /// Images and sockets (default: a directory under /dev/shm).
    pub work: PathBuf,
    /// The cryptblk binary the cryptblk targets run.
    pub cryptblk: PathBuf,
    /// How the report names that cryptblk (version and path).
    pub cryptblk_version: String,
    /// Only targets whose id starts with one of these.
    pub targets: Vec<String>,
    /// Only workloads whose id starts with one of these (or whose family is named).
    pub workloads: Vec<String>,
    /// Run the host (NBD) targets.
    pub host: bool,
    /// Run the VM targets.
    pub vm: bool,
    /// The VM harness (tests/vm/vm.sh).
    pub vm_harness: PathBuf,
}

impl Config {
    /// Run length and size, the overrides applied (at least 1 s).
    pub(crate) fn params(&self) -> RunParams {
        RunParams {
            runtime: self.runtime.unwrap_or(self.preset.runtime()).max(1),
            size: self.size.unwrap_or(self.preset.size()),
        }
    }

    /// fio runs per figure, the override applied (at least 1).
    pub(crate) fn repeats(&self) -> u32 {
        self.repeats.unwrap_or(self.preset.repeats()).max(1)
    }

    /// fio runs per target: every repetition of every workload.
    pub(crate) fn runs_per_target(&self, workloads: &[Workload]) -> usize {
        workloads.len() * self.repeats() as usize
    }

    /// The preset's workloads that `workloads` selects (all if it is empty).
    pub(crate) fn selected_workloads(&self) -> Vec<Workload> {
        self.preset
            .workloads()
            .into_iter()
            .filter(|w| {
                self.workloads.is_empty()
                    || self.workloads.iter().any(|f| {
                        w.id.starts_with(f.as_str())
                            || serde_json::to_value(w.family)
                                .ok()
                                .and_then(|v| v.as_str().map(|s| s == f))
                                == Some(true)
                    })
            })
            .collect()
    }

    /// Whether `targets` selects the target `id` (all are if it is empty).
    pub(crate) fn wants_target(&self, id: &str) -> bool {
        self.targets.is_empty() || self.targets.iter().any(|f| id.starts_with(f.as_str()))
    }
}
