//! `cryptblk bench`: drives the real fio over NBD servers (cryptblk, nbdkit, qemu-nbd) and,
//! in a VM guest, over kernel block devices (brd, dm-crypt, ublk); writes the raw fio
//! JSON, `report.md` and SVG/PNG charts.

#![forbid(unsafe_code)]

pub mod chart;
mod config;
mod fio;
mod model;
pub mod preset;
mod progress;
pub mod report;
pub mod runner;
pub mod target;
mod vm;

pub use config::Config;
pub use preset::Preset;
pub use runner::run;
pub use target::CipherChoice;
