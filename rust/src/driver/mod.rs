//! The engine driver: an engine served from its spec alone (docs/engine-contract.md).

pub mod layout;
pub mod planners;
pub mod spec;
pub mod worker;
pub mod writer;

pub use spec::{EngineSpec, LaunchHandle, Stage};
pub use worker::{EngineWorker, Launcher};
pub use writer::{AttentionPlan, Launch};

#[cfg(test)]
pub(crate) mod writer_tests;
