//! The workload presets: `quick` (the default, under two minutes), `standard`, `full`.

use crate::fio::{Family, Workload};
use serde::{Deserialize, Serialize};

/// A workload matrix with its run length, repetitions and device size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    /// A small matrix, 1 s runs, 2 repetitions, 256 MiB: under two minutes.
    Quick,
    /// The Cybozu matrix up to 4 jobs, Ceph 4M/4K, 2 s runs, 3 repetitions, 1 GiB.
    Standard,
    /// The Cybozu matrix up to 16 jobs, Ceph 4M/4K, 10 s runs, 5 repetitions, 4 GiB.
    Full,
}

impl Preset {
    /// The preset's name as the report shows it (and `from_str` takes it).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Preset::Quick => "quick",
            Preset::Standard => "standard",
            Preset::Full => "full",
        }
    }

    /// Seconds per fio run.
    pub(crate) fn runtime(self) -> u32 {
        match self {
            Preset::Quick => 1,
            Preset::Standard => 2,
            Preset::Full => 10,
        }
    }

    /// Runs per figure (min / median / max are shown).
    pub(crate) fn repeats(self) -> u32 {
        match self {
            Preset::Quick => 2,
            Preset::Standard => 3,
            Preset::Full => 5,
        }
    }

    /// Bytes of each device or image.
    pub(crate) fn size(self) -> u64 {
        match self {
            Preset::Quick => 256 << 20,
            Preset::Standard => 1 << 30,
            Preset::Full => 4 << 30,
        }
    }

    /// The workloads, in report order.
    pub(crate) fn workloads(self) -> Vec<Workload> {
        let mut v = vec![Workload::new(
            "cloudflare-4k-rw-qd1",
            Family::Cloudflare,
            "readwrite",
            "4k",
            1,
            1,
        )];
        let (rws, sizes, jobs): (&[&str], &[&str], &[u32]) = match self {
            Preset::Quick => (&["randread"], &["4k"], &[1, 2]),
            Preset::Standard => (
                &["read", "write", "randread", "randwrite"],
                &["4k", "128k"],
                &[1, 2, 4],
            ),
            Preset::Full => (
                &["read", "write", "randread", "randwrite"],
                &["4k", "128k"],
                &[1, 2, 4, 8, 16],
            ),
        };
        for rw in rws {
            for bs in sizes {
                for &j in jobs {
                    v.push(Workload::new(
                        &format!("cybozu-{rw}-{bs}-j{j}"),
                        Family::Cybozu,
                        rw,
                        bs,
                        1,
                        j,
                    ));
                }
            }
        }
        let ceph: &[(&str, &str)] = match self {
            Preset::Quick => &[("randwrite", "4k")],
            _ => &[
                ("randread", "4M"),
                ("randwrite", "4M"),
                ("randread", "4k"),
                ("randwrite", "4k"),
            ],
        };
        for (rw, bs) in ceph {
            v.push(Workload::new(
                &format!("ceph-{rw}-{}-qd32", bs.to_lowercase()),
                Family::Ceph,
                rw,
                bs,
                32,
                1,
            ));
        }
        let mut s = Workload::new("sync-write-4k-qd1", Family::Sync, "write", "4k", 1, 1);
        s.sync = true;
        v.push(s);
        v
    }
}

impl std::str::FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "quick" => Ok(Preset::Quick),
            "standard" => Ok(Preset::Standard),
            "full" => Ok(Preset::Full),
            _ => Err(format!("unknown preset '{s}' (quick, standard, full)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_every_family_is_present() {
        for p in [Preset::Quick, Preset::Standard, Preset::Full] {
            let w = p.workloads();
            let mut ids: Vec<_> = w.iter().map(|w| w.id.clone()).collect();
            ids.sort();
            ids.dedup();
            assert_eq!(ids.len(), w.len(), "{p:?}");
            for f in [
                Family::Cloudflare,
                Family::Cybozu,
                Family::Ceph,
                Family::Sync,
            ] {
                assert!(w.iter().any(|w| w.family == f), "{p:?} lacks {f:?}");
            }
        }
        assert_eq!(Preset::Standard.workloads().len(), 1 + 24 + 4 + 1);
    }
}
