//! The report generator on recorded (trimmed) fio JSON with known values.

use std::path::{Path, PathBuf};

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).unwrap();
        }
    }
}

fn fixture() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("basic");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/basic"),
        &dir,
    );
    (t, dir)
}

fn row<'a>(md: &'a str, section: &str, label: &str) -> &'a str {
    let start = md
        .find(section)
        .unwrap_or_else(|| panic!("no section {section}"));
    md[start..]
        .lines()
        .find(|l| l.starts_with(&format!("| {label} |")))
        .unwrap_or_else(|| panic!("no row {label} in {section}"))
}

#[test]
fn known_values_come_out_exactly() {
    let (_t, dir) = fixture();
    let charts = cryptblk_bench::report::generate(&dir).unwrap();
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();

    // Cloudflare: plain 150/160/140 MB/s, cryptblk 75/70/80 MB/s → 50 %.
    let cf = "### Cloudflare test";
    let plain = row(&md, cf, "plain NBD");
    assert!(plain.contains("| 150.0 (140.0–160.0) |"), "{plain}");
    // read clat p50 median(12.345, 12.0, 13.0) µs, p99 median(20, 21, 19), p99.9 median(30, 31, 29)
    assert!(plain.contains("| 12.3 / 20.0 / 30.0 |"), "{plain}");
    assert!(plain.contains("| 8.0 / 16.0 / 64.0 |"), "{plain}");
    assert!(plain.contains("| 36621 (34180–"), "{plain}");
    let aes = row(&md, cf, "cryptblk aes");
    assert!(aes.contains("| 75.0 (70.0–80.0) |"), "{aes}");
    assert!(aes.ends_with("| 50 % |"), "{aes}");
    assert!(
        aes.contains("| 20.0 / 40.0 / 80.0 | 21.0 / 41.0 / 81.0 |"),
        "{aes}"
    );

    // Cybozu: plain 200 / 400, cryptblk 100 / 300 (its third j2 run failed: 2 results).
    let cy = "### Cybozu matrix";
    let p = row(&md, cy, "plain NBD");
    assert!(
        p.contains("| 200.0 (200.0–200.0) (48828) | 400.0 (400.0–400.0) (97656) |"),
        "{p}"
    );
    let a = row(&md, cy, "cryptblk aes");
    assert!(
        a.contains("| 100.0 (100.0–100.0) (24414) | 300.0 (300.0–300.0) (73242) |"),
        "{a}"
    );
    let pct = "### Throughput as % of plain";
    assert!(row(&md, pct, "cybozu-randread-4k-j1").contains("| 50 % |"));
    assert!(row(&md, pct, "cybozu-randread-4k-j2").contains("| 75 % |"));
    assert!(row(&md, pct, "cloudflare-4k-rw-qd1").contains("| 50 % |"));

    // Environment, skipped target with its reason, the failed run, the commands.
    assert!(md.contains("| CPU | Fixture CPU |"));
    assert!(md.contains("| kernel | 6.1.0-fixture |"));
    assert!(md.contains("- `nbdkit-luks`: nbdkit not found in PATH (apt-get install nbdkit)"));
    assert!(md.contains("**skipped**: nbdkit not found in PATH"));
    assert!(md.contains("## Failed runs"));
    assert!(md.contains("`cryptblk-aes` / `cybozu-randread-4k-j2` rep 3: fio exited"));
    assert!(md.contains("fio --name=cloudflare-4k-rw-qd1 ..."));
    assert!(md.contains("# cryptblk-aes: cryptblk format ..."));

    // Charts: throughput and IOPS by jobs, latency per direction, % of plain; SVG + PNG.
    let names: Vec<String> = charts
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for n in [
        "host-cybozu-randread-4k-mbs",
        "host-cybozu-randread-4k-iops",
        "host-lat-cloudflare-4k-rw-qd1-read",
        "host-lat-cloudflare-4k-rw-qd1-write",
        "host-pct-of-plain",
    ] {
        for ext in ["svg", "png"] {
            let f = format!("{n}.{ext}");
            assert!(names.contains(&f), "missing {f} in {names:?}");
            let bytes = std::fs::read(dir.join("charts").join(&f)).unwrap();
            if ext == "png" {
                assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
                assert!(bytes.len() > 2000, "{f} is suspiciously small");
            }
            assert!(
                md.contains(&format!("charts/{f}")),
                "report does not link {f}"
            );
        }
    }
    let pct_svg = std::fs::read_to_string(dir.join("charts/host-pct-of-plain.svg")).unwrap();
    assert!(pct_svg.contains("cloudflare-4k-rw-qd1 / cryptblk aes vs plain: 50<"));
    assert!(pct_svg.contains("cybozu-randread-4k-j2 / cryptblk aes vs plain: 75<"));
    let line = std::fs::read_to_string(dir.join("charts/host-cybozu-randread-4k-mbs.svg")).unwrap();
    assert_eq!(line.matches("<polyline").count(), 2, "one line per target");
    assert!(line.contains("cryptblk aes: 300<"));
}

#[test]
fn a_broken_result_file_is_a_failed_run_not_a_crash() {
    let (_t, dir) = fixture();
    std::fs::write(
        dir.join("raw/plain/cybozu-randread-4k-j1.r2.json"),
        "{ truncated",
    )
    .unwrap();
    cryptblk_bench::report::generate(&dir).unwrap();
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("`plain` / `cybozu-randread-4k-j1` rep 2: fio JSON"));
    // The two remaining repetitions still give the figure.
    assert!(row(&md, "### Cybozu matrix", "plain NBD").contains("| 200.0 (200.0–200.0) (48828) |"));
}

#[test]
fn missing_index_is_a_clear_error() {
    let t = tempfile::tempdir().unwrap();
    let e = cryptblk_bench::report::generate(t.path()).unwrap_err();
    assert!(e.contains("runs.json"), "{e}");
}
