//! VM targets: brd, dm-crypt (default and each performance flag, cipher_null) and
//! cryptblk over ublk, measured by fio on block devices inside a throwaway VM. The guest
//! runs a generated script (`guest.sh` in the report directory, mounted at /results).

use crate::config::Config;
use crate::fio::{IoPath, Workload, command_line, fio_args, shell_quote};
use crate::model::{Index, RunRecord, Status, TargetRecord};
use crate::progress::Progress;
use crate::target::CipherChoice;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

/// What a VM target measures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum VmKind {
    /// The RAM disk itself (brd, /dev/ram0): the baseline of every other VM target.
    Brd,
    /// dm-crypt with this cipher and these optional table parameters.
    DmCrypt {
        /// The cipher, key size and sector size of the table.
        cipher: CipherChoice,
        /// dm-crypt's optional parameters, e.g. `same_cpu_crypt`.
        flags: Vec<String>,
    },
    /// dm-crypt with `cipher_null`: dm-crypt's own cost without any crypto.
    DmNull,
    /// `cryptblk open --ublk` on the RAM disk.
    CryptblkUblk,
}

/// One target measured inside the VM.
#[derive(Clone, Debug)]
pub(crate) struct VmTarget {
    /// Unique and file-name safe, e.g. `vm-dmcrypt-aes-xts-plain64-512-4096-default`.
    pub id: String,
    /// Its name in tables and charts.
    pub label: String,
    /// What it measures.
    pub kind: VmKind,
    /// Whether data is encrypted (cipher_null counts as not).
    pub encrypted: bool,
}

const GUEST_RESULTS: &str = "/results";
const SKIP_UBLK: &str = "cryptblk has no ublk frontend in this build";

