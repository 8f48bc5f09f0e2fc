//! What the driver reads from an engine spec (vox_serve/engine/spec.py, docs/engine-contract.md):
//! the device, the step arenas, per stage its buckets and launch handles, and the attention
//! planner. Errors name the field.

use std::collections::BTreeMap;

use serde_json::Value;

use super::layout::ArenaLayout;
use super::planners::{Geometry, Planners};
use crate::sched::config::{get, int, string, EngineLimits, ProgramMeta};

/// The launches of a step, in launch order (`core/stages.py` `Stage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    Prologue,
    /// Primes the codec slots of the step's admissions that carry a codec prefix (`codec_prefix_frames`).
    CodecPrime,
    CodecFirst,
    Codec,
    Prefill,
    Decode,
}

impl Stage {
    pub const ALL: [Stage; 6] = [Stage::Prologue, Stage::CodecPrime, Stage::CodecFirst, Stage::Codec, Stage::Prefill, Stage::Decode];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Prologue => "prologue",
            Stage::CodecPrime => "codec_prime",
            Stage::CodecFirst => "codec_first",
            Stage::Codec => "codec",
            Stage::Prefill => "prefill",
            Stage::Decode => "decode",
        }
    }

    /// The stages that decode chunk windows (`core/stages.py` `CODEC_WINDOW_STAGES`).
    pub fn decodes_windows(self) -> bool {
        matches!(self, Stage::CodecFirst | Stage::Codec)
    }

    pub fn parse(name: &str) -> Result<Stage, String> {
        Stage::ALL.iter().copied().find(|s| s.name() == name).ok_or_else(|| format!("unknown stage {name:?}"))
    }
}

/// How one bucket of a stage is launched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchHandle {
    /// A `cudaGraphExec_t`, launched on its capture stream.
    Graph { exec: u64, stream: u64 },
    /// `callable:<engine>:<stage>:<bucket>`, resolved through vox_serve.engine.registry.
    Callable(String),
}

#[derive(Debug, Clone)]
pub struct StageSpec {
    pub buckets: Vec<usize>,
    pub handles: BTreeMap<usize, LaunchHandle>,
    /// Prefill replayed as a graph always runs this many sequences (padded ones empty).
    pub captured_seqs: Option<usize>,
}

impl StageSpec {
    /// The smallest bucket holding `n` rows.
    pub fn bucket(&self, n: usize) -> Result<usize, String> {
        self.buckets.iter().copied().find(|&b| b >= n)
            .ok_or_else(|| format!("{n} rows exceed the largest bucket {:?}", self.buckets.last()))
    }
}

/// Which stages an engine runs (`core/stages.py` `EngineHalf`): all of them, or one half of a
/// disaggregated engine (engine/disagg.py).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Half {
    Whole,
    /// The prologue, prefill and decode; its codec stages gather the codec rows' windows into its hand-over arena.
    Lm,
    /// The prologue, codec priming and the codec stages, over the windows copied into its hand-over arena.
    Codec,
}

