//! Volumes on Ceph RBD images (`rbd:POOL/IMAGE`), against a throwaway single-node cluster
//! (`tests/ceph/cluster.sh`: ceph-mon and ceph-osd from Debian, memstore, cephx off) and
//! librbd's own LUKS encryption (python3-rbd): librbd formats and writes, cryptblk reads;
//! cryptblk formats and writes, librbd reads; a keyslot cryptblk adds opens in librbd; fio
//! verifies through cryptblk's NBD frontend over RBD; a VM's writes over vhost-user-blk
//! decrypt in librbd; the exclusive lock keeps a second writer out; a missing pool, a
//! missing image and a cluster that is down are clear errors.
//! One test runs the scenarios in order on one cluster (it takes about 5 s to start).

use crate::common::ceph::Cluster;
use crate::common::{bin, ok, run_in, serve_nbd_unix, tool};
use cryptblk_vhost_user_blk::client::{Client, ClientOptions, status};
use std::path::Path;
use std::process::{Command, Output};

const PASS: &[u8] = b"rbd passphrase";
const MIB: usize = 1 << 20;

/// librbd through python3-rbd (Debian's system Python, where the module lives).
fn librbd(conf: &str, script: &str, stdin: &[u8]) -> Output {
    let prog = format!(
        "import rados, rbd, sys\n\
         c = rados.Rados(conffile={conf:?}); c.connect(timeout=20)\n\
         io = c.open_ioctx('rbd')\n\
         {script}\n\
         io.close(); c.shutdown()\n"
    );
    run_in("/usr/bin/python3", &["-c", &prog], stdin)
}

