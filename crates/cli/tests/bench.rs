//! `cryptblk bench` end to end with the real fio, nbdkit and qemu-nbd, and its bad inputs;
//! `cryptblk benchmark --chart`.

mod common;

use common::{bin, tool};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn bench(args: &[&str], path: Option<&str>) -> Output {
    let mut c = Command::new(bin());
    c.arg("bench").args(args);
    if let Some(p) = path {
        c.env("PATH", p);
    }
    c.output().unwrap()
}

fn index(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("runs.json")).unwrap()).unwrap()
}

fn target<'a>(idx: &'a Value, id: &str) -> &'a Value {
    idx["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id)
        .unwrap_or_else(|| panic!("no target {id}"))
}

#[test]
fn quick_run_end_to_end_over_nbd() {
    tool("fio", "fio");
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("report");
    let work = t.path().join("work");
    let o = bench(
        &[
            "--quick",
            "--size",
            "64M",
            "--runtime",
            "1",
            "--repeats",
            "1",
            "--workloads",
            "cloudflare,cybozu,sync",
            "--out",
            out.to_str().unwrap(),
            "--dir",
            work.to_str().unwrap(),
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("ETA"), "no progress on stderr: {stderr}");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    let idx = index(&out);
    let expected = [
        ("plain", None),
        ("cryptblk-null", None),
        ("cryptblk-aes-xts-plain64-512-4096", None),
        ("nbdkit-raw", Some("nbdkit")),
        ("nbdkit-luks", Some("nbdkit")),
        ("qemu-nbd-raw", Some("qemu-nbd")),
        ("qemu-nbd-luks", Some("qemu-nbd")),
    ];
    for (id, needs) in expected {
        let t = target(&idx, id);
        // scripts/setup.sh installs the peers: here every target must have run.
        if let Some(tool_name) = needs {
            tool(tool_name, tool_name);
        }
        assert_eq!(t["status"], "ok", "{id}: {}", t["reason"]);
        assert!(md.contains(&format!("(`{id}`)")), "{id} not in the report");
    }
    // Every run of every target produced a positive result, from a real fio JSON file.
    let runs = idx["runs"].as_array().unwrap();
    assert_eq!(
        runs.len(),
        expected.len() * 4,
        "7 targets × 4 workloads × 1 repetition"
    );
    for r in runs {
        assert!(r["error"].is_null(), "{r}");
        let raw: Value = serde_json::from_str(
            &std::fs::read_to_string(out.join(r["file"].as_str().unwrap())).unwrap(),
        )
        .unwrap();
        let j = &raw["jobs"][0];
        let bw = j["read"]["bw_bytes"].as_f64().unwrap() + j["write"]["bw_bytes"].as_f64().unwrap();
        assert!(bw > 0.0, "{r}");
        assert!(r["command"].as_str().unwrap().contains("--ioengine=nbd"));
    }
    // The sync workload flushed over NBD (fsync=1), and the report shows the command.
    assert!(md.contains("--fsync=1"));
    assert!(md.contains("| fio | fio-"));
    for chart in [
        "host-cybozu-randread-4k-mbs.png",
        "host-cybozu-randread-4k-iops.svg",
        "host-lat-cloudflare-4k-rw-qd1-read.png",
        "host-lat-sync-write-4k-qd1-write.png",
        "host-pct-of-plain.png",
    ] {
        let p = out.join("charts").join(chart);
        assert!(p.exists(), "{chart} missing");
        assert!(md.contains(&format!("charts/{chart}")));
    }
    // The work directory (images, sockets) is cleaned up.
    assert!(!work.exists() || std::fs::read_dir(&work).unwrap().next().is_none());
}

#[test]
fn missing_peers_are_skipped_with_a_reason_and_the_run_continues() {
    let fio = tool("fio", "fio");
    let t = tempfile::tempdir().unwrap();
    let pathdir = t.path().join("bin");
    std::fs::create_dir(&pathdir).unwrap();
    std::os::unix::fs::symlink(&fio, pathdir.join("fio")).unwrap();
    let out = t.path().join("report");
    let o = bench(
        &[
            "--targets",
            "plain,nbdkit-luks,qemu-nbd-luks",
            "--workloads",
            "cloudflare",
            "--size",
            "64M",
            "--runtime",
            "1",
            "--repeats",
            "1",
            "--out",
            out.to_str().unwrap(),
            "--dir",
            t.path().join("work").to_str().unwrap(),
        ],
        Some(pathdir.to_str().unwrap()),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let idx = index(&out);
    assert_eq!(target(&idx, "plain")["status"], "ok");
    let n = target(&idx, "nbdkit-luks");
    assert_eq!(n["status"], "skipped");
    assert_eq!(
        n["reason"],
        "nbdkit not found in PATH (apt-get install nbdkit)"
    );
    let q = target(&idx, "qemu-nbd-luks");
    assert_eq!(q["status"], "skipped");
    assert_eq!(
        q["reason"],
        "qemu-nbd not found in PATH (apt-get install qemu-utils)"
    );
    assert_eq!(
        idx["targets"].as_array().unwrap().len(),
        3,
        "--targets filter"
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("- `nbdkit-luks`: nbdkit not found in PATH (apt-get install nbdkit)"));
    assert!(md.contains("- `qemu-nbd-luks`: qemu-nbd not found in PATH"));
    assert!(md.contains("| cryptblk NBD, no crypto (plain) | "));
}

#[test]
fn fio_missing_says_how_to_install_it() {
    let t = tempfile::tempdir().unwrap();
    let o = bench(
        &["--out", t.path().join("r").to_str().unwrap()],
        Some(t.path().to_str().unwrap()),
    );
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("fio not found in PATH"), "{e}");
    assert!(e.contains("apt-get install fio"), "{e}");
    assert!(
        !t.path().join("r").exists(),
        "no report directory on failure"
    );
}

#[test]
fn too_little_space_is_refused_before_anything_runs() {
    tool("fio", "fio");
    let t = tempfile::tempdir().unwrap();
    let work = t.path().join("work");
    let o = bench(
        &[
            "--size",
            "100T",
            "--out",
            t.path().join("r").to_str().unwrap(),
            "--dir",
            work.to_str().unwrap(),
        ],
        None,
    );
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("not enough space in the work directory"), "{e}");
    assert!(e.contains("MiB free"), "{e}");
    assert!(e.contains("smaller --size"), "{e}");
    assert!(!t.path().join("r").exists());
}

