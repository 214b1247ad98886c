//! Runs the benchmark: checks, targets × workloads × repetitions through fio, the index,
//! then the report.

use crate::config::Config;
use crate::fio::{IoPath, Workload, command_line, fio_args, parse_fio_json};
use crate::model::{Index, Meta, RunRecord, Status, TargetRecord};
use crate::progress::Progress;
use crate::target::{HostEnv, HostTarget, host_targets, which};
use crate::vm::VmTarget;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The first line `cmd arg` prints (its version), if it runs.
fn tool_version(cmd: &str, arg: &str) -> Option<String> {
    let out = Command::new(cmd).arg(arg).output().ok()?;
    let s =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    s.lines()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
}

/// The CPU's model name from /proc/cpuinfo.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The CPU flags that matter for crypto speed (AES-NI, AVX, VAES, ...).
fn cpu_flags() -> String {
    let want = [
        "aes",
        "avx2",
        "avx512f",
        "vaes",
        "vpclmulqdq",
        "pclmulqdq",
        "sha_ni",
    ];
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("flags")).map(|l| {
                l.split_whitespace()
                    .filter(|f| want.contains(f))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
        })
        .unwrap_or_default()
}

/// This machine's facts for the report: CPU, cores, kernel, tool versions, work directory.
pub(crate) fn host_env(cfg: &Config) -> Vec<(String, String)> {
    let mut v = vec![
        ("CPU".to_string(), cpu_model()),
        (
            "cores".to_string(),
            std::thread::available_parallelism()
                .map(|n| n.get().to_string())
                .unwrap_or_default(),
        ),
        ("crypto CPU flags".to_string(), cpu_flags()),
        (
            "kernel".to_string(),
            std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
        ),
        ("cryptblk".to_string(), cfg.cryptblk_version.clone()),
    ];
    for (name, cmd, arg) in [
        ("fio", "fio", "--version"),
        ("nbdkit", "nbdkit", "--version"),
        ("qemu-nbd", "qemu-nbd", "--version"),
    ] {
        v.push((
            name.to_string(),
            tool_version(cmd, arg).unwrap_or_else(|| "not installed".into()),
        ));
    }
    v.push(("work directory".to_string(), cfg.work.display().to_string()));
    v
}

