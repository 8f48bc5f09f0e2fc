//! `_rt.serve(config_json)`: the entry point vox_serve/launch.py calls for `--runtime rust`.
//!
//! Each replica's engine (`--dp-size N`: N of them, replica i on GPU i) is built in this interpreter
//! (vox_serve/rust_host.py calls `vox_serve.engine.build_engine`), then a scheduler thread per replica
//! serves it from its spec: the Rust scheduler plans, the engine driver writes and launches, and the
//! calling thread plays the clients with the GIL released (serve/bench.rs). This build serves bench
//! mode (`--bench-requests N`); serving over HTTP is the next issue. Bench mode runs its phases
//! (`--bench-rate`) on the same loops and hands each phase's outcomes to vox_serve/bench_report.py,
//! which reports both runtimes.

use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use serde_json::Value;

use crate::driver::{CodecLane, EngineSpec};
use crate::sched::engine_loop::{BoxWorker, EngineLoop, Worker};
use crate::sched::trace::Tracer;
use crate::sched::{Clock, Request, Scheduler, SchedulerConfig};
use crate::serve::bench::{self, Arrival, Outcome};
use crate::serve::engines::{planned_json, Engines, WithWorker};
use crate::serve::py_launcher::{PyHandles, PyLauncher};
use crate::serve::{prompts, requests};

pub const HTTP_NEXT_ISSUE: &str = "the Rust runtime serves bench mode (--bench-requests N) in this build; serving \
                                   over HTTP comes with the Rust HTTP server (the next issue): serve with --runtime python";

fn value_err(e: String) -> PyErr {
    PyValueError::new_err(e)
}

fn section<'a>(config: &'a Value, name: &str) -> PyResult<&'a Value> {
    config.get(name).ok_or_else(|| value_err(format!("config.{name} is missing")))
}

/// Run one phase on the replicas' scheduler threads (serve/bench.rs), the caller playing the clients
/// without the GIL; the loops come back for the next phase.
#[allow(clippy::type_complexity)]
fn run_phase<W: Worker + Send + 'static>(py: Python, loops: Vec<Option<EngineLoop<W>>>, arrivals: Vec<Arrival>)
                                         -> (Vec<Option<EngineLoop<W>>>, Vec<Outcome>, f64) {
    py.allow_threads(move || bench::run(loops, arrivals))
}

fn tracer(sched: &SchedulerConfig) -> PyResult<Option<Tracer>> {
    match &sched.trace_dir {
        None => Ok(None),
        Some(dir) => Tracer::to_dir(std::path::Path::new(dir)).map(Some).map_err(value_err),
    }
}

/// A Python error that names a bad request field or an unreadable file, as its message.
fn user_error(py: Python, host: &PyModule, e: PyErr) -> PyResult<String> {
    let message: Option<String> = host.call_method1("field_error_message", (e.value(py),))?.extract()?;
    message.ok_or(e)
}

fn parse_list(text: &str) -> PyResult<Vec<Value>> {
    let items: Value = serde_json::from_str(text).map_err(|e| value_err(format!("requests: {e}")))?;
    items.as_array().cloned().ok_or_else(|| value_err("requests: not a list".into()))
}

/// What bench mode needs besides the engine loop: the host module, the spec and the prompt builder.
struct Bench<'a> {
    py: Python<'a>,
    host: &'a PyModule,
    spec: &'a EngineSpec,
    config_json: &'a str,
    builder: Option<&'a crate::models::PromptBuilder>,
    builder_spec: &'a Value,
}

