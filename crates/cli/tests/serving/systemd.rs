//! systemd: the `Type=notify` protocol, with a notify socket the test opens itself (a
//! path, then an abstract name): `STATUS=` while unlocking, `READY=1` only once the
//! frontend accepts clients, `STOPPING=1` when `close` is accepted; and the units:
//! `cryptblk-generator`'s links and drop-ins for a crypttab, checked with the template by
//! `systemd-analyze verify`.

use crate::common::nbd::NbdClient;
use crate::common::{bin, ok, run_in};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Datagrams until one holds `want` (that one last).
fn until(sock: &UnixDatagram, want: &str) -> Vec<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = sock
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("no {want} within 30 s (got {got:?}): {e}"));
        let m = String::from_utf8_lossy(&buf[..n]).to_string();
        let done = m.lines().any(|l| l == want);
        got.push(m);
        if done {
            return got;
        }
    }
}

#[test]
fn ready_once_the_frontend_accepts_and_stopping_on_close() {
    for abstract_name in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
        std::fs::write(p("key"), b"notify passphrase").unwrap();
        crate::common::quick_luks2(&p("v.img"), &p("key"), 32);
        let (sock, target) = if abstract_name {
            use std::os::linux::net::SocketAddrExt;
            let name = format!("cryptblk-notify-test-{}", std::process::id());
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
            (UnixDatagram::bind_addr(&addr).unwrap(), format!("@{name}"))
        } else {
            (UnixDatagram::bind(p("notify")).unwrap(), p("notify"))
        };
        sock.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let nbd = p("s.sock");
        let mut child = Command::new(bin())
            .args([
                "open",
                &p("v.img"),
                "vol",
                "--nbd",
                &format!("unix:{nbd}"),
                "--run-dir",
                &p("run"),
                "--key-file",
                &p("key"),
            ])
            .env("NOTIFY_SOCKET", &target)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let before = until(&sock, "READY=1");
        // At READY=1 a client is served at once.
        let mut c = NbdClient::connect(&nbd, "vol").expect("served once READY=1 is sent");
        assert_eq!(c.read(0, 4096).unwrap().unwrap().len(), 4096);
        c.disconnect();
        assert!(
            before[0].contains("STATUS=Unlocking vol ("),
            "the unlock is told first: {before:?}"
        );
        let ready = before.last().unwrap();
        assert!(ready.contains("STATUS=Serving vol at "), "{ready}");
        assert!(
            before[..before.len() - 1]
                .iter()
                .all(|m| !m.contains("READY")),
            "READY=1 once: {before:?}"
        );
        assert!(child.try_wait().unwrap().is_none(), "still serving");

        ok(&run_in(
            bin(),
            &["close", "vol", "--run-dir", &p("run")],
            b"",
        ));
        let after = until(&sock, "STOPPING=1");
        assert!(
            after[0].contains("STATUS=Closing vol"),
            "the close is told: {after:?}"
        );
        assert!(child.wait().unwrap().success());
    }
}

/// The repository's packaging/systemd.
fn units_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/systemd")
}