/// Every VM target, in report order: the performance flags are tried with the first
/// cipher only.
pub(crate) fn vm_targets(ciphers: &[CipherChoice]) -> Vec<VmTarget> {
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
pub(crate) fn has_ublk(cryptblk: &Path) -> bool {
    Command::new(cryptblk)
        .args(["open", "--help"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--ublk"))
}

/// Why the VM will run under TCG (emulation) here, if it will (the test tests/vm/vm.sh makes).
pub(crate) fn tcg_reason() -> Option<String> {
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
pub(crate) fn guest_script(
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
        VmKind::DmCrypt { cipher, flags } => format!(
            "dmsetup create bench --table \"0 $SECTORS crypt {} $(key {}) 0 /dev/ram0 0{}\" 2>/tmp/setup.err",
            cipher.spec,
            cipher.key_bits / 8,
            optional_params(cipher, flags)
        ),
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

/// The end of a dm-crypt table line: ` COUNT PARAM...` (the flags, and the sector size
/// unless it is dm-crypt's default 512), or nothing.
fn optional_params(cipher: &CipherChoice, flags: &[String]) -> String {
    let mut opts = flags.to_vec();
    if cipher.sector != 512 {
        opts.push(format!("sector_size:{}", cipher.sector));
    }
    if opts.is_empty() {
        String::new()
    } else {
        format!(" {} {}", opts.len(), opts.join(" "))
    }
}

/// How `t` is set up, for the report (the key is not shown).
fn setup_description(t: &VmTarget) -> Vec<String> {
    match &t.kind {
        VmKind::Brd => vec!["modprobe brd rd_nr=1 rd_size=SIZE_KiB; fio on /dev/ram0".into()],
        VmKind::DmCrypt { cipher, flags } => vec![format!(
            "dmsetup create bench --table '0 SECTORS crypt {} <{}-bit random key> 0 /dev/ram0 0{}'",
            cipher.spec,
            cipher.key_bits,
            optional_params(cipher, flags)
        )],
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
pub(crate) fn run(
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
    let per_target = cfg.runs_per_target(workloads);
    let mut records: Vec<TargetRecord> = targets.iter().map(unreported_record).collect();
    if let Err(why) = prepare_harness(&cfg.vm_harness, progress) {
        for r in records.iter_mut() {
            r.status = Status::Skipped;
            r.reason = Some(why.clone());
        }
        progress.drop_steps(per_target * targets.len());
        index.targets.extend(records);
        return Ok(());
    }
    stage_guest_files(cfg, targets, workloads, ublk)?;
    let guest = run_guest(cfg, progress, per_target)?;
    record_guest_env(cfg, index);
    for r in records.iter_mut() {
        match guest.statuses.iter().find(|s| s.id == r.id) {
            Some(st) => apply_status(cfg, workloads, r, st, index),
            None => {
                if let Some(why) = &guest.failure {
                    r.reason = Some(why.clone());
                }
            }
        }
    }
    let _ = std::fs::remove_file(cfg.out.join("cryptblk-guest"));
    index.targets.extend(records);
    Ok(())
}

/// The record of `t` before the guest says anything about it: failed, unless the guest
/// reports it.
fn unreported_record(t: &VmTarget) -> TargetRecord {
    TargetRecord {
        id: t.id.clone(),
        label: t.label.clone(),
        env: "vm".into(),
        encrypted: t.encrypted,
        baseline: (t.kind != VmKind::Brd).then(|| "vm-brd".to_string()),
        status: Status::Failed,
        reason: Some("the guest did not report this target".into()),
        setup: setup_description(t),
    }
}

/// Checks that the VM harness is there and runs its `setup`; `Err` says why no VM target
/// can run.
fn prepare_harness(harness: &Path, progress: &mut Progress) -> Result<(), String> {
    if !harness.exists() {
        return Err(format!(
            "the VM harness is not at {} (set CRYPTBLK_VM to tests/vm/vm.sh)",
            harness.display()
        ));
    }
    // Idempotent: installs QEMU and fetches the kernel the first time only.
    progress.note("preparing the VM (tests/vm/vm.sh setup)");
    match Command::new(harness).arg("setup").output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "VM setup failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("cannot run {}: {e}", harness.display())),
    }
}

/// Puts what the guest needs into the report directory (its /results): guest.sh, and
/// the cryptblk binary when the ublk target can run.
fn stage_guest_files(
    cfg: &Config,
    targets: &[VmTarget],
    workloads: &[Workload],
    ublk: bool,
) -> Result<(), String> {
    let script = guest_script(cfg, targets, workloads, ublk);
    let gpath = cfg.out.join("guest.sh");
    std::fs::write(&gpath, &script).map_err(|e| format!("{}: {e}", gpath.display()))?;
    if ublk {
        let dst = cfg.out.join("cryptblk-guest");
        std::fs::copy(&cfg.cryptblk, &dst).map_err(|e| format!("{}: {e}", dst.display()))?;
    }
    Ok(())
}

/// A guest's `STATUS id ok|skipped|failed reason` line.
struct GuestStatus {
    /// The [`VmTarget::id`].
    id: String,
    /// `ok`, `skipped` or `failed`.
    status: String,
    /// Why it was skipped or failed (empty for `ok`).
    reason: String,
}

impl GuestStatus {
    /// Parses what follows `STATUS `.
    fn parse(rest: &str) -> Self {
        let mut it = rest.splitn(3, ' ');
        let mut next = || it.next().unwrap_or_default().to_string();
        GuestStatus {
            id: next(),
            status: next(),
            reason: next(),
        }
    }
}

/// What came back from the VM run.
struct GuestOutput {
    /// One per target the guest got to, in order.
    statuses: Vec<GuestStatus>,
    /// Why the run ended before the guest's `DONE`, if it did: the harness's exit status
    /// and the last lines of its stderr.
    failure: Option<String>,
}

/// Boots the VM on guest.sh and follows it to the end; the guest's output and the
/// harness's stderr go to logs/vm.log.
fn run_guest(
    cfg: &Config,
    progress: &mut Progress,
    per_target: usize,
) -> Result<GuestOutput, String> {
    let harness = &cfg.vm_harness;
    let out_abs = std::fs::canonicalize(&cfg.out).map_err(|e| e.to_string())?;
    let logp = cfg.out.join("logs").join("vm.log");
    let mut log = File::create(&logp).map_err(|e| format!("{}: {e}", logp.display()))?;
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
    // Drained on a thread of its own so that neither pipe can fill up and stall the VM.
    let err_thread = std::thread::spawn(move || read_all_lines(stderr));
    let stdout = child.stdout.take().expect("piped");
    let (statuses, done) = follow_guest(stdout, &mut log, progress, per_target);
    let status = child.wait().map_err(|e| e.to_string())?;
    let errs = err_thread.join().unwrap_or_default();
    let _ = writeln!(log, "--- VM harness stderr ---\n{errs}");
    let failure = (!done).then(|| {
        format!(
            "the VM run failed ({status}): {}",
            errs.lines().rev().take(3).collect::<Vec<_>>().join(" / ")
        )
    });
    Ok(GuestOutput { statuses, failure })
}

/// Every line of `r`, each ended by `\n`.
fn read_all_lines(r: impl Read) -> String {
    let mut s = String::new();
    for l in BufReader::new(r).lines().map_while(Result::ok) {
        s.push_str(&l);
        s.push('\n');
    }
    s
}

/// Follows the guest's output: logs every line, moves the progress bar on `PROGRESS`,
/// collects the `STATUS` lines; also returns whether the guest got to `DONE`.
fn follow_guest(
    stdout: impl Read,
    log: &mut File,
    progress: &mut Progress,
    per_target: usize,
) -> (Vec<GuestStatus>, bool) {
    let mut statuses = Vec::new();
    // The fio run in progress: it counts as a step once the next line shows it ended.
    let mut last: Option<String> = None;
    let mut done = false;
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        let _ = writeln!(log, "{line}");
        let line = line.trim_end_matches('\r');
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
            let st = GuestStatus::parse(rest);
            if st.status != "ok" {
                progress.drop_steps(per_target);
            }
            statuses.push(st);
        } else if line == "DONE" {
            done = true;
        }
    }
    (statuses, done)
}

/// Adds the guest's environment (guest-env.txt, written by the guest) and the VM's
/// accelerator to the report's environment.
fn record_guest_env(cfg: &Config, index: &mut Index) {
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
}

/// Records what the guest reported of `r`: its status and, if it ran, its fio runs.
fn apply_status(
    cfg: &Config,
    workloads: &[Workload],
    r: &mut TargetRecord,
    st: &GuestStatus,
    index: &mut Index,
) {
    match st.status.as_str() {
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
                    index.runs.push(guest_run_record(cfg, &r.id, w, rep));
                }
            }
        }
        "skipped" => {
            r.status = Status::Skipped;
            r.reason = Some(st.reason.clone());
        }
        _ => {
            r.status = Status::Failed;
            r.reason = Some(st.reason.clone());
        }
    }
}

/// The record of one fio run the guest made: the command line as the guest ran it, and an
/// error if it left no JSON.
fn guest_run_record(cfg: &Config, target: &str, w: &Workload, rep: u32) -> RunRecord {
    let file = format!("raw/{target}/{}.r{rep}.json", w.id);
    // The ublk device's number is only known in the guest.
    let dev = match target {
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
            std::fs::read_to_string(cfg.out.join(&file).with_extension("err")).unwrap_or_default();
        Some(format!("no fio output: {}", e.trim()))
    };
    RunRecord {
        target: target.to_string(),
        workload: w.id.clone(),
        rep,
        file,
        command: command_line("fio", &args),
        error,
    }
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