/// Free bytes for unprivileged users on the file system holding `dir`.
pub(crate) fn free_space(dir: &Path) -> Result<u64, String> {
    let st = rustix::fs::statvfs(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Bytes the host targets need in the work directory (one image at a time).
pub(crate) fn space_needed(size: u64) -> u64 {
    size + (16 << 20) + (8 << 20)
}

/// Runs fio, killing it if it outlives its runtime by far (a hung server).
fn run_fio(args: &[String], runtime: u32, err_path: &Path) -> Result<(), String> {
    let errf =
        std::fs::File::create(err_path).map_err(|e| format!("{}: {e}", err_path.display()))?;
    let mut child = Command::new("fio")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(errf)
        .spawn()
        .map_err(|e| format!("cannot run fio: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(runtime as u64 * 3 + 60);
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err("fio did not finish in time (killed)".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if !status.success() {
        let err = std::fs::read_to_string(err_path).unwrap_or_default();
        let tail: Vec<&str> = err.lines().rev().take(3).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!("fio exited with {status}: {}", tail.join(" / ")));
    }
    Ok(())
}

/// Runs every (workload, repetition) of one started target; `io` is where fio goes.
pub(crate) fn run_workloads(
    cfg: &Config,
    target: &str,
    io: &IoPath,
    workloads: &[Workload],
    index: &mut Index,
    progress: &mut Progress,
) -> Result<(), String> {
    let p = cfg.params();
    let raw = cfg.out.join("raw").join(target);
    std::fs::create_dir_all(&raw).map_err(|e| format!("{}: {e}", raw.display()))?;
    for w in workloads {
        for rep in 1..=cfg.repeats() {
            progress.show(&format!("{target} {} r{rep}", w.id));
            let file = format!("raw/{target}/{}.r{rep}.json", w.id);
            let out = cfg.out.join(&file);
            let args = fio_args(w, io, &p, &out);
            let err_path = out.with_extension("err");
            let mut error = run_fio(&args, p.runtime, &err_path).err();
            if error.is_none()
                && let Err(e) = std::fs::read_to_string(&out)
                    .map_err(|e| e.to_string())
                    .and_then(|t| parse_fio_json(&t))
            {
                error = Some(e);
            }
            if std::fs::metadata(&err_path).is_ok_and(|m| m.len() == 0) {
                let _ = std::fs::remove_file(&err_path);
            }
            index.runs.push(RunRecord {
                target: target.to_string(),
                workload: w.id.clone(),
                rep,
                file,
                command: command_line("fio", &args),
                error,
            });
            progress.step(&format!("{target} {} r{rep}", w.id));
        }
    }
    Ok(())
}

/// Runs the benchmark and writes the report; returns the path of report.md.
pub fn run(cfg: &Config) -> Result<PathBuf, String> {
    if which("fio").is_none() {
        return Err(
            "fio not found in PATH: cryptblk bench drives fio; install it with \
                    `apt-get install fio` (Debian/Ubuntu; fio >= 3.27 has the nbd engine)"
                .into(),
        );
    }
    let workloads = cfg.selected_workloads();
    if workloads.is_empty() {
        return Err("no workload matches --workloads".into());
    }
    let p = cfg.params();
    prepare_work_dir(cfg, p.size)?;
    std::fs::create_dir_all(cfg.out.join("logs"))
        .map_err(|e| format!("{}: {e}", cfg.out.display()))?;
    let mut index = new_index(cfg, &workloads);
    let (hosts, vm_targets) = selected_targets(cfg)?;
    let mut progress = Progress::new(
        (hosts.len() + vm_targets.len()) * cfg.runs_per_target(&workloads),
        Duration::from_millis(p.runtime as u64 * 1000 + 400),
    );
    run_host_targets(cfg, &hosts, &workloads, &mut index, &mut progress)?;
    if !vm_targets.is_empty() {
        crate::vm::run(cfg, &vm_targets, &workloads, &mut index, &mut progress)?;
    }
    progress.finish();
    let _ = std::fs::remove_dir(&cfg.work);
    index.save(&cfg.out)?;
    crate::report::generate(&cfg.out)?;
    Ok(cfg.out.join("report.md"))
}

/// Creates the work directory and, for the host targets, checks that an image fits.
fn prepare_work_dir(cfg: &Config, size: u64) -> Result<(), String> {
    std::fs::create_dir_all(&cfg.work).map_err(|e| format!("{}: {e}", cfg.work.display()))?;
    if !cfg.host {
        return Ok(());
    }
    let free = free_space(&cfg.work)?;
    let need = space_needed(size);
    if free < need {
        let _ = std::fs::remove_dir(&cfg.work);
        return Err(format!(
            "not enough space in the work directory {}: {} MiB free, {} MiB needed \
             for --size {} MiB (image plus LUKS header); use a smaller --size or another --dir",
            cfg.work.display(),
            free >> 20,
            need.div_ceil(1 << 20),
            size >> 20
        ));
    }
    Ok(())
}

/// The index before anything ran: the run's parameters and environment, the workloads.
fn new_index(cfg: &Config, workloads: &[Workload]) -> Index {
    let p = cfg.params();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Index {
        meta: Meta {
            preset: cfg.preset.name().into(),
            runtime: p.runtime,
            size: p.size,
            repeats: cfg.repeats(),
            started,
            env: host_env(cfg),
            notes: Vec::new(),
        },
        workloads: workloads.to_vec(),
        targets: Vec::new(),
        runs: Vec::new(),
    }
}

/// The host and VM targets asked for, for the `--cipher`s (default
/// aes-xts-plain64:512:4096).
fn selected_targets(cfg: &Config) -> Result<(Vec<HostTarget>, Vec<VmTarget>), String> {
    let ciphers = if cfg.ciphers.is_empty() {
        vec!["aes-xts-plain64:512:4096".parse()?]
    } else {
        cfg.ciphers.clone()
    };
    let hosts: Vec<_> = if cfg.host {
        host_targets(&ciphers)
            .into_iter()
            .filter(|t| cfg.wants_target(&t.id))
            .collect()
    } else {
        Vec::new()
    };
    let vm_targets: Vec<_> = if cfg.vm {
        crate::vm::vm_targets(&ciphers)
            .into_iter()
            .filter(|t| cfg.wants_target(&t.id))
            .collect()
    } else {
        Vec::new()
    };
    Ok((hosts, vm_targets))
}

/// Whether this fio has the nbd engine (the host targets need it).
fn fio_has_nbd_engine() -> bool {
    Command::new("fio")
        .arg("--enghelp=nbd")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs every host target in turn, recording each in `index` (saved after each target
/// that was started).
fn run_host_targets(
    cfg: &Config,
    hosts: &[HostTarget],
    workloads: &[Workload],
    index: &mut Index,
    progress: &mut Progress,
) -> Result<(), String> {
    let nbd_engine = fio_has_nbd_engine();
    let env = HostEnv {
        cryptblk: cfg.cryptblk.clone(),
        work: cfg.work.clone(),
        logs: cfg.out.join("logs"),
        size: cfg.params().size,
    };
    for t in hosts {
        let skip = if nbd_engine {
            t.missing_tool()
        } else {
            Some("this fio has no nbd engine (Debian's fio package has it)".into())
        };
        if let Some(reason) = skip {
            let mut rec = host_record(t);
            rec.status = Status::Skipped;
            rec.reason = Some(reason);
            progress.drop_steps(cfg.runs_per_target(workloads));
            index.targets.push(rec);
            continue;
        }
        let rec = measure_host_target(cfg, t, &env, workloads, index, progress)?;
        index.targets.push(rec);
        index.save(&cfg.out)?;
    }
    Ok(())
}

/// The record of a host target that ran (so far).
fn host_record(t: &HostTarget) -> TargetRecord {
    TargetRecord {
        id: t.id.clone(),
        label: t.label.clone(),
        env: "host".into(),
        encrypted: t.encrypted,
        baseline: t.baseline.clone(),
        status: Status::Ok,
        reason: None,
        setup: Vec::new(),
    }
}

/// Starts `t`, runs the workloads on it and stops it again; returns its record, failed
/// if it did not start.
fn measure_host_target(
    cfg: &Config,
    t: &HostTarget,
    env: &HostEnv,
    workloads: &[Workload],
    index: &mut Index,
    progress: &mut Progress,
) -> Result<TargetRecord, String> {
    let mut rec = host_record(t);
    progress.note(&format!("starting {}", t.id));
    match t.start(env, &mut rec.setup) {
        Ok(running) => {
            let io = IoPath::Nbd {
                uri: running.uri.clone(),
            };
            let r = run_workloads(cfg, &t.id, &io, workloads, index, progress);
            running.stop();
            r?;
        }
        Err(e) => {
            rec.status = Status::Failed;
            rec.reason = Some(e);
            progress.drop_steps(cfg.runs_per_target(workloads));
        }
    }
    Ok(rec)
}