#[test]
fn the_generator_pulls_in_one_instance_per_entry_and_systemd_analyze_accepts_the_units() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = |f: &str| d.join(f).to_str().unwrap().to_string();
    let tab = p("cryptblktab");
    std::fs::write(
        &tab,
        "home UUID=0D5BD1C5-3BB4-4E6C-9E63-7BD6E64E9F5A /etc/keys/home luks,nbd=unix:/run/vols/home.nbd\n\
         vm1 \"/srv/vm images/vm1.img\" none luks,vhost-user-blk=/run/vm/vm1.sock,nofail\n\
         scratch /dev/sdb2 /etc/keys/s plain,cipher=aes-xts-plain64,size=512,ublk\n\
         remote nbd://storage.example/disk1 none luks,nbd=tcp:127.0.0.1:10809,noauto\n\
         media /srv/m.img none luks,fuse=/mnt/media,readonly\n",
    )
    .unwrap();
    let generator = p("cryptblk-generator");
    std::os::unix::fs::symlink(bin(), &generator).unwrap();
    let out = p("gen");
    std::fs::create_dir(&out).unwrap();
    let o = Command::new(&generator)
        .args([&out, &p("early"), &p("late")])
        .env("CRYPTBLK_CRYPTTAB", &tab)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let link = |l: &str| std::fs::read_link(Path::new(&out).join(l)).ok();
    let template = Some(std::path::PathBuf::from(
        "/usr/lib/systemd/system/cryptblk@.service",
    ));
    assert_eq!(
        link("cryptblk.target.requires/cryptblk@home.service"),
        template
    );
    assert_eq!(
        link("cryptblk.target.wants/cryptblk@vm1.service"),
        template,
        "nofail: a want"
    );
    assert_eq!(
        link("cryptblk.target.requires/cryptblk@scratch.service"),
        template
    );
    assert_eq!(
        link("cryptblk.target.requires/cryptblk@media.service"),
        template
    );
    assert!(
        link("cryptblk.target.requires/cryptblk@remote.service").is_none(),
        "noauto"
    );
    assert!(
        link("cryptblk.target.wants/cryptblk@remote.service").is_none(),
        "noauto"
    );
    assert_eq!(
        link("multi-user.target.wants/cryptblk.target"),
        Some("/usr/lib/systemd/system/cryptblk.target".into())
    );
    // A bad line is reported and skipped; the others are still pulled in.
    let bad_tab = p("badtab");
    std::fs::write(
        &bad_tab,
        "good /srv/g.img none luks\nbad /srv/b.img none luks,frobnicate\n",
    )
    .unwrap();
    let out2 = p("gen2");
    std::fs::create_dir(&out2).unwrap();
    let o = Command::new(&generator)
        .arg(&out2)
        .env("CRYPTBLK_CRYPTTAB", &bad_tab)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("badtab:2: unknown option"),
        "{o:?}"
    );
    assert!(
        std::fs::symlink_metadata(
            Path::new(&out2).join("cryptblk.target.requires/cryptblk@good.service")
        )
        .is_ok(),
        "the good line is pulled in"
    );
    assert!(!Path::new(&out2).join("cryptblk@bad.service.d").exists());
    let conf = |n: &str| {
        std::fs::read_to_string(
            Path::new(&out).join(format!("cryptblk@{n}.service.d/50-cryptblktab.conf")),
        )
        .unwrap()
    };
    let home = conf("home");
    assert!(
        home.contains(
            r"BindsTo=dev-disk-by\x2duuid-0d5bd1c5\x2d3bb4\x2d4e6c\x2d9e63\x2d7bd6e64e9f5a.device"
        ),
        "{home}"
    );
    assert!(home.contains("RequiresMountsFor=/etc/keys/home"), "{home}");
    assert!(home.contains("ReadWritePaths=-/run/vols\n"), "{home}");
    assert!(home.contains("Before=cryptblk.target\n"), "{home}");
    assert!(
        home.contains(&format!("Environment=CRYPTBLK_CRYPTTAB={tab}\n")),
        "{home}"
    );
    let vm1 = conf("vm1");
    assert!(
        vm1.contains("RequiresMountsFor=\"/srv/vm images/vm1.img\""),
        "{vm1}"
    );
    assert!(
        vm1.contains("ReadWritePaths=\"/srv/vm images/vm1.img\""),
        "{vm1}"
    );
    assert!(vm1.contains("ReadWritePaths=-/run/vm\n"), "{vm1}");
    assert!(
        !vm1.contains("Before=cryptblk.target"),
        "nofail holds no boot: {vm1}"
    );
    assert!(!vm1.contains("CAP_SYS_ADMIN"), "{vm1}");
    let scratch = conf("scratch");
    assert!(scratch.contains("BindsTo=dev-sdb2.device"), "{scratch}");
    assert!(
        scratch.contains("CapabilityBoundingSet=CAP_SYS_ADMIN"),
        "ublk: {scratch}"
    );
    let remote = conf("remote");
    assert!(remote.contains("After=network-online.target"), "{remote}");
    let media = conf("media");
    assert!(
        media.contains("ProtectSystem=no") && media.contains("CAP_SYS_ADMIN"),
        "{media}"
    );
    assert!(!media.contains("ReadWritePaths=/"), "{media}");

    // The template and target as installed (ExecStart's binary where it is here), with the
    // generated drop-ins, verified by systemd: no warning at all is accepted.
    let units = p("units");
    std::fs::create_dir(&units).unwrap();
    for f in ["cryptblk@.service", "cryptblk.target"] {
        let text = std::fs::read_to_string(units_dir().join(f)).unwrap();
        std::fs::write(
            Path::new(&units).join(f),
            text.replace("/usr/bin/cryptblk", bin()),
        )
        .unwrap();
    }
    for name in ["home", "vm1", "scratch", "remote", "media"] {
        let inst = Path::new(&units).join(format!("cryptblk@{name}.service"));
        std::os::unix::fs::symlink("cryptblk@.service", &inst).unwrap();
        let o = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&inst)
            .arg(Path::new(&units).join("cryptblk.target"))
            .env("SYSTEMD_UNIT_PATH", format!("{units}:{out}:"))
            .output()
            .expect("systemd-analyze (apt-get install systemd)");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success() && err.trim().is_empty(), "{name}: {err}");
    }
}

