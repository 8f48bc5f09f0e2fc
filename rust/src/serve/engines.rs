//! The engine a config built, as its spec gives it (vox_serve/rust_host.py `build_engine_spec`): one
//! engine, or with `--enable-disaggregation` the pair of a disaggregated engine's halves
//! (`{"disaggregated": true, "lm": spec, "codec": spec}`, engine/disagg.py). `Engines::build` makes the
//! worker that drives it (CPU callables or CUDA graphs; one engine or two with the hand-over between
//! them) and hands it to what runs it.

use std::sync::Arc;

use pyo3::prelude::*;
use serde_json::Value;

use super::cuda_launcher::CudaLauncher;
use super::peer_copy::PeerCopy;
use super::py_launcher::{PyHandles, PyLauncher};
use crate::driver::{CodecLane, DisaggregatedWorker, EngineSpec, EngineWorker, Half, HandoverCopy, HostCopy, Launcher};
use crate::sched::config::get;
use crate::sched::engine_loop::Worker;

/// What runs a worker, whichever kind `Engines::build` made.
pub trait WithWorker {
    type Out;
    fn with<W: Worker + Send + 'static>(self, worker: W) -> PyResult<Self::Out>;
}

pub struct Engines {
    /// The engine the scheduler plans for: the whole engine, or the LM half (its meta and limits).
    pub planned: EngineSpec,
    /// A disaggregated engine's codec half.
    pub codec: Option<EngineSpec>,
    /// The codec lane that this replica's codec half shares with other replicas' (`--codec-gpu`).
    pub lane: Option<Arc<CodecLane>>,
    /// `--overlap-detok`: a split engine's codec batches are collected after their steps.
    pub defer_codec: bool,
}

fn is_disaggregated(spec: &Value) -> bool {
    spec.get("disaggregated").and_then(Value::as_bool) == Some(true)
}

/// The JSON of the engine the scheduler plans for (its meta, the prompt builder's inputs).
pub fn planned_json(spec: &Value) -> Result<&Value, String> {
    if is_disaggregated(spec) { get(spec, "spec.", "lm") } else { Ok(spec) }
}

impl Engines {
    pub fn from_json(spec: &Value) -> Result<Engines, String> {
        let planned = EngineSpec::from_json(planned_json(spec)?)?;
        if !is_disaggregated(spec) {
            if planned.half != Half::Whole {
                return Err(format!("spec: the {} half of a disaggregated engine without its other half",
                                   planned.half.name()));
            }
            return Ok(Engines { planned, codec: None, lane: None, defer_codec: false });
        }
        let codec = EngineSpec::from_json(get(spec, "spec.", "codec")?)?;
        if planned.on_cuda() != codec.on_cuda() {
            return Err(format!("spec: the LM half on {} and the codec half on {}: both on GPUs or both on the CPU",
                               planned.device, codec.device));
        }
        Ok(Engines { planned, codec: Some(codec), lane: None, defer_codec: false })
    }

    /// A disaggregated worker joined to this replica's codec lane, if it shares one, else deferring its
    /// codec batches with `--overlap-detok`.
    fn with_lane<L: Launcher, X: HandoverCopy>(&self, worker: DisaggregatedWorker<L, X>) -> DisaggregatedWorker<L, X> {
        match &self.lane {
            Some(lane) => worker.with_lane(lane.clone()),
            None if self.defer_codec => worker.deferring_codec(),
            None => worker,
        }
    }

    /// Build the worker (`time_stages`: CUDA events around every launch) and run it with `user`.
    pub fn build<U: WithWorker>(&self, py: Python, host: &PyModule, time_stages: bool, user: U) -> PyResult<U::Out> {
        let value_err = pyo3::exceptions::PyValueError::new_err;
        let lm = &self.planned;
        match (&self.codec, lm.on_cuda()) {
            (None, false) => user.with(EngineWorker::new(lm, cpu_launcher(py, host, lm)?).map_err(value_err)?),
            (None, true) => {
                let (launcher, _) = cuda_launcher(py, host, lm, time_stages, 0)?;
                user.with(EngineWorker::new(lm, launcher).map_err(value_err)?)
            }
            (Some(codec), false) => {
                let halves = ((lm, cpu_launcher(py, host, lm)?), (codec, cpu_launcher(py, host, codec)?));
                user.with(self.with_lane(DisaggregatedWorker::new(halves.0, halves.1, HostCopy).map_err(value_err)?))
            }
            (Some(codec), true) => {
                let lm_priority = if self.defer_codec && self.lane.is_none() { overlap_lm_priority()? } else { 0 };
                let (lm_launcher, lm_stream) = cuda_launcher(py, host, lm, time_stages, lm_priority)?;
                let (codec_launcher, codec_stream) = cuda_launcher(py, host, codec, time_stages, 0)?;
                let devices = (lm.cuda_ordinal().map_err(value_err)?, codec.cuda_ordinal().map_err(value_err)?);
                let copier = PeerCopy::new(devices.0, lm_stream, devices.1, codec_stream).map_err(value_err)?;
                let worker = DisaggregatedWorker::new((lm, lm_launcher), (codec, codec_launcher), copier);
                user.with(self.with_lane(worker.map_err(value_err)?))
            }
        }
    }
}

fn cpu_launcher(py: Python, host: &PyModule, spec: &EngineSpec) -> PyResult<PyLauncher> {
    Ok(PyLauncher { handles: PyHandles::new(py, host, spec, None)? })
}

/// `--overlap-detok`: the CUDA stream priority of the LM half's launches (lower runs first; the codec half's is
/// 0), from `VOX_OVERLAP_LM_PRIORITY` (an A/B switch, default 0: the same as the codec's).
fn overlap_lm_priority() -> PyResult<i32> {
    match std::env::var("VOX_OVERLAP_LM_PRIORITY") {
        Err(_) => Ok(0),
        Ok(text) => text.trim().parse().map_err(|_| pyo3::exceptions::PyValueError::new_err(format!(
            "VOX_OVERLAP_LM_PRIORITY={text:?}: expected an integer CUDA stream priority (e.g. -1: before the codec)"))),
    }
}

/// A launcher on a new stream of the spec's device (on an SM partition: the partition's stream) of CUDA stream
/// `priority`, and that stream.
fn cuda_launcher(py: Python, host: &PyModule, spec: &EngineSpec, time_stages: bool, priority: i32)
                 -> PyResult<(CudaLauncher, u64)> {
    let args = (spec.device.as_str(), spec.partition_stream, priority);
    let stream: u64 = host.call_method1("launch_stream", args)?.extract()?;
    let handles = PyHandles::new(py, host, spec, Some(stream))?;
    let launcher = CudaLauncher::new(spec, stream, handles, time_stages).map_err(pyo3::exceptions::PyValueError::new_err)?;
    Ok((launcher, stream))
}
