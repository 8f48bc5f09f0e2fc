//! Launches on a CUDA device: one host-to-device copy of step_in, graphs launched by their exec
//! handles through the driver API, one device-to-host copy of step_out with an event behind it.
//! Stages the spec gives as callables (an eager prefill, --disable-cuda-graph) and attention
//! planning go through Python on the same stream (vox_serve/rust_host.py) -- planning with the
//! Rust FlashInfer shim is not wired yet.

use std::collections::HashMap;

use super::py_launcher::PyHandles;
use crate::cuda::{self, CudaError, Event};
use crate::driver::{AttentionPlan, EngineSpec, Launch, LaunchHandle, Launcher, Stage};

fn err(e: CudaError) -> String {
    e.0
}

pub struct CudaLauncher {
    device: i32,
    stream: u64,
    in_dev: u64,
    in_host: Vec<u64>,
    out_dev: u64,
    out_host: Vec<u64>,
    graphs: HashMap<(Stage, usize), u64>,
    handles: PyHandles,
    done: Vec<Event>,
    /// (parity, stage) -> events around the launch, when stage times are measured.
    timing: Option<HashMap<(usize, Stage), (Event, Event)>>,
}

impl CudaLauncher {
    pub fn new(spec: &EngineSpec, stream: u64, handles: PyHandles, time_stages: bool) -> Result<CudaLauncher, String> {
        let device = spec.cuda_ordinal()?;
        let mut graphs = HashMap::new();
        for (&stage, s) in &spec.stages {
            for (&bucket, h) in &s.handles {
                if let LaunchHandle::Graph { exec, .. } = h {
                    graphs.insert((stage, bucket), *exec);
                }
            }
        }
        let buffers = spec.step_in.host_ptrs.len();
        let done = (0..buffers).map(|_| Event::new(device, false)).collect::<Result<Vec<_>, _>>().map_err(err)?;
        let timing = if time_stages {
            let mut t = HashMap::new();
            for p in 0..buffers {
                for s in Stage::ALL {
                    t.insert((p, s), (Event::new(device, true).map_err(err)?, Event::new(device, true).map_err(err)?));
                }
            }
            Some(t)
        } else {
            None
        };
        Ok(CudaLauncher { device, stream, in_dev: spec.step_in.device_ptr, in_host: spec.step_in.host_ptrs.clone(),
                          out_dev: spec.step_out.device_ptr, out_host: spec.step_out.host_ptrs.clone(), graphs,
                          handles, done, timing })
    }
}

impl Launcher for CudaLauncher {
    fn timer(&self) -> &'static str {
        "cuda"
    }

    fn upload(&mut self, parity: usize, nbytes: usize) -> Result<(), String> {
        cuda::memcpy_htod_async(self.device, self.in_dev, self.in_host[parity], nbytes, self.stream).map_err(err)
    }

    fn plan_attention(&mut self, stage: Stage, plan: &AttentionPlan, parity: usize) -> Result<(), String> {
        self.handles.plan(stage, plan, parity)
    }

    fn run(&mut self, parity: usize, launch: &Launch) -> Result<Option<f64>, String> {
        if let Some(t) = &self.timing {
            t[&(parity, launch.stage)].0.record(self.stream).map_err(err)?;
        }
        match self.graphs.get(&(launch.stage, launch.bucket)) {
            Some(&exec) => cuda::graph_launch(self.device, exec, self.stream).map_err(err)?,
            None => self.handles.run(launch)?,
        }
        if let Some(t) = &self.timing {
            t[&(parity, launch.stage)].1.record(self.stream).map_err(err)?;
        }
        Ok(None)
    }

    fn download(&mut self, parity: usize, nbytes: usize) -> Result<(), String> {
        cuda::memcpy_dtoh_async(self.device, self.out_host[parity], self.out_dev, nbytes, self.stream).map_err(err)?;
        self.done[parity].record(self.stream).map_err(err)
    }

    fn wait(&mut self, parity: usize, launches: &[Launch]) -> Result<Vec<(&'static str, f64)>, String> {
        self.done[parity].synchronize().map_err(err)?;
        match &self.timing {
            None => Ok(Vec::new()),
            Some(t) => launches.iter().map(|l| {
                let (start, end) = &t[&(parity, l.stage)];
                Ok((l.stage.name(), f64::from(start.elapsed_ms(end).map_err(err)?) / 1000.0))
            }).collect(),
        }
    }
}
