//! A throwaway single-node Ceph cluster (`tests/ceph/cluster.sh`), stopped when dropped.

use super::ok;
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) struct Cluster {
    dir: PathBuf,
    /// The cluster's ceph.conf, for `--ceph-conf` and librados.
    pub conf: String,
    script: PathBuf,
}

impl Cluster {
    /// Starts one in `dir/ceph`; python3-rbd, ceph-mon, ceph-osd and ceph-common must be
    /// there (the script says which is missing).
    pub(crate) fn start(dir: &Path) -> Cluster {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/ceph/cluster.sh");
        let dir = dir.join("ceph");
        let o = Command::new("bash")
            .arg(&script)
            .arg("start")
            .arg(&dir)
            .output()
            .unwrap();
        let conf = ok(&o).trim().to_string();
        Cluster { dir, conf, script }
    }

    pub(crate) fn stop(&self) {
        let _ = Command::new("bash")
            .arg(&self.script)
            .arg("stop")
            .arg(&self.dir)
            .output();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}