fn create(conf: &str, image: &str) {
    ok(&librbd(
        conf,
        &format!("rbd.RBD().create(io, {image:?}, 64 << 20)"),
        b"",
    ));
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

/// SIGTERM to a server, which must end cleanly having closed `images`: librbd lists no
/// lock and no watch on them.
fn stop_and_check_released(mut server: std::process::Child, conf: &str, images: &[&str]) {
    ok(&run_in(
        &tool("kill", "procps"),
        &["-TERM", &server.id().to_string()],
        b"",
    ));
    let t0 = std::time::Instant::now();
    while server.try_wait().unwrap().is_none() {
        if t0.elapsed().as_secs() > 120 {
            let _ = server.kill();
            panic!(
                "SIGTERM did not end the server: {:?}",
                server.wait_with_output()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = server.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "SIGTERM ends the server cleanly: {out:?}"
    );
    for image in images {
        let left = ok(&librbd(
            conf,
            &format!(
                "with rbd.Image(io, {image:?}, read_only=True) as img:\n    \
                   print('lockers', img.list_lockers())\n    \
                   print('watchers', list(img.watchers_list()))\n"
            ),
            b"",
        ));
        assert!(
            left.contains("lockers []") && left.contains("watchers []"),
            "the closed server left its lock or watch on {image}: {left}"
        );
    }
}

#[test]
fn rbd_images_interoperate_with_librbd_encryption() {
    let python_ok = Command::new("/usr/bin/python3")
        .args(["-c", "import rbd, rados"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        python_ok,
        "python3-rbd missing: install the Debian packages python3-rbd ceph-mon ceph-osd ceph-common (scripts/setup.sh does)"
    );
    tool("ceph-mon", "ceph-mon");
    let tmp = tempfile::tempdir().unwrap();
    let p = |f: &str| tmp.path().join(f).to_str().unwrap().to_string();
    std::fs::write(p("pw"), PASS).unwrap();
    let cluster = Cluster::start(tmp.path());
    let conf = cluster.conf.clone();
    let cb = |args: &[&str]| -> Output {
        let mut a = args.to_vec();
        a.extend(["--ceph-conf", &conf]);
        run_in(bin(), &a, b"")
    };
    // `format -q` with a fast PBKDF; `args`: the type, the key file, the device.
    let format = |args: &[&str]| {
        let mut a = vec![
            "format",
            "-q",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
        ];
        a.extend(args);
        ok(&cb(&a));
    };
    // Serves `args` (`open DEVICE NAME ...`) on the unix socket `sock` over NBD.
    let serve = |args: &[&str], sock: &std::path::Path| {
        let run_dir = p("run");
        let mut a = args.to_vec();
        a.extend(["--run-dir", &run_dir, "--ceph-conf", &conf]);
        serve_nbd_unix(&a, sock, b"")
    };

    // librbd formats (LUKS2, its own defaults) and writes; cryptblk reads the plaintext.
    create(&conf, "a");
    let data = pattern(1, MIB);
    std::fs::write(p("data"), &data).unwrap();
    ok(&librbd(
        &conf,
        "with rbd.Image(io, 'a') as img:\n    \
           img.encryption_format(rbd.RBD_ENCRYPTION_FORMAT_LUKS2, sys.stdin.buffer.read())\n",
        PASS,
    ));
    ok(&librbd(
        &conf,
        &format!(
            "with rbd.Image(io, 'a') as img:\n    \
               img.encryption_load(rbd.RBD_ENCRYPTION_FORMAT_LUKS2, sys.stdin.buffer.read())\n    \
               img.write(open({:?}, 'rb').read(), 0)\n",
            p("data")
        ),
        PASS,
    ));
    let dump = ok(&cb(&["dump", "rbd:rbd/a"]));
    assert!(dump.contains("Version:       \t2"), "{dump}");
    ok(&cb(&[
        "export",
        "rbd:rbd/a",
        &p("a.out"),
        "--key-file",
        &p("pw"),
    ]));
    assert!(
        std::fs::read(p("a.out")).unwrap()[..MIB] == data[..],
        "cryptblk read other plaintext than librbd wrote"
    );

    // cryptblk formats (LUKS2 and LUKS1) and writes; librbd reads; a keyslot cryptblk adds
    // opens in librbd.
    std::fs::write(p("pw2"), b"second rbd passphrase").unwrap();
    for (image, kind, fmt, offset_line) in [
        ("b", "luks2", "LUKS2", "offset: 16777216 [bytes]"),
        ("c", "luks1", "LUKS1", "Payload offset:\t8192"),
    ] {
        create(&conf, image);
        let dev = format!("rbd:rbd/{image}");
        format(&["--type", kind, "--key-file", &p("pw"), &dev]);
        let dump = ok(&cb(&["dump", &dev]));
        assert!(
            dump.contains(offset_line),
            "{kind}: data not on an object boundary:\n{dump}"
        );
        let data = pattern(2, 3 * MIB);
        std::fs::write(p("in"), &data).unwrap();
        ok(&cb(&["import", &dev, &p("in"), "--key-file", &p("pw")]));
        let read = format!(
            "with rbd.Image(io, {image:?}) as img:\n    \
               img.encryption_load(rbd.RBD_ENCRYPTION_FORMAT_{fmt}, sys.stdin.buffer.read())\n    \
               sys.stdout.buffer.write(img.read(0, {}))\n",
            3 * MIB
        );
        let out = librbd(&conf, &read, PASS);
        assert!(
            out.status.success(),
            "{kind}: librbd could not load: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stdout == data,
            "{kind}: librbd read other plaintext than cryptblk wrote"
        );
        ok(&cb(&[
            "add-key",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            &p("pw"),
            &dev,
            &p("pw2"),
        ]));
        let out = librbd(&conf, &read, b"second rbd passphrase");
        assert!(
            out.status.success() && out.stdout == data,
            "{kind}: librbd refused the keyslot cryptblk added: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // The LUKS1 image as a VM's disk over vhost-user-blk (the crate's client plays the VM):
    // what the VM writes, librbd's own LUKS decrypts; `close` releases the image.
    let vhost_sock = p("vm.sock");
    ok(&cb(&[
        "open",
        "rbd:rbd/c",
        "vmdisk",
        "--vhost-user-blk",
        &vhost_sock,
        "--queues",
        "2",
        "--daemon",
        "--run-dir",
        &p("run"),
        "--key-file",
        &p("pw"),
    ]));
    let opt = ClientOptions {
        queues: 2,
        ..ClientOptions::default()
    };
    let mut vm = Client::connect(Path::new(&vhost_sock), opt).unwrap();
    assert_eq!(
        vm.capacity().unwrap(),
        (64 << 20) - 8192 * 512,
        "LUKS1 payload"
    );
    let written = pattern(9, MIB);
    assert_eq!(vm.write(1, MIB as u64, &written).unwrap(), status::OK);
    let mut back = vec![0u8; MIB];
    assert_eq!(vm.read(0, MIB as u64, &mut back).unwrap(), status::OK);
    assert!(back == written, "the VM reads back what it wrote");
    drop(vm);
    ok(&run_in(
        bin(),
        &["close", "vmdisk", "--run-dir", &p("run")],
        b"",
    ));
    let out = librbd(
        &conf,
        &format!(
            "with rbd.Image(io, 'c') as img:\n    \
               img.encryption_load(rbd.RBD_ENCRYPTION_FORMAT_LUKS1, sys.stdin.buffer.read())\n    \
               sys.stdout.buffer.write(img.read({MIB}, {MIB}))\n"
        ),
        PASS,
    );
    assert!(
        out.status.success() && out.stdout == written,
        "librbd reads what the VM wrote over vhost-user-blk: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The rbd crate's own way to librbd's encryption (what `scripts/bench-rbd.sh` measures
    // beside cryptblk, with the `rbd_load` example): librbd formats and writes through it,
    // cryptblk reads; cryptblk writes, librbd reads through it.
    let rbd_load = Path::new(bin()).with_file_name("examples").join("rbd_load");
    assert!(
        rbd_load.exists(),
        "{} missing: cargo build --examples (cargo test builds it)",
        rbd_load.display()
    );
    let pw = p("pw");
    let load = |args: &[&str]| {
        let mut a = vec!["--conf", &conf, "rbd/r", "--luks2", &pw];
        a.extend(args);
        run_in(rbd_load.to_str().unwrap(), &a, b"")
    };
    create(&conf, "r");
    ok(&load(&["format-luks2"]));
    ok(&load(&["fill", "171", "2"]));
    ok(&cb(&[
        "export",
        "rbd:rbd/r",
        &p("r.out"),
        "--key-file",
        &p("pw"),
    ]));
    let out = std::fs::read(p("r.out")).unwrap();
    assert!(out[..2 * MIB].iter().all(|&b| b == 171), "librbd's writes");
    std::fs::write(p("cd"), vec![0xcdu8; MIB]).unwrap();
    ok(&cb(&[
        "import",
        "rbd:rbd/r",
        &p("cd"),
        "--key-file",
        &p("pw"),
    ]));
    ok(&load(&["check", "205", "1"]));
    let o = load(&["check", "171", "1"]);
    assert_eq!(o.status.code(), Some(3), "a check that must fail: {o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("byte 0 is 0xcd, not 0xab"),
        "{o:?}"
    );

    // fio through cryptblk's NBD frontend over RBD; meanwhile a second writer is refused.
    let sock = tmp.path().join("front.sock");
    let server = serve(&["open", "rbd:rbd/b", "vol", "--key-file", &p("pw")], &sock);
    let o = cb(&[
        "open",
        "rbd:rbd/b",
        "vol2",
        "--key-file",
        &p("pw"),
        "--run-dir",
        &p("run"),
        "--nbd",
        &format!("unix:{}", p("other.sock")),
    ]);
    assert_eq!(
        o.status.code(),
        Some(5),
        "a second writer must be refused: {o:?}"
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("locked by another client"),
        "{o:?}"
    );
    let front = format!("nbd+unix:///vol?socket={}", sock.display());
    crate::common::fio_verify(
        tmp.path(),
        &front,
        &[("randrw", "4k", "16"), ("write", "1m", "4")],
    );
    // SIGTERM: the server closes the image on its way out, so no lock and no watch is
    // left for the next client to wait out (about 30 s: it did, the process exiting
    // without closing it).
    stop_and_check_released(server, &conf, &["b"]);

    // The same with a detached header on an image of its own (which the server also opens
    // read-write, under its own lock).
    create(&conf, "hd");
    create(&conf, "dd");
    format(&[
        "--type",
        "luks2",
        "--key-file",
        &p("pw"),
        "--header",
        "rbd:rbd/hd",
        "rbd:rbd/dd",
    ]);
    let sock = tmp.path().join("detached.sock");
    let server = serve(
        &[
            "open",
            "rbd:rbd/dd",
            "det",
            "--header",
            "rbd:rbd/hd",
            "--key-file",
            &p("pw"),
        ],
        &sock,
    );
    let front = format!("nbd+unix:///det?socket={}", sock.display());
    crate::common::fio_verify(tmp.path(), &front, &[("write", "1m", "4")]);
    stop_and_check_released(server, &conf, &["hd", "dd"]);

    // Bad input: no such pool, no such image (exit 4, named); a malformed name (exit 1).
    let o = cb(&["dump", "rbd:nopool/x"]);
    assert_eq!(o.status.code(), Some(4), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("pool nopool"),
        "{o:?}"
    );
    let o = cb(&["dump", "rbd:rbd/nosuchimage"]);
    assert_eq!(o.status.code(), Some(4), "{o:?}");
    let o = cb(&["dump", "rbd:rbd"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    // The cluster gone under a server: closing the image would wait for it forever, so
    // the server gives up after --close-timeout and exits 4, saying why.
    let sock = tmp.path().join("gone.sock");
    let server = serve(
        &[
            "open",
            "rbd:rbd/b",
            "gone",
            "--key-file",
            &p("pw"),
            "--close-timeout",
            "3",
        ],
        &sock,
    );
    std::fs::copy(&conf, p("down.conf")).unwrap();
    cluster.stop();
    let t0 = std::time::Instant::now();
    ok(&run_in(
        &tool("kill", "procps"),
        &["-TERM", &server.id().to_string()],
        b"",
    ));
    let out = server.wait_with_output().unwrap();
    let took = t0.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("within 3s of the stop"), "{err}");
    assert!(took.as_secs() >= 3 && took.as_secs() < 30, "took {took:?}");
    assert!(!Path::new(&p("run")).join("gone.pid").exists());

    // The cluster down: an error within the connect timeout, exit 4.
    let t0 = std::time::Instant::now();
    let o = run_in(
        bin(),
        &["dump", "rbd:rbd/b", "--ceph-conf", &p("down.conf")],
        b"",
    );
    assert_eq!(o.status.code(), Some(4), "{o:?}");
    assert!(t0.elapsed().as_secs() < 60, "took {:?}", t0.elapsed());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Ceph cluster"),
        "{o:?}"
    );
}
