//! The Rust runtime's scheduler: the same policies and the same decisions as the Python
//! scheduler (vox_serve/scheduler/), over the same host mirror of the request slots. The shared
//! scenario tests (tests/test_scheduler_scenarios.py) run both against simulated engines and
//! check that they plan the same steps.

pub mod base;
pub mod chunks;
pub mod clock;
mod codec;
pub mod config;
mod deadline;
mod decode;
pub mod engine_loop;
pub mod plan;
mod policy;
pub mod pool;
mod prefill;
mod results;
pub mod table;
pub mod trace;
pub mod types;

pub use base::{AddError, Event, Reasons, Scheduler};
pub use clock::Clock;
pub use config::{EngineLimits, PolicyKind, ProgramMeta, SchedulerConfig};
pub use plan::{CodecLaunch, LmLaunch, SlotInit, StepPlan, StepResult};
pub use types::{OutKind, Prompt, ReqKey, Request, RequestStatus, SamplingParams, TextFeed};
