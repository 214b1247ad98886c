//! What a package installs besides the binary: the man pages (`generate-man`, rendered by
//! groff with its warnings on) and the shell completion (clap_complete's dynamic engine,
//! registered in bash as the package registers it, then asked as bash asks: commands,
//! options, the volumes served now, block devices; fish the same where it is installed).

use crate::common::{bin, ok, run_in};
use std::path::Path;
use std::process::Command;

#[test]
fn man_pages_render_for_cryptblk_and_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(&run_in(bin(), &["generate-man", d.to_str().unwrap()], b""));
    let help = ok(&run_in(bin(), &["--help"], b""));
    // One page per command `--help` lists (hidden ones aside), and cryptblk.8.
    let commands: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert!(commands.len() > 30, "{help}");
    for page in std::iter::once("cryptblk".to_string())
        .chain(commands.iter().map(|c| format!("cryptblk-{c}")))
    {
        let path = d.join(format!("{page}.8"));
        assert!(path.exists(), "{page}.8 is missing");
        let o = Command::new("groff")
            .args(["-man", "-Tutf8", "-ww", "-P-cbou", "-rLL=100n"])
            .arg(&path)
            .env("LC_ALL", "C.UTF-8")
            .output()
            .expect("groff (apt-get install groff-base)");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success() && err.trim().is_empty(), "{page}: {err}");
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(
            text.contains("SYNOPSIS") && text.contains("SEE ALSO"),
            "{page}"
        );
    }
    let render = |page: &str| {
        let o = Command::new("groff")
            .args(["-man", "-Tascii", "-P-cbou", "-rLL=200n"])
            .arg(d.join(format!("{page}.8")))
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let main = render("cryptblk");
    for part in [
        "EXIT STATUS",
        "FRONTENDS",
        "SECURITY",
        "EXAMPLES",
        "/etc/cryptblktab",
        "attach-all",
        "cryptsetup(8)",
    ] {
        assert!(main.contains(part), "cryptblk.8 lacks {part}:\n{main}");
    }
    let version = ok(&run_in(bin(), &["--version"], b""));
    let release = version.split_whitespace().nth(1).unwrap().to_string();
    assert!(main.contains(&release), "the release is on the page");
    let open = render("cryptblk-open");
    for part in [
        "--nbd",
        "--ublk",
        "--vhost-user-blk",
        "--crypttab",
        "EXAMPLES",
    ] {
        assert!(open.contains(part), "cryptblk-open.8 lacks {part}:\n{open}");
    }
}

#[test]
fn version_names_the_release_and_the_commit() {
    let v = ok(&run_in(bin(), &["--version"], b""));
    let words: Vec<&str> = v.split_whitespace().collect();
    assert_eq!(words[0], "cryptblk", "{v}");
    assert_eq!(words[1], env!("CARGO_PKG_VERSION"), "{v}");
    assert_eq!(words[2], "(commit", "{v}");
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match head {
        Some(h) => assert_eq!(words[3], format!("{h})"), "{v}"),
        None => eprintln!("NOT CHECKED: no git checkout here to compare the commit with ({v})"),
    }
}