#[test]
fn bad_cipher_and_size_are_usage_errors() {
    let o = bench(&["--cipher", "aes-xts-plain64:512:1000"], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad sector size '1000'"));
    let o = bench(&["--size", "12Q"], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad size suffix"));
}

#[test]
fn benchmark_chart_has_encrypt_and_decrypt_bars_per_figure() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("charts");
    let o = Command::new(bin())
        .args([
            "benchmark",
            "--cipher",
            "aes-xts-plain64",
            "--seconds",
            "0.01",
            "--json",
            "--chart",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let figures = String::from_utf8_lossy(&o.stdout).lines().count();
    assert_eq!(figures, 6, "2 key sizes × (512/512, 512/4096, 4096/4096)");
    let svg = std::fs::read_to_string(dir.join("cipher-speed.svg")).unwrap();
    assert_eq!(
        svg.matches("<rect x=").count(),
        figures * 2 + 2,
        "encrypt + decrypt bar per figure, 2 legend boxes"
    );
    assert!(svg.contains("aes-xts-plain64 512b sector 4096 req 4096"));
    let png = std::fs::read(dir.join("cipher-speed.png")).unwrap();
    assert_eq!(&png[..4], b"\x89PNG");
    // FILE form.
    let f = t.path().join("one/speed.png");
    let o = Command::new(bin())
        .args([
            "benchmark",
            "--cipher",
            "cipher_null",
            "--seconds",
            "0.01",
            "--chart",
            f.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(t.path().join("one/speed.svg").exists() && f.exists());
    let svg = std::fs::read_to_string(t.path().join("one/speed.svg")).unwrap();
    assert!(svg.contains("cipher_null not drawn"));
}
