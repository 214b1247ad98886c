//! The data path: segments, split I/O, the mmap engine, reencryption offline and online,
//! the volume model.
//! One test binary of modules (one link, `common` compiled once), as rustls groups its
//! tests.

#[path = "../../../format/tests/common/mod.rs"]
mod common;

mod integrity;
mod mmap_engine;
mod online_reencryption;
mod reencryption;
mod segments;
mod split_io;
mod volume_model;
