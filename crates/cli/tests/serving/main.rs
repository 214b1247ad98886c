//! Serving volumes end to end: NBD (with TLS), FUSE, ublk, vhost-user-blk, resize, suspend, crypttab files, systemd notification, metrics, durability
//! across kills, remote NBD and RBD storage, key hygiene and other local users, with the
//! real clients.
//! One test binary of modules (one link, `common` compiled once), as rustls groups its
//! tests.

#[path = "../common/mod.rs"]
mod common;

mod crypttab;
mod durability;
mod fuse;
mod integrity;
mod key_hygiene;
mod local_users;
mod man_and_completion;
mod metrics;
mod nbd_stress;
mod rbd;
mod remote;
mod resize;
mod serve;
mod suspend;
mod systemd;
mod ublk;
mod vhost_user_blk;