impl Bench<'_> {
    /// Phase `phase`'s requests: fields validated in Python, prompts built by the Rust builder where
    /// it can (else by the program's `preprocess`, off the step path). Err: a message for the user.
    fn requests(&self, phase: usize) -> PyResult<Result<Vec<Request>, String>> {
        let (py, host, engine_id) = (self.py, self.host, self.spec.engine_id);
        if let Some(b) = self.builder {
            let items = match host.call_method1("bench_request_fields", (engine_id, self.config_json, phase)) {
                Ok(text) => parse_list(&text.extract::<String>()?)?,
                Err(e) => return Ok(Err(user_error(py, host, e)?)),
            };
            let no_fields = Value::Null;
            if items.iter().all(|i| prompts::builds(self.builder_spec, i.get("fields").unwrap_or(&no_fields))) {
                if phase == 0 {
                    eprintln!("vox-serve: prompts built in Rust ({} builder)", b.kind());
                }
                let built: Result<Vec<_>, String> = items.iter().map(|i| prompts::request(b, i)).collect();
                return Ok(built.map_err(|m| format!("--bench-kwargs/--bench-text: {m}")));
            }
        }
        if phase == 0 {
            eprintln!("vox-serve: prompts built by the program's preprocess (Python)");
        }
        match host.call_method1("bench_requests", (engine_id, self.config_json, phase)) {
            Ok(text) => {
                let items = parse_list(&text.extract::<String>()?)?;
                Ok(Ok(items.iter().map(requests::request).collect::<Result<Vec<_>, _>>().map_err(value_err)?))
            }
            Err(e) => Ok(Err(user_error(py, host, e)?)),
        }
    }

    /// Every phase of the run (vox_serve/bench_report.py `bench_phases`) on the same replicas' engine
    /// loops, each reported by the Python recorder when it has drained; the exit status.
    fn run_phases<W: Worker + Send + 'static>(&self, mut loops: Vec<Option<EngineLoop<W>>>) -> PyResult<i32> {
        let recorder = self.host.call_method1("bench_recorder", (self.spec.engine_id, self.config_json))?;
        let phases: Vec<&PyAny> = recorder.getattr("phases")?.extract()?;
        let outcome_type = self.py.import("vox_serve.bench_report")?.getattr("BenchOutcome")?;
        for (k, phase) in phases.iter().enumerate() {
            let offsets: Vec<f64> = phase.getattr("offsets")?.extract()?;
            let reqs = match self.requests(k)? {
                Ok(reqs) => reqs,
                Err(message) => {
                    eprintln!("vox-serve: error: {message}");
                    return Ok(2);
                }
            };
            if reqs.len() != offsets.len() {
                return Err(value_err(format!("phase {k}: {} requests for {} arrivals", reqs.len(), offsets.len())));
            }
            let arrivals = reqs.into_iter().zip(offsets).map(|(req, offset)| Arrival { req, offset }).collect();
            if loops.iter().all(Option::is_none) {
                return Err(PyRuntimeError::new_err("every replica has failed"));
            }
            let (back, outcomes, wall) = run_phase(self.py, loops, arrivals);
            loops = back;
            let list = outcomes.iter().map(|o| outcome_object(self.py, outcome_type, o)).collect::<PyResult<Vec<_>>>()?;
            recorder.call_method1("phase_done", (k, list, wall))?;
        }
        recorder.call_method0("finish")?.extract()
    }
}

/// A worker of whatever kind `Engines::build` makes, boxed, so that replicas can be held together.
struct Boxed;

impl WithWorker for Boxed {
    type Out = BoxWorker;

    fn with<W: Worker + Send + 'static>(self, worker: W) -> PyResult<BoxWorker> {
        Ok(Box::new(worker))
    }
}

/// A request's outcome as vox_serve.bench_report.BenchOutcome.
fn outcome_object(py: Python, outcome_type: &PyAny, o: &Outcome) -> PyResult<PyObject> {
    let kwargs = PyDict::new(py);
    kwargs.set_item("req_id", &o.req.req_id)?;
    kwargs.set_item("offset", o.offset)?;
    kwargs.set_item("replica", o.replica)?;
    kwargs.set_item("streaming", o.req.streaming)?;
    kwargs.set_item("admitted", o.admitted)?;
    kwargs.set_item("chunks", o.chunks.clone())?;
    kwargs.set_item("pcm", PyBytes::new(py, &o.pcm))?;
    kwargs.set_item("finished", o.finished)?;
    kwargs.set_item("finish_reason", o.req.finish_reason.clone())?;
    kwargs.set_item("error", o.req.error.clone())?;
    kwargs.set_item("num_generated", o.req.counters.num_generated)?;
    Ok(outcome_type.call((), Some(kwargs))?.into_py(py))
}

fn server_int(config: &Value, name: &str, default: i64) -> i64 {
    config.get("server").and_then(|s| s.get(name)).and_then(Value::as_i64).unwrap_or(default)
}

/// `--overlap-detok`: how many codec batches may be on the device at once, from `VOX_CODEC_IN_FLIGHT` (an
/// A/B switch; 2, the default, queues the next batch behind the running one, so the codec stream does not
/// idle until the host has collected it; a codec half has two host buffers, so at most 2).
fn codec_batches_in_flight() -> PyResult<usize> {
    let Ok(text) = std::env::var("VOX_CODEC_IN_FLIGHT") else { return Ok(2) };
    match text.trim().parse::<usize>() {
        Ok(n @ 1..=2) => Ok(n),
        _ => Err(value_err(format!("VOX_CODEC_IN_FLIGHT={text:?}: expected 1 or 2 codec batches in flight"))),
    }
}

