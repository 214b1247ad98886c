//! Running the binary and the real tools from the CLI's integration tests.

#![allow(dead_code)] // each test file uses a different subset

use std::path::Path;
use std::process::{Command, Output, Stdio};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cryptblk")
}

/// Path of a system tool; fails (never skips) naming the Debian package to install.
pub fn tool(name: &str, pkg: &str) -> String {
    for d in ["/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/bin"] {
        let p = format!("{d}/{name}");
        if Path::new(&p).exists() {
            return p;
        }
    }
    panic!("{name} not found: install the Debian package {pkg} (scripts/setup.sh does)");
}

/// Runs `cmd` with `stdin` fed to it.
pub fn run_in(cmd: &str, args: &[&str], stdin: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// Asserts success and returns stdout.
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub mod nbd;
