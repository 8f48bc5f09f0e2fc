//! The Python module `vox_serve._rt`.

mod cuda;
mod planner;
mod prompts;
mod serve;

use pyo3::prelude::*;

pub fn register(m: &PyModule) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    cuda::register(m)?;
    planner::register(m)?;
    prompts::register(m)?;
    serve::register(m)?;
    Ok(())
}