/// How a split replica's codec half is driven: on the lane the replicas' codec halves share (`--codec-gpu`),
/// deferred (`--overlap-detok`, `--async-engines`: its batches land after their steps), or else collected with
/// its step; and whether the LM steps are launched one ahead (`--async-engines`).
struct CodecMode {
    lane: Option<Arc<CodecLane>>,
    defer: bool,
    async_lm: bool,
}

impl CodecMode {
    fn of(config: &Value) -> PyResult<CodecMode> {
        let engine = section(config, "engine")?;
        let shares = engine.get("codec_gpu").map_or(false, |g| !g.is_null());
        let flag = |name: &str| engine.get(name).and_then(Value::as_bool) == Some(true);
        Ok(CodecMode { lane: shares.then(|| Arc::new(CodecLane::default())),
                       defer: flag("overlap_detok") || flag("async_engines"), async_lm: flag("async_engines") })
    }
}

/// Replica `replica`'s engine loop: its engine built in this interpreter for its device
/// (vox_serve/rust_host.py `build_engine_spec`), its worker (its codec half driven as `codec` says),
/// scheduler and tracer. Also the spec's JSON.
fn replica_loop(py: Python, host: &PyModule, config_json: &str, sched: &SchedulerConfig, replica: usize,
                codec: &CodecMode) -> PyResult<(EngineLoop<BoxWorker>, Value)> {
    let spec_json: String = host.call_method1("build_engine_spec", (config_json, replica))?.extract()?;
    let spec_value: Value = serde_json::from_str(&spec_json).map_err(|e| value_err(format!("spec: {e}")))?;
    let mut engines = Engines::from_json(&spec_value).map_err(value_err)?;
    engines.lane = codec.lane.clone();
    engines.defer_codec = codec.defer;
    let spec = &engines.planned;
    let mut scheduler = Scheduler::new(spec.meta.clone(), spec.limits.clone(), sched.clone(), Clock::Monotonic);
    if engines.defer_codec {
        scheduler.max_codec_in_flight = codec_batches_in_flight()?;
    }
    let trace = tracer(sched)?;
    let worker = engines.build(py, host, trace.is_some(), Boxed)?;
    let mut lp = EngineLoop::new(scheduler, worker, trace);
    lp.async_lm = codec.async_lm;
    Ok((lp, spec_value))
}

/// Serve `config` (VoxConfig.to_dict() as JSON); returns the process's exit status. `--dp-size N`
/// builds N replicas (replica i on GPU i), each with its own engine and scheduler thread.
#[pyfunction]
fn serve(py: Python, config_json: &str) -> PyResult<i32> {
    let config: Value = serde_json::from_str(config_json).map_err(|e| value_err(format!("config: {e}")))?;
    let bench_cfg = section(&config, "bench")?;
    let num_requests = bench_cfg.get("num_requests").and_then(Value::as_i64).unwrap_or(0);
    if num_requests <= 0 {
        return Err(PyRuntimeError::new_err(HTTP_NEXT_ISSUE));
    }
    let sched = SchedulerConfig::from_json(section(&config, "scheduler")?).map_err(value_err)?;
    let host = py.import("vox_serve.rust_host")?;
    let dp_size = server_int(&config, "dp_size", 1).max(1) as usize;
    let codec = CodecMode::of(&config)?;
    let mut loops = Vec::new();
    let mut first_spec = Value::Null;
    for replica in 0..dp_size {
        let (lp, spec_value) = replica_loop(py, host, config_json, &sched, replica, &codec)?;
        loops.push(Some(lp));
        if replica == 0 {
            first_spec = spec_value;
        }
    }
    let engines = Engines::from_json(&first_spec).map_err(value_err)?;
    let spec = &engines.planned;
    let use_rust = config.get("engine").and_then(|e| e.get("prompt_builder")).and_then(Value::as_str) != Some("python");
    let builder_spec = planned_json(&first_spec).map_err(value_err)?.get("meta").and_then(|m| m.get("prompt_builder"))
        .cloned().unwrap_or(Value::Null);
    let builder = if use_rust { prompts::builder_of(&builder_spec).map_err(value_err)? } else { None };
    let bench = Bench { py, host, spec, config_json, builder: builder.as_ref(), builder_spec: &builder_spec };
    let status = bench.run_phases(loops);
    if let Some(lane) = &codec.lane {
        eprintln!("vox-serve: the shared codec lane served {} codec batches of {dp_size} replicas", lane.grants());
    }
    status
}

