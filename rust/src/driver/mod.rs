//! The engine driver: an engine served from its spec alone (docs/engine-contract.md).

pub mod codec_lane;
pub mod disagg;
pub mod layout;
pub mod planners;
pub mod spec;
pub mod worker;
pub mod writer;

pub use codec_lane::CodecLane;
pub use disagg::{DisaggregatedWorker, HandoverCopy, HostCopy};
pub use spec::{EngineSpec, Half, LaunchHandle, Stage};
pub use worker::{EngineWorker, Launcher};
pub use writer::{AttentionPlan, Launch};

#[cfg(test)]
mod disagg_tests;
#[cfg(test)]
pub(crate) mod writer_tests;