/// Asks bash's completion for `words` (the last one being completed), with the script
/// `COMPLETE=bash cryptblk` prints registered, as the package registers it.
fn bash_complete(run_dir_parent: &Path, words: &[&str]) -> Vec<String> {
    let line = words.join(" ");
    let script = format!(
        "source <(COMPLETE=bash cryptblk) || exit 1\n\
         complete -p cryptblk >/dev/null || exit 2\n\
         COMP_WORDS=({words})\n\
         COMP_CWORD={cword}\n\
         COMP_LINE='{line}'\n\
         COMP_POINT=${{#COMP_LINE}}\n\
         f=$(complete -p cryptblk | sed -n 's/.*-F \\([^ ]*\\).*/\\1/p')\n\
         \"$f\" cryptblk '{last}' '{prev}'\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        words = words
            .iter()
            .map(|w| format!("'{w}'"))
            .collect::<Vec<_>>()
            .join(" "),
        cword = words.len() - 1,
        last = words[words.len() - 1],
        prev = words[words.len() - 2],
    );
    let o = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .env("PATH", path_with_bin())
        .env("XDG_RUNTIME_DIR", run_dir_parent)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "bash completion failed ({:?}): {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn bash_completes_commands_options_served_volumes_and_devices() {
    let xdg = tempfile::tempdir().unwrap();
    let x = xdg.path();
    let got = bash_complete(x, &["cryptblk", "clo"]);
    assert_eq!(got, ["close"], "commands");
    let got = bash_complete(x, &["cryptblk", "open", "--nb"]);
    assert!(got.contains(&"--nbd".to_string()), "options: {got:?}");
    let got = bash_complete(x, &["cryptblk", "format", "--type", "lu"]);
    assert!(got.contains(&"luks2".to_string()), "values: {got:?}");
    // A served volume: its name completes `close` (the default run directory under
    // $XDG_RUNTIME_DIR, as the server's).
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    let o = Command::new(bin())
        .args([
            "open",
            "mem:16M",
            "completed-vol",
            "--nbd",
            &format!("unix:{}", sock.display()),
            "--daemon",
        ])
        .env("XDG_RUNTIME_DIR", x)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = bash_complete(x, &["cryptblk", "close", "comp"]);
    let _ = Command::new(bin())
        .args(["close", "completed-vol"])
        .env("XDG_RUNTIME_DIR", x)
        .output();
    assert_eq!(got, ["completed-vol"], "served volumes");
    // DEVICE: files, and the block devices before anything is typed.
    std::fs::write(dir.path().join("disk.img"), b"").unwrap();
    let prefix = format!("{}/di", dir.path().display());
    let got = bash_complete(x, &["cryptblk", "dump", &prefix]);
    assert_eq!(got, [format!("{}/disk.img", dir.path().display())], "files");
    // Other tests of this binary add and remove devices meanwhile: those present before
    // and after are the ones that must be offered.
    let blocks = || -> Vec<String> {
        std::fs::read_dir("/sys/class/block")
            .map(|r| {
                r.flatten()
                    .map(|e| format!("/dev/{}", e.file_name().to_string_lossy()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = blocks();
    let got = bash_complete(x, &["cryptblk", "dump", ""]);
    let after = blocks();
    let steady: Vec<&String> = before.iter().filter(|b| after.contains(b)).collect();
    assert!(
        steady.iter().all(|b| got.contains(b)),
        "block devices {steady:?} in {got:?}"
    );
    if steady.is_empty() {
        eprintln!("NOT CHECKED: this machine has no block device to offer");
    } else {
        assert!(got.iter().any(|g| g.starts_with("/dev/")), "{got:?}");
    }
}

#[test]
fn fish_completes_commands() {
    let Some(fish) = shell("fish") else {
        return;
    };
    let o = Command::new(fish)
        .args([
            "--no-config",
            "-c",
            "COMPLETE=fish cryptblk | source; complete -C 'cryptblk clo'",
        ])
        .env("PATH", path_with_bin())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.lines().any(|l| l.split('\t').next() == Some("close")),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// PATH with the binary under test first, as an installed `cryptblk` would be found.
fn path_with_bin() -> String {
    let dir = Path::new(bin()).parent().unwrap();
    format!("{}:{}", dir.display(), std::env::var("PATH").unwrap())
}

/// The shell `name` on PATH. Missing, it fails the test under CI (scripts/setup.sh
/// installs it) and says loudly elsewhere that the test did not run.
fn shell(name: &str) -> Option<String> {
    let found = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| format!("{d}/{name}"))
        .find(|p| Path::new(p).exists());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is not installed: scripts/setup.sh installs it for CI"
        );
        eprintln!("NOT RUN: {name} is not installed (apt-get install {name})");
    }
    found
}

#[test]
fn zsh_registers_the_completion() {
    let Some(zsh) = shell("zsh") else {
        return;
    };
    let o = Command::new(zsh)
        .args([
            "-f",
            "-c",
            "autoload -U compinit && compinit -u -D && source <(COMPLETE=zsh cryptblk) && print -r -- ${_comps[cryptblk]}",
        ])
        .env("PATH", path_with_bin())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.trim().contains("cryptblk"),
        "zsh: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
