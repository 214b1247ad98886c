//! Which disk a partition belongs to, from sysfs: TrueCrypt/VeraCrypt system encryption
//! keeps its header on the disk while the data lies in the partition.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// A partition block device's disk and where the partition starts on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// The whole disk's device node (`/dev/NAME`, checked to be that disk).
    pub disk: PathBuf,
    /// The partition's first sector on the disk, in 512-byte sectors.
    pub start: u64,
}

fn major_minor(rdev: u64) -> (u64, u64) {
    // glibc's gnu_dev_major / gnu_dev_minor.
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | (((rdev >> 12) as u32 as u64) & !0xff);
    (major, minor)
}

fn sysfs_number(path: &Path) -> io::Result<u64> {
    let s = std::fs::read_to_string(path)?;
    s.trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("{}", path.display())))
}

/// `Some` when `path` is a partition's block device; `None` for a whole disk, a file or
/// any other block device.
pub fn partition_of(path: &Path) -> io::Result<Option<Partition>> {
    let meta = std::fs::metadata(path)?;
    if !meta.file_type().is_block_device() {
        return Ok(None);
    }
    let (major, minor) = major_minor(meta.rdev());
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if !sys.join("partition").exists() {
        return Ok(None);
    }
    let start = sysfs_number(&sys.join("start"))?;
    let disk_sys = std::fs::canonicalize(&sys)?
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| io::Error::other("partition without a parent in sysfs"))?;
    let name = disk_sys
        .file_name()
        .ok_or_else(|| io::Error::other("partition without a parent in sysfs"))?;
    let want = std::fs::read_to_string(disk_sys.join("dev"))?;
    let disk = Path::new("/dev").join(name);
    // /dev is root's; still, the node must be that disk and not something else named so.
    let dm = std::fs::metadata(&disk)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", disk.display())))?;
    let (dmaj, dmin) = major_minor(dm.rdev());
    if !dm.file_type().is_block_device() || format!("{dmaj}:{dmin}") != want.trim() {
        return Err(io::Error::other(format!(
            "{} is not the disk of partition {}",
            disk.display(),
            path.display()
        )));
    }
    Ok(Some(Partition { disk, start }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_not_partitions() {
        let f = std::env::temp_dir();
        assert_eq!(partition_of(&f).unwrap(), None);
        assert_eq!(major_minor(0x0000_0000_0000_0801), (8, 1));
        assert_eq!(major_minor((259u64 << 8) | 3), (259, 3));
        // glibc's makedev for major 4096, minor 5: the high major bits sit above bit 32.
        let rdev = ((4096u64 & 0xffff_f000) << 32) | 5;
        assert_eq!(major_minor(rdev), (4096, 5));
    }
}