/// benchmark/host_cost.py `--runtime rust`: (seconds per step, decode rows, codec rows) of the Rust
/// scheduler and driver over a built (null) engine's spec. `launcher`: "python" calls the spec's
/// callables and planner through Python (the CPU path); "null" calls nothing (the host's own cost).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn host_cost(py: Python, spec_json: &str, scheduler_json: &str, launcher: &str, batch: usize, steps: usize,
             prompt_len: usize, max_tokens: i64) -> PyResult<(f64, u64, u64)> {
    use crate::serve::host_cost::{measure, NullLauncher, Workload};
    let spec_value: Value = serde_json::from_str(spec_json).map_err(|e| value_err(format!("spec: {e}")))?;
    let spec = EngineSpec::from_json(&spec_value).map_err(value_err)?;
    let sched_value: Value = serde_json::from_str(scheduler_json).map_err(|e| value_err(format!("scheduler: {e}")))?;
    let sched = SchedulerConfig::from_json(&sched_value).map_err(value_err)?;
    let load = Workload { batch, steps, prompt_len, max_tokens };
    let cost = match launcher {
        "null" => py.allow_threads(|| measure(&spec, sched, NullLauncher, &load)),
        "python" => {
            let host = py.import("vox_serve.rust_host")?;
            let launcher = PyLauncher { handles: PyHandles::new(py, host, &spec, None)? };
            measure(&spec, sched, launcher, &load)
        }
        other => return Err(value_err(format!("launcher {other:?}: expected python or null"))),
    }.map_err(PyRuntimeError::new_err)?;
    Ok((cost.seconds_per_step, cost.decode_rows, cost.codec_rows))
}

/// A scenario (JSON: meta, limits, scheduler, costs, arrivals) through the Rust scheduler on the
/// simulated engine; returns JSON: the trace records and each request as its client saw it.
#[pyfunction]
fn simulate(py: Python, scenario_json: &str) -> PyResult<String> {
    let scenario: Value = serde_json::from_str(scenario_json).map_err(|e| value_err(format!("scenario: {e}")))?;
    let out = py.allow_threads(|| crate::sim::simulate(&scenario)).map_err(value_err)?;
    Ok(out.to_string())
}

/// Requests (rust_host.py `_request_data` items, JSON) through the Rust scheduler and driver on a
/// built engine's spec (one engine, or a disaggregated engine's pair of halves), on a scheduler
/// thread; per request (req_id, finish reason, error, tokens generated, PCM). For tests that drive a
/// program loaded by the test itself.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn run_requests(py: Python, spec_json: &str, scheduler_json: &str, requests_json: &str)
                -> PyResult<Vec<(String, Option<String>, Option<String>, i64, PyObject)>> {
    let spec_value: Value = serde_json::from_str(spec_json).map_err(|e| value_err(format!("spec: {e}")))?;
    let engines = Engines::from_json(&spec_value).map_err(value_err)?;
    let sched_value: Value = serde_json::from_str(scheduler_json).map_err(|e| value_err(format!("scheduler: {e}")))?;
    let sched = SchedulerConfig::from_json(&sched_value).map_err(value_err)?;
    let reqs = parse_list(requests_json)?.iter().map(requests::request).collect::<Result<Vec<_>, _>>()
        .map_err(value_err)?;
    let spec = &engines.planned;
    if spec.on_cuda() {
        return Err(value_err("run_requests drives CPU engines".into()));
    }
    let host = py.import("vox_serve.rust_host")?;
    let scheduler = Scheduler::new(spec.meta.clone(), spec.limits.clone(), sched, Clock::Monotonic);
    let arrivals = reqs.into_iter().map(|req| Arrival { req, offset: 0.0 }).collect();
    let worker = engines.build(py, host, false, Boxed)?;
    let (_, outcomes, _) = run_phase(py, vec![Some(EngineLoop::new(scheduler, worker, None))], arrivals);
    Ok(outcomes.into_iter().map(|o| {
        let pcm = PyBytes::new(py, &o.pcm).into_py(py);
        (o.req.req_id, o.req.finish_reason, o.req.error, o.req.counters.num_generated, pcm)
    }).collect())
}

pub fn register(m: &PyModule) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run_requests, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(serve, m)?)?;
    m.add_function(wrap_pyfunction!(host_cost, m)?)?;
    m.add("HTTP_NEXT_ISSUE", HTTP_NEXT_ISSUE)?;
    Ok(())
}
