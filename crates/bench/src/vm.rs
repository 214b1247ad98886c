//! VM targets: brd, dm-crypt (default and each performance flag, cipher_null) and
//! cryptblk over ublk, measured by fio on block devices inside a throwaway VM. The guest
//! runs a generated script (`guest.sh` in the report directory, mounted at /results).

use crate::fio::{IoPath, Workload, command_line, fio_args, shell_quote};
use crate::model::{Index, RunRecord, Status, TargetRecord};
use crate::runner::{Config, Progress};
use crate::target::CipherChoice;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmKind {
    Brd,
    /// dm-crypt with this cipher and these optional table parameters.
    DmCrypt {
        cipher: CipherChoice,
        flags: Vec<String>,
    },
    DmNull,
    CryptblkUblk,
}

#[derive(Clone, Debug)]
pub struct VmTarget {
    pub id: String,
    pub label: String,
    pub kind: VmKind,
    pub encrypted: bool,
}

const GUEST_RESULTS: &str = "/results";
const SKIP_UBLK: &str = "cryptblk has no ublk frontend in this build";

pub fn vm_targets(ciphers: &[CipherChoice]) -> Vec<VmTarget> {
    let mut v = vec![VmTarget {
        id: "vm-brd".into(),
        label: "brd (plain)".into(),
        kind: VmKind::Brd,
        encrypted: false,
    }];
    for (i, c) in ciphers.iter().enumerate() {
        let flagsets: &[(&str, &[&str])] = if i == 0 {
            &[
                ("default", &[]),
                ("same_cpu_crypt", &["same_cpu_crypt"]),
                ("submit_from_crypt_cpus", &["submit_from_crypt_cpus"]),
                ("no_workqueue", &["no_read_workqueue", "no_write_workqueue"]),
                ("high_priority", &["high_priority"]),
            ]
        } else {
            &[("default", &[])]
        };
        for (name, flags) in flagsets {
            v.push(VmTarget {
                id: format!(
                    "vm-dmcrypt-{}-{}-{}-{name}",
                    c.spec.replace(':', "_"),
                    c.key_bits,
                    c.sector
                ),
                label: format!(
                    "dm-crypt {} {}b {}B, {}",
                    c.spec,
                    c.key_bits,
                    c.sector,
                    name.replace('_', " ")
                ),
                kind: VmKind::DmCrypt {
                    cipher: c.clone(),
                    flags: flags.iter().map(|s| s.to_string()).collect(),
                },
                encrypted: true,
            });
        }
    }
    v.push(VmTarget {
        id: "vm-dmcrypt-null".into(),
        label: "dm-crypt cipher_null".into(),
        kind: VmKind::DmNull,
        encrypted: false,
    });
    v.push(VmTarget {
        id: "vm-cryptblk-ublk".into(),
        label: "cryptblk over ublk".into(),
        kind: VmKind::CryptblkUblk,
        encrypted: true,
    });
    v
}

/// Whether this cryptblk has `open --ublk`.
pub fn has_ublk(cryptblk: &Path) -> bool {
    Command::new(cryptblk)
        .args(["open", "--help"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--ublk"))
}

/// Why the VM will run under TCG (emulation) here, if it will (the test tests/vm/vm.sh makes).
pub fn tcg_reason() -> Option<String> {
    match std::env::var("CRYPTBLK_VM_ACCEL").as_deref() {
        Ok("tcg") => return Some("CRYPTBLK_VM_ACCEL=tcg".into()),
        Ok("kvm") => return None,
        _ => {}
    }
    let kvm_writable = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    let pvm = Path::new("/sys/module/kvm_pvm").exists();
    let hw = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("flags"))
            .is_some_and(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"))
    });
    if !kvm_writable {
        Some("/dev/kvm is absent or not writable".into())
    } else if pvm {
        Some("/dev/kvm is PVM (kvm_pvm), which cannot run the stock guest kernel".into())
    } else if !hw {
        Some("the CPU has no vmx/svm".into())
    } else {
        None
    }
}

/// The guest script's fixed parts: shell text in files of their own, filled in here.
const GUEST_PRELUDE: &str = include_str!("guest/prelude.sh");
const GUEST_TARGET: &str = include_str!("guest/target.sh");

