//! The NBD server's parsers: the input is everything a client sends on one connection
//! (handshake options, then transmission requests), served by the real connection code over
//! a socket pair against a 1 MiB RAM export. The pure option/request parsers are also fed
//! the raw input directly.
#![no_main]

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cryptblk_device::MemoryDevice;
use cryptblk_nbd::NbdServer;
use cryptblk_nbd::proto::{
    InfoRequest, MetaContextRequest, OPTION_HDR_LEN, OptionHeader, REQUEST_LEN, Request,
};
use libfuzzer_sys::fuzz_target;

fn server() -> &'static NbdServer {
    static S: OnceLock<NbdServer> = OnceLock::new();
    S.get_or_init(|| {
        // libFuzzer's main does not run Rust's runtime setup, which ignores SIGPIPE; a
        // client half that the server closed early must not kill the process.
        // SAFETY: setting a signal disposition to SIG_IGN has no preconditions.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        NbdServer::builder()
            .export("disk", Arc::new(MemoryDevice::new(1 << 20, 512)))
            .description("fuzz")
            .export("ro", Arc::new(MemoryDevice::new(64 << 10, 4096)))
            .read_only(true)
            .threads_per_connection(2)
            .handshake_timeout(Duration::from_secs(5))
            .build()
            .expect("server builds")
    })
}

fuzz_target!(|data: &[u8]| {
    if let Some(h) = data.first_chunk::<OPTION_HDR_LEN>() {
        let o = OptionHeader::parse(h);
        let _ = o.check();
    }
    if let Ok(r) = InfoRequest::parse(data) {
        assert!(r.name.len() + 6 <= data.len());
        let _ = r.types().count();
    }
    if let Ok(r) = MetaContextRequest::parse(data) {
        assert!(r.name.len() + 8 <= data.len());
        assert_eq!(r.queries().count(), r.count() as usize);
    }
    if let Some(h) = data.first_chunk::<REQUEST_LEN>() {
        let r = Request::parse(h);
        assert_eq!(&r.encode(), h);
    }

    let (client, srv) = UnixStream::pair().expect("socketpair");
    let mut reader = client.try_clone().expect("clone");
    let input = data.to_vec();
    let writer = std::thread::spawn(move || {
        let mut c = client;
        let _ = c.write_all(&input);
        let _ = c.shutdown(Shutdown::Write);
    });
    let drain = std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = reader.read_to_end(&mut sink);
    });
    server().serve_unix_stream(srv);
    writer.join().expect("writer thread");
    drain.join().expect("reader thread");
});