impl Half {
    pub fn name(self) -> &'static str {
        match self {
            Half::Whole => "whole",
            Half::Lm => "lm",
            Half::Codec => "codec",
        }
    }

    /// `spec.half`; a spec without one (or `null`) is a whole engine's.
    fn parse(spec: &Value) -> Result<Half, String> {
        match spec.get("half").and_then(Value::as_str) {
            None | Some("whole") => Ok(Half::Whole),
            Some("lm") => Ok(Half::Lm),
            Some("codec") => Ok(Half::Codec),
            Some(other) => Err(format!("spec.half {other:?}: expected whole, lm or codec")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct EngineSpec {
    pub engine_id: i64,
    pub device: String,
    pub half: Half,
    /// A disaggregated half's hand-over arena (`spec.handover`: the codec rows' window inputs).
    pub handover: Option<ArenaLayout>,
    pub meta: ProgramMeta,
    pub limits: EngineLimits,
    pub step_in: ArenaLayout,
    pub step_out: ArenaLayout,
    pub stages: BTreeMap<Stage, StageSpec>,
    pub attention_backend: String,
    pub planner: String,
    pub page_size: i64,
    pub geometry: Geometry,
    /// FlashInfer's wrappers of the captured LM launches (empty for other backends).
    pub planners: Planners,
    /// The stream of the SM partition the engine runs on (`spec.sm_partition.stream`, `--codec-sms`): its
    /// graphs were captured on it, so it is launched on it too.
    pub partition_stream: Option<u64>,
}

fn stage_spec(name: &str, entry: &Value) -> Result<StageSpec, String> {
    let path = format!("stages.{name}.");
    let buckets = get(entry, &path, "buckets")?.as_array().ok_or(format!("{path}buckets is not a list"))?
        .iter().map(|b| b.as_u64().map(|b| b as usize).ok_or(format!("{path}buckets holds a non-size")))
        .collect::<Result<Vec<_>, _>>()?;
    let mut handles = BTreeMap::new();
    let bucket_of = |key: &str| key.parse::<usize>().map_err(|_| format!("{path}: bucket {key:?} is not a size"));
    if let Some(Value::Object(graphs)) = entry.get("graphs") {
        for (key, g) in graphs {
            let gp = format!("{path}graphs.{key}.");
            let exec = get(g, &gp, "exec")?.as_u64().ok_or(format!("{gp}exec is not a handle"))?;
            let stream = get(g, &gp, "stream")?.as_u64().ok_or(format!("{gp}stream is not a handle"))?;
            handles.insert(bucket_of(key)?, LaunchHandle::Graph { exec, stream });
        }
    }
    if let Some(Value::Object(callables)) = entry.get("callables") {
        for (key, h) in callables {
            let h = h.as_str().ok_or(format!("{path}callables.{key} is not a handle"))?;
            handles.insert(bucket_of(key)?, LaunchHandle::Callable(h.to_string()));
        }
    }
    if let Some(b) = buckets.iter().find(|b| !handles.contains_key(b)) {
        return Err(format!("{path}: bucket {b} has neither a graph nor a callable"));
    }
    let captured_seqs = entry.get("captured_seqs").and_then(Value::as_u64).map(|n| n as usize);
    Ok(StageSpec { buckets, handles, captured_seqs })
}

/// `spec.sm_partition.stream`: the stream of the SM partition an engine runs on (null or absent: none).
fn partition_stream(spec: &Value) -> Result<Option<u64>, String> {
    match spec.get("sm_partition") {
        None | Some(Value::Null) => Ok(None),
        Some(p) => get(p, "spec.sm_partition.", "stream")?.as_u64().map(Some)
            .ok_or_else(|| "spec.sm_partition.stream is not a handle".to_string()),
    }
}

impl EngineSpec {
    pub fn from_json(spec: &Value) -> Result<EngineSpec, String> {
        let version = int(spec, "spec.", "version")?;
        if version != 2 {
            return Err(format!("spec.version {version}: this runtime drives engine spec version 2"));
        }
        let arenas = get(spec, "spec.", "arenas")?;
        let mut stages = BTreeMap::new();
        let entries = get(spec, "spec.", "stages")?.as_object().ok_or("spec.stages is not an object")?;
        for (name, entry) in entries {
            stages.insert(Stage::parse(name)?, stage_spec(name, entry)?);
        }
        let attention = get(spec, "spec.", "attention")?;
        let step_in = ArenaLayout::from_json(get(arenas, "arenas.", "step_in")?, "arenas.step_in.")?;
        let step_out = ArenaLayout::from_json(get(arenas, "arenas.", "step_out")?, "arenas.step_out.")?;
        if step_in.host_ptrs.len() != step_out.host_ptrs.len() {
            return Err("arenas: step_in and step_out have different numbers of host buffers".into());
        }
        let handover = match spec.get("handover") {
            None | Some(Value::Null) => None,
            Some(h) => Some(ArenaLayout::from_json(h, "spec.handover.")?),
        };
        let partition_stream = partition_stream(spec)?;
        Ok(EngineSpec {
            engine_id: int(spec, "spec.", "engine_id")?,
            device: string(spec, "spec.", "device")?,
            half: Half::parse(spec)?,
            handover,
            meta: ProgramMeta::from_json(get(spec, "spec.", "meta")?)?,
            limits: EngineLimits::from_json(get(spec, "spec.", "limits")?)?,
            step_in,
            step_out,
            stages,
            attention_backend: string(attention, "attention.", "backend")?,
            planner: string(attention, "attention.", "planner")?,
            page_size: int(attention, "attention.", "page_size")?,
            geometry: Geometry::from_json(attention)?,
            planners: Planners::from_json(attention)?,
            partition_stream,
        })
    }

    pub fn stage(&self, stage: Stage) -> Result<&StageSpec, String> {
        self.stages.get(&stage).ok_or_else(|| format!("spec.stages has no {}", stage.name()))
    }

    pub fn on_cuda(&self) -> bool {
        self.device.starts_with("cuda")
    }

    /// The CUDA device ordinal (`cuda` alone is device 0).
    pub fn cuda_ordinal(&self) -> Result<i32, String> {
        match self.device.strip_prefix("cuda") {
            Some("") => Ok(0),
            Some(rest) => rest.trim_start_matches(':').parse().map_err(|_| format!("spec.device {:?}", self.device)),
            None => Err(format!("spec.device {:?} is not a CUDA device", self.device)),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::partition_stream;

    #[test]
    fn an_sm_partition_names_the_stream_to_launch_on() {
        assert_eq!(partition_stream(&json!({})), Ok(None));
        assert_eq!(partition_stream(&json!({"sm_partition": null})), Ok(None));
        assert_eq!(partition_stream(&json!({"sm_partition": {"sms": 16, "stream": 4660}})), Ok(Some(4660)));
        assert!(partition_stream(&json!({"sm_partition": {"sms": 16}})).unwrap_err().contains("stream"));
        assert_eq!(partition_stream(&json!({"sm_partition": {"stream": "x"}})),
                   Err("spec.sm_partition.stream is not a handle".to_string()));
    }
}
