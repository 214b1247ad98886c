//! The NBD server and client against real tools and servers (qemu, nbdkit, libnbd, the
//! kernel client), TLS, a real volume.
//! One test binary of modules (one link, `common` compiled once), as rustls groups its
//! tests.

#[path = "../common/mod.rs"]
mod common;

mod client;
mod real_volume;
mod tls;
mod tools;
