//! `vox_serve._rt`, the Rust runtime extension of vox-serve (see rust/docs/README.md).
//!
//! This build holds what the Rust engine driver will stand on: CUDA through the driver API
//! (`cuda`), the sampling kernels (`cuda::kernels`), FlashInfer's planners (`planner`), the
//! tokenizers (`tokenizer`) and prompt builders (`models`). It has no serving entry point yet.

// The build script sets `vox_kernels` / `vox_planner`; declaring them for newer toolchains'
// check-cfg would warn on Debian's (1.63).
#![allow(unknown_lints, unexpected_cfgs)]

pub mod cuda;
pub mod driver;
pub mod models;
pub mod planner;
mod python;
pub mod sched;
pub mod serve;
pub mod sim;
pub mod tokenizer;

use pyo3::prelude::*;

#[pymodule]
fn _rt(_py: Python, m: &PyModule) -> PyResult<()> {
    python::register(m)
}
