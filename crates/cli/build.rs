//! The commit cryptblk is built from, for `--version`: `$CRYPTBLK_COMMIT` when a package
//! build sets it, else git's HEAD when the source is a checkout, else "unknown" (a source
//! tarball without git).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-env-changed=CRYPTBLK_COMMIT");
    let commit = std::env::var("CRYPTBLK_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            // Built again when HEAD moves (a commit, a checkout); `--git-path` finds the
            // files where a worktree keeps them (its HEAD, the common refs).
            let mut watch = vec!["HEAD".to_string(), "packed-refs".to_string()];
            watch.extend(git(&["symbolic-ref", "-q", "HEAD"]));
            for f in watch {
                if let Some(p) = git(&["rev-parse", "--path-format=absolute", "--git-path", &f]) {
                    println!("cargo:rerun-if-changed={p}");
                }
            }
            git(&["rev-parse", "--short=12", "HEAD"])
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=CRYPTBLK_COMMIT={commit}");
}
