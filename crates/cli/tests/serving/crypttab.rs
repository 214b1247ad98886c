//! crypttab files: `attach-all`, `detach-all`, `open --crypttab FILE NAME`, end to end
//! over NBD (the parser's own cases are unit tests in `src/crypttab.rs`).

use crate::common::nbd::NbdClient;
use crate::common::{bin, ok, run_in};
use std::path::Path;
use std::process::Output;

fn run(args: &[&str]) -> Output {
    run_in(bin(), args, b"")
}

fn p(d: &Path, f: &str) -> String {
    d.join(f).to_str().unwrap().to_string()
}

fn active(d: &Path, name: &str) -> bool {
    run(&["status", name, "--run-dir", &p(d, "run")])
        .status
        .success()
}

/// A LUKS2 image with a key file (entry `a`, NBD socket named in its line), a plain one
/// (entry `b`, no frontend named: NBD in the run directory), a `noauto` one and a
/// `nofail` one whose device does not exist.
fn setup(d: &Path) -> String {
    std::fs::write(p(d, "a.key"), b"crypttab passphrase").unwrap();
    std::fs::write(p(d, "b.key"), [7u8; 64]).unwrap();
    std::fs::File::create(p(d, "b.img"))
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    crate::common::quick_luks2(&p(d, "a.img"), &p(d, "a.key"), 32);
    let tab = p(d, "cryptblktab");
    std::fs::write(
        &tab,
        format!(
            "# name device key options\n\
             a {a} {akey} luks,discard,nbd=unix:{asock}\n\
             \n\
             b \"{b}\" {bkey} plain,cipher=aes-xts-plain64,size=512,offset=8\n\
             c /nonexistent/c.img none luks,noauto\n\
             d /nonexistent/d.img none luks,nofail\n",
            a = p(d, "a.img"),
            akey = p(d, "a.key"),
            asock = p(d, "a.sock"),
            b = p(d, "b.img"),
            bkey = p(d, "b.key"),
        ),
    )
    .unwrap();
    tab
}

#[test]
fn attach_all_serves_the_auto_entries_and_detach_all_closes_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tab = setup(d);
    let run_dir = p(d, "run");
    let o = run(&["attach-all", "--crypttab", &tab, "--run-dir", &run_dir]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "attach-all failed: {err}");
    assert!(
        err.contains("d: not opened (line 6, nofail"),
        "the nofail entry's failure is reported: {err}"
    );
    assert!(active(d, "a") && active(d, "b"), "a and b are served");
    assert!(!active(d, "c"), "the noauto entry is left alone");
    assert!(!active(d, "d"));

    // a: LUKS2 with its key file over its own socket; b: plain, on b.nbd in the run dir.
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 31 % 251) as u8).collect();
    for (name, sock) in [("a", p(d, "a.sock")), ("b", p(d, "run/b.nbd"))] {
        let mut c = NbdClient::connect(&sock, name).unwrap();
        c.write(4096, &data).unwrap().unwrap();
        c.flush().unwrap().unwrap();
        assert_eq!(c.read(4096, data.len()).unwrap().unwrap(), data);
        c.disconnect();
    }
    // b's offset=8: its byte 4096 is the image's 8192 (the image's first 8 KiB are never
    // written), and nothing is in the clear.
    let raw = std::fs::read(p(d, "b.img")).unwrap();
    assert!(
        raw[..8192].iter().all(|&b| b == 0),
        "written below offset=8"
    );
    assert!(
        raw[8192..8192 + 8192].iter().any(|&b| b != 0),
        "not written at offset=8"
    );
    assert!(!raw.windows(64).any(|w| w == &data[..64]));

    // Again: what is open stays open, nothing fails.
    ok(&run(&[
        "attach-all",
        "--crypttab",
        &tab,
        "--run-dir",
        &run_dir,
    ]));

    ok(&run(&[
        "detach-all",
        "--crypttab",
        &tab,
        "--run-dir",
        &run_dir,
    ]));
    assert!(!active(d, "a") && !active(d, "b"), "detach-all closed both");

    // One entry by name: the data written before is there.
    ok(&run(&[
        "open",
        "--crypttab",
        &tab,
        "b",
        "--daemon",
        "--run-dir",
        &run_dir,
    ]));
    let mut c = NbdClient::connect(&p(d, "run/b.nbd"), "b").unwrap();
    assert_eq!(c.read(4096, data.len()).unwrap().unwrap(), data);
    c.disconnect();
    // The command line adds to the line: read-only.
    ok(&run(&["close", "b", "--run-dir", &run_dir]));
    ok(&run(&[
        "open",
        "--crypttab",
        &tab,
        "a",
        "--readonly",
        "--daemon",
        "--run-dir",
        &run_dir,
    ]));
    let mut c = NbdClient::connect(&p(d, "a.sock"), "a").unwrap();
    assert_eq!(c.read(4096, data.len()).unwrap().unwrap(), data);
    assert!(
        c.write(0, &data[..512]).unwrap().is_err(),
        "a write to a read-only volume is refused"
    );
    c.disconnect();
    ok(&run(&[
        "detach-all",
        "--crypttab",
        &tab,
        "--run-dir",
        &run_dir,
    ]));
    assert!(!active(d, "a"));
}

#[test]
fn a_bad_line_or_a_missing_entry_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tab = p(d, "tab");
    std::fs::write(
        &tab,
        "ok /dev/null none luks\nbad /dev/null none luks,frobnicate\n",
    )
    .unwrap();
    for args in [
        vec!["attach-all", "--crypttab", &tab],
        vec!["open", "--crypttab", &tab, "ok"],
    ] {
        let o = run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success());
        assert!(
            err.contains(&format!("{tab}:2: unknown option \"frobnicate\"")),
            "{args:?}: {err}"
        );
    }
    std::fs::write(&tab, "ok /dev/null none luks\n").unwrap();
    let o = run(&["open", "--crypttab", &tab, "other"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no entry named other"));
    let o = run(&["open", "--crypttab", &tab, "ok", "extra"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("give only the entry's NAME"));
}
