//! LUKS2 reencryption in cryptsetup's format (`online-reencrypt-v2`/`-v3`): the metadata
//! and its digest (`metadata`), starting a job (`start`), the JSON it writes (`json`), the
//! steps and their one driver (`job`), data moves and shifts (`shift`), crash recovery
//! (`recovery`). Either tool resumes or recovers the other's job.

mod decrypt_shift;
mod job;
mod json;
mod metadata;
mod recovery;
mod shift;
mod start;

pub use job::{ReencryptJob, ReencryptOutcome, ReencryptStep, StepHost};
pub use metadata::{REQUIREMENT_V2, REQUIREMENT_V3, ResilienceRequest, StepRecovery};
pub(crate) use metadata::{Reencryption, Stretch, is_known_requirement};
pub(crate) use recovery::wipe_random;
pub use shift::MAX_REDUCE;
pub use start::ReencryptRequest;
