//! Serves a RAM disk over NBD on a Unix socket, for benchmarks and manual testing.
//!
//! `cargo run --release -p cryptblk-nbd --example nbd_memory_server -- SOCKET [SIZE_MIB] [THREADS]`
//! then e.g. `fio --name=t --ioengine=nbd --uri=nbd+unix:///?socket=SOCKET --rw=randread --bs=4k`.
//! Stops (flushing, printing its counters) when stdin is closed or a line is entered.

use std::sync::Arc;

use cryptblk_device::MemoryDevice;
use cryptblk_nbd::NbdServer;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let socket = args
        .next()
        .expect("usage: nbd_memory_server SOCKET [SIZE_MIB] [THREADS]");
    let size_mib: u64 = args.next().map_or(1024, |s| s.parse().expect("SIZE_MIB"));
    let threads: usize = args.next().map_or(4, |s| s.parse().expect("THREADS"));
    let server = NbdServer::builder()
        .export("", Arc::new(MemoryDevice::new(size_mib << 20, 512)))
        .description("cryptblk RAM disk")
        .threads_per_connection(threads)
        .build()?;
    let handle = server.shutdown_handle();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        handle.shutdown();
    });
    eprintln!("serving {size_mib} MiB on {socket} ({threads} threads per connection)");
    server.serve_unix(&socket)?;
    eprintln!("{:?}", server.stats());
    Ok(())
}