/// Plays systemd's password agent once: waits for an ask file of /run/systemd/ask-password
/// whose message holds `marker` and that is not in `seen`, answers it with `answer`.
fn answer_agent(marker: &str, seen: &mut Vec<std::path::PathBuf>, answer: &str) {
    let dir = Path::new("/run/systemd/ask-password");
    let end = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            std::time::Instant::now() < end,
            "no question for {marker} within 30 s"
        );
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = e.path();
            let is_ask = e.file_name().to_string_lossy().starts_with("ask.");
            if !is_ask || seen.contains(&path) {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            if !text.contains(marker) {
                continue;
            }
            let socket = text
                .lines()
                .find_map(|l| l.strip_prefix("Socket="))
                .expect("the ask file names its socket");
            assert!(text.contains("Id=cryptblk"), "{text}");
            seen.push(path);
            UnixDatagram::unbound()
                .unwrap()
                .send_to(format!("+{answer}").as_bytes(), socket)
                .unwrap();
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ask_password_asks_the_password_agents_again_when_wrong() {
    if !crate::common::is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs the tests as root: systemd-ask-password takes answers from root only"
        );
        eprintln!("NOT RUN: systemd-ask-password takes answers from root only");
        return;
    }
    std::fs::create_dir_all("/run/systemd/ask-password").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    let pass = "agent passphrase";
    std::fs::write(p("key"), pass).unwrap();
    crate::common::quick_luks2(&p("v.img"), &p("key"), 32);
    let notify = UnixDatagram::bind(p("notify")).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let nbd = p("s.sock");
    let child = Command::new(bin())
        .args([
            "open",
            &p("v.img"),
            "vol",
            "--nbd",
            &format!("unix:{nbd}"),
            "--run-dir",
            &p("run"),
            "--ask-password",
            "--tries",
            "2",
        ])
        .env("NOTIFY_SOCKET", p("notify"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The prompt names the device, in this test's own directory.
    let marker = p("v.img");
    let mut seen = Vec::new();
    answer_agent(&marker, &mut seen, "not the passphrase");
    answer_agent(&marker, &mut seen, pass);
    until(&notify, "READY=1");
    let mut c = NbdClient::connect(&nbd, "vol").unwrap();
    assert_eq!(c.read(0, 512).unwrap().unwrap().len(), 512);
    c.disconnect();
    ok(&run_in(
        bin(),
        &["close", "vol", "--run-dir", &p("run")],
        b"",
    ));
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("No key available with this passphrase"),
        "{err}"
    );

    // --daemon: the parent asks the agents once and hands the passphrase over; the child
    // asks nothing.
    let opener = Command::new(bin())
        .args([
            "open",
            &p("v.img"),
            "vol",
            "--nbd",
            &format!("unix:{nbd}"),
            "--run-dir",
            &p("run"),
            "--ask-password",
            "--daemon",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    answer_agent(&marker, &mut seen, pass);
    let out = opener.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let asked_again = std::fs::read_dir("/run/systemd/ask-password")
        .unwrap()
        .flatten()
        .any(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains(&marker)));
    ok(&run_in(
        bin(),
        &["close", "vol", "--run-dir", &p("run")],
        b"",
    ));
    assert!(!asked_again, "the daemon child asked the agents again");
}
