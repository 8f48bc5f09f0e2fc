//! benchmark/host_cost.py `--runtime rust`: the Rust scheduler and engine driver over a null
//! engine (the real spec, arenas and slot tables; stages that do nothing), timing everything the
//! host does per step at steady state.

use std::time::Instant;

use crate::driver::{AttentionPlan, EngineSpec, EngineWorker, Launch, Launcher};
use crate::sched::engine_loop::Worker;
use crate::sched::{Clock, Prompt, Request, SamplingParams, Scheduler, SchedulerConfig};

/// Launches that do nothing: what the host costs without the launch calls themselves (on a GPU
/// those are one cudaGraphLaunch per stage).
pub struct NullLauncher;

impl Launcher for NullLauncher {
    fn timer(&self) -> &'static str {
        "wall"
    }

    fn upload(&mut self, _parity: usize, _nbytes: usize) -> Result<(), String> {
        Ok(())
    }

    fn plan_attention(&mut self, _launch: &Launch, _plan: &AttentionPlan, _parity: usize) -> Result<(), String> {
        Ok(())
    }

    fn run(&mut self, _parity: usize, _launch: &Launch) -> Result<Option<f64>, String> {
        Ok(None)
    }

    fn download(&mut self, _parity: usize, _nbytes: usize) -> Result<(), String> {
        Ok(())
    }

    fn wait(&mut self, _parity: usize, _launches: &[Launch]) -> Result<Vec<(&'static str, f64)>, String> {
        Ok(Vec::new())
    }
}

#[derive(Debug, Clone, Copy)]
pub struct HostCost {
    pub seconds_per_step: f64,
    pub decode_rows: u64,
    pub codec_rows: u64,
}

pub struct Workload {
    pub batch: usize,
    pub steps: usize,
    pub prompt_len: usize,
    pub max_tokens: i64,
}

fn one_step<W: Worker>(s: &mut Scheduler, w: &mut W) -> Result<(usize, usize), String> {
    let plan = s.schedule();
    if plan.is_empty() {
        return Ok((0, 0));
    }
    let mut result = w.launch(&plan).and_then(|h| w.collect(h))?;
    s.update(&plan, &mut result);
    s.events.clear();
    Ok((plan.decode.len(), plan.codec.len()))
}

/// Admit `batch` requests, run 20 steps, then time `steps` steps.
pub fn measure<L: Launcher>(spec: &EngineSpec, config: SchedulerConfig, launcher: L, load: &Workload)
                            -> Result<HostCost, String> {
    let mut s = Scheduler::new(spec.meta.clone(), spec.limits.clone(), config, Clock::Monotonic);
    let mut w = EngineWorker::new(spec, launcher)?;
    let columns = spec.meta.input_columns;
    for i in 0..load.batch {
        let prompt = Prompt { ids: vec![0; load.prompt_len * columns], columns, ..Prompt::default() };
        let sampling = SamplingParams { max_tokens: load.max_tokens, ignore_eos: true, ..SamplingParams::default() };
        s.add_request(Request::new(format!("r{i}"), prompt, sampling, true)).map_err(|e| e.to_string())?;
    }
    let mut guard = 0;
    while !s.waiting.is_empty() || s.running.is_empty() {
        one_step(&mut s, &mut w)?;
        guard += 1;
        if guard > 100_000 {
            return Err("the requests were never all admitted".into());
        }
    }
    for _ in 0..20 {
        one_step(&mut s, &mut w)?;
    }
    let (mut decode_rows, mut codec_rows) = (0u64, 0u64);
    let start = Instant::now();
    for _ in 0..load.steps {
        let (d, c) = one_step(&mut s, &mut w)?;
        decode_rows += d as u64;
        codec_rows += c as u64;
    }
    let seconds_per_step = start.elapsed().as_secs_f64() / load.steps as f64;
    Ok(HostCost { seconds_per_step, decode_rows, codec_rows })
}