/// The guest script (`guest/prelude.sh`, then `guest/target.sh` once per target). Each
/// target prints `STATUS id ok|skipped|failed reason`, each fio run `PROGRESS id workload
/// rep` before it starts.
pub fn guest_script(
    cfg: &Config,
    targets: &[VmTarget],
    workloads: &[Workload],
    ublk: bool,
) -> String {
    let p = cfg.params();
    let mut s = GUEST_PRELUDE
        .replace("@RESULTS@", GUEST_RESULTS)
        .replace("@SIZE@", &p.size.to_string());
    let cryptblk = shell_quote(&format!("{GUEST_RESULTS}/cryptblk-guest"));
    for t in targets {
        if matches!(t.kind, VmKind::CryptblkUblk) && !ublk {
            let _ = writeln!(
                s,
                "\n# ---- {}\necho \"STATUS {} skipped {SKIP_UBLK}\"",
                t.id, t.id
            );
            continue;
        }
        let dev = match &t.kind {
            VmKind::Brd => "/dev/ram0".to_string(),
            VmKind::CryptblkUblk => "$UBLKDEV".to_string(),
            _ => "/dev/mapper/bench".to_string(),
        };
        let mut runs = String::new();
        for w in workloads {
            for rep in 1..=cfg.repeats() {
                let out = format!("{GUEST_RESULTS}/raw/{}/{}.r{rep}.json", t.id, w.id);
                let args = fio_args(w, &IoPath::Block { path: dev.clone() }, &p, Path::new(&out));
                let quoted: Vec<String> = args
                    .iter()
                    .map(|a| {
                        if a.contains("$UBLKDEV") {
                            format!("\"{a}\"")
                        } else {
                            shell_quote(a)
                        }
                    })
                    .collect();
                let _ = writeln!(
                    runs,
                    "  fio_run {} {} {rep} {}",
                    t.id,
                    w.id,
                    quoted.join(" ")
                );
            }
        }
        s += &GUEST_TARGET
            .replace("@SETUP@", &setup_command(t, &cryptblk))
            .replace("@TEARDOWN@", &teardown_command(t, &cryptblk))
            .replace("@FIO_RUNS@\n", &runs)
            .replace("@ID@", &t.id);
    }
    s + "echo DONE\n"
}

/// The guest command that sets `t` up (its status is the test of `if`).
fn setup_command(t: &VmTarget, cryptblk: &str) -> String {
    match &t.kind {
        VmKind::Brd => "true".to_string(),
        VmKind::DmCrypt { cipher, flags } => {
            let mut opts = flags.clone();
            if cipher.sector != 512 {
                opts.push(format!("sector_size:{}", cipher.sector));
            }
            let tail = if opts.is_empty() {
                String::new()
            } else {
                format!(" {} {}", opts.len(), opts.join(" "))
            };
            format!(
                "dmsetup create bench --table \"0 $SECTORS crypt {} $(key {}) 0 /dev/ram0 0{tail}\" 2>/tmp/setup.err",
                cipher.spec,
                cipher.key_bits / 8
            )
        }
        VmKind::DmNull => {
            "dmsetup create bench --table \"0 $SECTORS crypt capi:ecb(cipher_null) - 0 /dev/ram0 0\" 2>/tmp/setup.err".to_string()
        }
        VmKind::CryptblkUblk => format!(
            "head -c 64 /dev/urandom > /tmp/ublk.key && {cryptblk} open /dev/ram0 bench-ublk --type plain --cipher aes-xts-plain64 --key-size 512 --sector-size 4096 --key-file /tmp/ublk.key --ublk --run-dir /tmp/cb-run --daemon >/dev/null 2>/tmp/setup.err && sleep 1 && UBLKDEV=$(ls -t /dev/ublkb* 2>/dev/null | head -n1) && [ -b \"$UBLKDEV\" ]"
        ),
    }
}

/// The guest command that takes `t` down again.
fn teardown_command(t: &VmTarget, cryptblk: &str) -> String {
    match &t.kind {
        VmKind::Brd => "true".to_string(),
        VmKind::CryptblkUblk => format!("{cryptblk} close bench-ublk --run-dir /tmp/cb-run"),
        _ => "dmsetup remove bench".to_string(),
    }
}

fn setup_description(t: &VmTarget) -> Vec<String> {
    match &t.kind {
        VmKind::Brd => vec!["modprobe brd rd_nr=1 rd_size=SIZE_KiB; fio on /dev/ram0".into()],
        VmKind::DmCrypt { cipher, flags } => {
            let mut opts = flags.clone();
            if cipher.sector != 512 {
                opts.push(format!("sector_size:{}", cipher.sector));
            }
            vec![format!(
                "dmsetup create bench --table '0 SECTORS crypt {} <{}-bit random key> 0 /dev/ram0 0{}'",
                cipher.spec,
                cipher.key_bits,
                if opts.is_empty() {
                    String::new()
                } else {
                    format!(" {} {}", opts.len(), opts.join(" "))
                }
            )]
        }
        VmKind::DmNull => vec![
            "dmsetup create bench --table '0 SECTORS crypt capi:ecb(cipher_null) - 0 /dev/ram0 0'"
                .into(),
        ],
        VmKind::CryptblkUblk => vec![
            "cryptblk open /dev/ram0 bench-ublk --type plain --cipher aes-xts-plain64 --key-size 512 --sector-size 4096 --ublk"
                .into(),
        ],
    }
}

