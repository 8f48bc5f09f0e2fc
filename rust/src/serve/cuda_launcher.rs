//! Launches on a CUDA device: one host-to-device copy of step_in, graphs launched by their exec
//! handles through the driver API, one device-to-host copy of step_out with an event behind it (two where
//! the PCM of a step's codec rows is copied back as soon as they are decoded, `EngineWorker::early_pcm`).
//! Captured LM launches are planned here: FlashInfer's by its planners compiled into the extension
//! (`attention_plan.rs`), the torch backend's need no plan (its graphs gather every page column).
//! Stages the spec gives as callables (an eager prefill, --disable-cuda-graph) and their attention
//! plans go through Python on the same stream (vox_serve/rust_host.py).

use std::collections::HashMap;

use super::attention_plan::{regions_needed, HostRegions, LaunchPlanner};
use super::py_launcher::PyHandles;
use crate::cuda::{self, CudaError, Event, PinnedHost};
use crate::driver::layout::HostBuf;
use crate::driver::{AttentionPlan, EngineSpec, Half, Launch, LaunchHandle, Launcher, Stage};
use crate::planner::PlannerDevice;

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
    /// Behind each step's early copy of its PCM (`download_early`).
    early: Vec<Event>,
    /// (parity, stage) -> events around the launch, when stage times are measured.
    timing: Option<HashMap<(usize, Stage), (Event, Event)>>,
    /// Who plans captured LM launches.
    planning: GraphPlanning,
}

/// How the captured LM launches of an engine are planned.
pub enum GraphPlanning {
    /// The torch and triton backends' graphs read no host plan.
    Unplanned,
    /// FlashInfer's planners in Rust; the pinned regions they write stay alive with them.
    Rust(Box<LaunchPlanner>, PinnedHost),
    /// Through the spec's Python planner handle (and why not in Rust).
    Python(String),
}

impl GraphPlanning {
    fn of(spec: &EngineSpec, device: i32) -> GraphPlanning {
        // Only FlashInfer's graphs read a host plan; a codec half launches no LM stage.
        if spec.attention_backend != "flashinfer" || spec.half == Half::Codec {
            return GraphPlanning::Unplanned;
        }
        let rust = || -> Result<GraphPlanning, String> {
            let props = cuda::device_props(device).map_err(err)?;
            let dev = PlannerDevice { num_sm: props.num_sm, cc_major: props.cc_major, cc_minor: props.cc_minor,
                                      decode_blocks_per_sm: 1 };
            let pinned = PinnedHost::new(device, regions_needed(&spec.planners)).map_err(err)?;
            let regions = HostRegions { base: pinned.as_mut_ptr(), len: pinned.len() };
            let planner = LaunchPlanner::new(spec, dev, regions)?;
            let occupancy = planner.decode_blocks_per_sm()
                .map_or(String::new(), |b| format!(", decode kernel occupancy {b} blocks/SM"));
            eprintln!("vox-serve: captured flashinfer launches are planned in Rust (FlashInfer {}{occupancy})",
                      crate::planner::flashinfer_version());
            Ok(GraphPlanning::Rust(Box::new(planner), pinned))
        };
        rust().unwrap_or_else(|why| {
            eprintln!("vox-serve: warning: captured {} launches are planned through Python: {why}",
                      spec.attention_backend);
            GraphPlanning::Python(why)
        })
    }

    /// "rust", "none" or "python": who plans captured launches (for the start-up report and tests).
    pub fn name(&self) -> &'static str {
        match self {
            GraphPlanning::Unplanned => "none",
            GraphPlanning::Rust(..) => "rust",
            GraphPlanning::Python(_) => "python",
        }
    }
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
        let events = || (0..buffers).map(|_| Event::new(device, false)).collect::<Result<Vec<_>, _>>().map_err(err);
        let (done, early) = (events()?, events()?);
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
        let planning = GraphPlanning::of(spec, device);
        Ok(CudaLauncher { device, stream, in_dev: spec.step_in.device_ptr, in_host: spec.step_in.host_ptrs.clone(),
                          out_dev: spec.step_out.device_ptr, out_host: spec.step_out.host_ptrs.clone(), graphs,
                          handles, done, early, timing, planning })
    }

    pub fn planning(&self) -> &GraphPlanning {
        &self.planning
    }
}

impl Launcher for CudaLauncher {
    fn timer(&self) -> &'static str {
        "cuda"
    }

    fn upload(&mut self, parity: usize, nbytes: usize) -> Result<(), String> {
        cuda::memcpy_htod_async(self.device, self.in_dev, self.in_host[parity], nbytes, self.stream).map_err(err)
    }

    fn plan_attention(&mut self, launch: &Launch, plan: &AttentionPlan, parity: usize) -> Result<(), String> {
        if !self.graphs.contains_key(&(launch.stage, launch.bucket)) {
            return self.handles.plan(launch.stage, plan, parity);
        }
        match &self.planning {
            GraphPlanning::Unplanned => Ok(()),
            GraphPlanning::Python(_) => self.handles.plan(launch.stage, plan, parity),
            GraphPlanning::Rust(planner, _) => {
                let h = HostBuf { base: self.in_host[parity] as *mut u8 };
                for c in planner.plan(launch, h, parity)? {
                    cuda::memcpy_htod_async(self.device, c.dst, c.src, c.nbytes, self.stream).map_err(err)?;
                }
                Ok(())
            }
        }
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

    fn download_early(&mut self, parity: usize, offset: usize, nbytes: usize) -> Result<(), String> {
        let (dst, src) = (self.out_host[parity] + offset as u64, self.out_dev + offset as u64);
        cuda::memcpy_dtoh_async(self.device, dst, src, nbytes, self.stream).map_err(err)?;
        self.early[parity].record(self.stream).map_err(err)
    }

    fn wait_early(&mut self, parity: usize) -> Result<(), String> {
        self.early[parity].synchronize().map_err(err)
    }

    fn done(&mut self, parity: usize) -> Result<bool, String> {
        self.done[parity].query().map_err(err)
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
