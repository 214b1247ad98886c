//! `open --ublk` on the host. The kernel side is tested in the VM (tests/vm/ublk.sh); here:
//! option checks, and a clear error where the kernel has no ublk.

use crate::common::{bin, run_in};
use std::path::Path;

#[test]
fn open_ublk_without_the_driver_says_so_or_validates_settings() {
    let dir = tempfile::tempdir().unwrap();
    let rd = dir.path().join("run");
    let o = run_in(
        bin(),
        &[
            "open",
            "mem:16M",
            "u",
            "--ublk",
            "--queue-depth",
            "0",
            "--run-dir",
            rd.to_str().unwrap(),
        ],
        b"",
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "must fail: {err}");
    if Path::new("/dev/ublk-control").exists() {
        // With the driver present, it gets as far as checking the queue depth.
        assert!(err.contains("queue depth 0"), "{err}");
    } else {
        assert_eq!(o.status.code(), Some(4), "{err}");
        assert!(
            err.contains("ublk not available: /dev/ublk-control missing (modprobe ublk_drv)"),
            "{err}"
        );
    }
    assert!(!rd.join("u.pid").exists() && !rd.join("u.ublk").exists());
}

#[test]
fn ublk_options_need_ublk_and_one_frontend() {
    let o = run_in(
        bin(),
        &[
            "open",
            "mem:16M",
            "u",
            "--nbd",
            "unix:/tmp/x",
            "--queues",
            "2",
        ],
        b"",
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("need --ublk"));
    let o = run_in(
        bin(),
        &["open", "mem:16M", "u", "--nbd", "unix:/tmp/x", "--ublk"],
        b"",
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("one frontend"));
    let o = run_in(
        bin(),
        &[
            "open",
            "mem:16M",
            "u",
            "--ublk",
            "--recover",
            "--no-recovery",
        ],
        b"",
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("exclude each other"));
}

#[test]
fn close_of_an_unknown_name_still_says_not_active() {
    let dir = tempfile::tempdir().unwrap();
    let rd = dir.path().to_str().unwrap();
    let o = run_in(bin(), &["close", "nothing", "--run-dir", rd], b"");
    assert_eq!(o.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is not active"));
}