/// Generates guest.sh, boots the VM, and folds the guest's results into `index`.
pub fn run(
    cfg: &Config,
    targets: &[VmTarget],
    workloads: &[Workload],
    index: &mut Index,
    progress: &mut Progress,
) -> Result<(), String> {
    let ublk = has_ublk(&cfg.cryptblk);
    if let Some(why) = tcg_reason() {
        index.meta.notes.push(format!(
            "the VM runs under TCG emulation here ({why}): the VM timings are \
             meaningless (functional check only). Use a host with hardware KVM for VM figures."
        ));
    }
    let per_target = workloads.len() * cfg.repeats() as usize;
    let mut records: Vec<TargetRecord> = targets
        .iter()
        .map(|t| TargetRecord {
            id: t.id.clone(),
            label: t.label.clone(),
            env: "vm".into(),
            encrypted: t.encrypted,
            baseline: (t.kind != VmKind::Brd).then(|| "vm-brd".to_string()),
            status: Status::Failed,
            reason: Some("the guest did not report this target".into()),
            setup: setup_description(t),
        })
        .collect();
    let fail_all = |records: &mut Vec<TargetRecord>, why: String, progress: &mut Progress| {
        for r in records.iter_mut() {
            r.status = Status::Skipped;
            r.reason = Some(why.clone());
        }
        progress.drop_steps(per_target * targets.len());
    };
    let harness = &cfg.vm_harness;
    if !harness.exists() {
        fail_all(
            &mut records,
            format!(
                "the VM harness is not at {} (set CRYPTBLK_VM to tests/vm/vm.sh)",
                harness.display()
            ),
            progress,
        );
        index.targets.extend(records);
        return Ok(());
    }
    // Idempotent: installs QEMU and fetches the kernel the first time only.
    progress.note("preparing the VM (tests/vm/vm.sh setup)");
    match Command::new(harness).arg("setup").output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            let why = format!(
                "VM setup failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            fail_all(&mut records, why, progress);
            index.targets.extend(records);
            return Ok(());
        }
        Err(e) => {
            fail_all(
                &mut records,
                format!("cannot run {}: {e}", harness.display()),
                progress,
            );
            index.targets.extend(records);
            return Ok(());
        }
    }
    let script = guest_script(cfg, targets, workloads, ublk);
    let gpath = cfg.out.join("guest.sh");
    std::fs::write(&gpath, &script).map_err(|e| format!("{}: {e}", gpath.display()))?;
    if ublk {
        let dst = cfg.out.join("cryptblk-guest");
        std::fs::copy(&cfg.cryptblk, &dst).map_err(|e| format!("{}: {e}", dst.display()))?;
    }
    let out_abs = std::fs::canonicalize(&cfg.out).map_err(|e| e.to_string())?;
    let logp = cfg.out.join("logs").join("vm.log");
    let mut log = std::fs::File::create(&logp).map_err(|e| format!("{}: {e}", logp.display()))?;
    progress.note("booting the VM (guest script: guest.sh)");
    let mut child = Command::new(harness)
        .arg("run")
        .arg("-r")
        .arg(&out_abs)
        .arg(format!("bash {GUEST_RESULTS}/guest.sh"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", harness.display()))?;
    let stderr = child.stderr.take().expect("piped");
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            s.push_str(&l);
            s.push('\n');
        }
        s
    });
    let mut statuses: Vec<(String, String, String)> = Vec::new();
    let mut last: Option<String> = None;
    let mut done = false;
    for line in BufReader::new(child.stdout.take().expect("piped"))
        .lines()
        .map_while(Result::ok)
    {
        let _ = writeln!(log, "{line}");
        let line = line.trim_end_matches('\r').to_string();
        if let Some(rest) = line.strip_prefix("PROGRESS ") {
            if let Some(l) = last.take() {
                progress.step(&l);
            }
            last = Some(format!("vm {rest}"));
            progress.show(&format!("vm {rest}"));
        } else if let Some(rest) = line.strip_prefix("STATUS ") {
            if let Some(l) = last.take() {
                progress.step(&l);
            }
            let mut it = rest.splitn(3, ' ');
            let id = it.next().unwrap_or_default().to_string();
            let st = it.next().unwrap_or_default().to_string();
            let why = it.next().unwrap_or_default().to_string();
            if st != "ok" {
                progress.drop_steps(per_target);
            }
            statuses.push((id, st, why));
        } else if line == "DONE" {
            done = true;
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    let errs = err_thread.join().unwrap_or_default();
    let _ = writeln!(log, "--- VM harness stderr ---\n{errs}");
    if !done {
        let why = format!(
            "the VM run failed ({status}): {}",
            errs.lines().rev().take(3).collect::<Vec<_>>().join(" / ")
        );
        for r in records.iter_mut() {
            if !statuses.iter().any(|s| s.0 == r.id) {
                r.reason = Some(why.clone());
            }
        }
    }
    if let Ok(genv) = std::fs::read_to_string(cfg.out.join("guest-env.txt")) {
        for l in genv.lines() {
            if let Some((k, v)) = l.split_once(": ") {
                index.meta.env.push((k.to_string(), v.to_string()));
            }
        }
    }
    index.meta.env.push((
        "VM accel".into(),
        if tcg_reason().is_some() {
            "tcg (emulation)"
        } else {
            "kvm"
        }
        .into(),
    ));
    for r in records.iter_mut() {
        let Some((_, st, why)) = statuses.iter().find(|s| s.0 == r.id) else {
            continue;
        };
        match st.as_str() {
            "ok" => {
                r.status = Status::Ok;
                r.reason = None;
                let table = cfg.out.join("raw").join(format!("{}.table", r.id));
                if let Ok(t) = std::fs::read_to_string(&table)
                    && !t.trim().is_empty()
                {
                    r.setup.push(format!("dmsetup table: {}", t.trim()));
                }
                for w in workloads {
                    for rep in 1..=cfg.repeats() {
                        let file = format!("raw/{}/{}.r{rep}.json", r.id, w.id);
                        let dev = match r.id.as_str() {
                            "vm-brd" => "/dev/ram0",
                            "vm-cryptblk-ublk" => "/dev/ublkbN",
                            _ => "/dev/mapper/bench",
                        };
                        let args = fio_args(
                            w,
                            &IoPath::Block { path: dev.into() },
                            &cfg.params(),
                            &Path::new(GUEST_RESULTS).join(&file),
                        );
                        let error = if cfg.out.join(&file).exists() {
                            None
                        } else {
                            let e =
                                std::fs::read_to_string(cfg.out.join(&file).with_extension("err"))
                                    .unwrap_or_default();
                            Some(format!("no fio output: {}", e.trim()))
                        };
                        index.runs.push(RunRecord {
                            target: r.id.clone(),
                            workload: w.id.clone(),
                            rep,
                            file,
                            command: command_line("fio", &args),
                            error,
                        });
                    }
                }
            }
            "skipped" => {
                r.status = Status::Skipped;
                r.reason = Some(why.clone());
            }
            _ => {
                r.status = Status::Failed;
                r.reason = Some(why.clone());
            }
        }
    }
    let _ = std::fs::remove_file(cfg.out.join("cryptblk-guest"));
    index.targets.extend(records);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset::Preset;

    fn cfg() -> Config {
        Config {
            preset: Preset::Quick,
            runtime: Some(1),
            size: Some(64 << 20),
            repeats: Some(1),
            ciphers: vec![],
            out: "/tmp/x".into(),
            work: "/tmp/w".into(),
            cryptblk: "/bin/false".into(),
            cryptblk_version: "t".into(),
            targets: vec![],
            workloads: vec![],
            host: false,
            vm: true,
            vm_harness: "/nonexistent".into(),
        }
    }

    #[test]
    fn guest_script_covers_every_flag_and_skips_ublk() {
        let ts = vm_targets(&["aes-xts-plain64:512:4096".parse().unwrap()]);
        let w = Preset::Quick.workloads();
        let s = guest_script(&cfg(), &ts, &w, false);
        for f in [
            "same_cpu_crypt",
            "submit_from_crypt_cpus",
            "3 no_read_workqueue no_write_workqueue sector_size:4096",
            "high_priority",
            "capi:ecb(cipher_null)",
        ] {
            assert!(s.contains(f), "missing {f}");
        }
        assert!(s.contains(&format!("STATUS vm-cryptblk-ublk skipped {SKIP_UBLK}")));
        assert!(s.contains("--fdatasync=1"));
        assert_eq!(
            s.matches("fio_run vm-brd ").count(),
            w.len(),
            "one fio run per workload"
        );
        let with = guest_script(&cfg(), &ts, &w, true);
        assert!(with.contains("--ublk"));
        for placeholder in [
            "@RESULTS@",
            "@SIZE@",
            "@ID@",
            "@SETUP@",
            "@TEARDOWN@",
            "@FIO_RUNS@",
        ] {
            assert!(!with.contains(placeholder), "{placeholder} left unfilled");
        }
        // Both scripts are valid bash.
        for script in [&s, &with] {
            let f = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(f.path(), script).unwrap();
            let o = Command::new("bash")
                .arg("-n")
                .arg(f.path())
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
    }
}
