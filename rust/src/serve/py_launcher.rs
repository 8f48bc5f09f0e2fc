//! Launches through Python on a CPU device: each stage bucket's callable handle and the torch
//! attention backend's planner, resolved by vox_serve/rust_host.py. The only Python per step,
//! and only where the device is the host.

use std::collections::HashMap;
use std::time::Instant;

use pyo3::prelude::*;

use crate::driver::{AttentionPlan, EngineSpec, Launch, LaunchHandle, Launcher, Stage};

pub fn py_err(py: Python, e: PyErr) -> String {
    let text = e.to_string();
    if let Some(tb) = e.traceback(py) {
        if let Ok(formatted) = tb.format() {
            return format!("{text}\n{formatted}");
        }
    }
    text
}

/// The callables of a spec's stages and its planner, as Python functions.
pub struct PyHandles {
    runners: HashMap<(Stage, usize), PyObject>,
    planner: PyObject,
}

impl PyHandles {
    /// `stream`: the CUDA stream they run on (None on a CPU device).
    pub fn new(py: Python, host: &PyModule, spec: &EngineSpec, stream: Option<u64>) -> PyResult<PyHandles> {
        let mut runners = HashMap::new();
        for (&stage, s) in &spec.stages {
            for (&bucket, handle) in &s.handles {
                if let LaunchHandle::Callable(h) = handle {
                    runners.insert((stage, bucket), host.call_method1("stage_runner", (h.as_str(), stream))?.into_py(py));
                }
            }
        }
        let planner = host.call_method1("attention_planner", (spec.planner.as_str(), stream))?.into_py(py);
        Ok(PyHandles { runners, planner })
    }

    pub fn has(&self, stage: Stage, bucket: usize) -> bool {
        self.runners.contains_key(&(stage, bucket))
    }

    pub fn plan(&self, stage: Stage, p: &AttentionPlan, parity: usize) -> Result<(), String> {
        Python::with_gil(|py| {
            let args = (stage.name(), p.qo_lens.clone(), p.kv_lens.clone(), p.num_rows, p.graph_tokens, p.decode, parity);
            self.planner.call1(py, args).map(|_| ()).map_err(|e| py_err(py, e))
        })
    }

    pub fn run(&self, launch: &Launch) -> Result<(), String> {
        let runner = self.runners.get(&(launch.stage, launch.bucket))
            .ok_or_else(|| format!("no callable for {}[{}]", launch.stage.name(), launch.bucket))?;
        Python::with_gil(|py| runner.call1(py, (launch.num_seqs,)).map(|_| ()).map_err(|e| py_err(py, e)))
    }
}

/// A CPU device: the host buffers are the device buffers, so copies are nothing; stage times are
/// wall times.
pub struct PyLauncher {
    pub handles: PyHandles,
}

impl Launcher for PyLauncher {
    fn timer(&self) -> &'static str {
        "wall"
    }

    fn upload(&mut self, _parity: usize, _nbytes: usize) -> Result<(), String> {
        Ok(())
    }

    fn plan_attention(&mut self, launch: &Launch, plan: &AttentionPlan, parity: usize) -> Result<(), String> {
        self.handles.plan(launch.stage, plan, parity)
    }

    fn run(&mut self, _parity: usize, launch: &Launch) -> Result<Option<f64>, String> {
        let start = Instant::now();
        self.handles.run(launch)?;
        Ok(Some(start.elapsed().as_secs_f64()))
    }

    fn download(&mut self, _parity: usize, _nbytes: usize) -> Result<(), String> {
        Ok(())
    }

    fn wait(&mut self, _parity: usize, _launches: &[Launch]) -> Result<Vec<(&'static str, f64)>, String> {
        Ok(Vec::new())
    }
}
