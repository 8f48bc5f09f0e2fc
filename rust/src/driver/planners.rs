//! `spec.attention.planners` (docs/engine-contract.md, "Attention"): the FlashInfer wrapper behind
//! each captured LM launch, as the Rust runtime needs it to plan that launch itself: which planner
//! its graph was captured with, the addresses of the buffers the captured kernels read, its fixed
//! sizes, and the plan info it was captured with. Errors name the field.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::sched::config::{get, string};

/// Which of FlashInfer's planners serves a wrapper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlannerKind {
    /// The CUDA-core decode planner (`DecodePlan`).
    Decode,
    /// Tensor-core decode: FA2's prefill planner with one query row per sequence.
    DecodeTensorCores,
    /// The prefill wrapper's FA2 backend (`PrefillPlan`).
    PrefillFa2,
    /// The prefill wrapper's FA3 backend on Hopper (`PrefillSM90Plan`).
    PrefillSm90,
}

/// A device buffer: its address and size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffer {
    pub ptr: u64,
    pub nbytes: u64,
}

#[derive(Debug, Clone)]
pub struct WrapperSpec {
    pub kind: PlannerKind,
    /// The wrapper's fixed sequence count (a graph-mode wrapper serves one).
    pub rows: usize,
    pub float_workspace: Buffer,
    pub int_workspace: Buffer,
    pub kv_indptr: Buffer,
    pub last_page_len: Buffer,
    /// Prefill only: the query offsets and the KV lengths the captured kernels read.
    pub qo_indptr: Option<Buffer>,
    pub kv_lens: Option<Buffer>,
    /// Prefill only: the token rows its first plan fixed.
    pub max_total_num_rows: Option<usize>,
    /// The plan its graph was captured with (FlashInfer's plan info vector).
    pub plan_info: Vec<i64>,
    /// Whether its graph reads the plan (`reads_plan`, true when absent): a decode bucket that captured the
    /// planless Triton kernel does not, so its launches are not planned.
    pub reads_plan: bool,
}

/// The attention geometry planners need.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Geometry {
    pub num_q_heads: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    /// Bytes per element of the attention output (FlashInfer needs a 16-bit type: 2).
    pub dtype_bytes: u32,
}

impl Geometry {
    pub fn from_json(attention: &Value) -> Result<Geometry, String> {
        let dim = |name: &str| get(attention, "attention.", name)?.as_u64().map(|v| v as u32)
            .ok_or(format!("attention.{name} is not a size"));
        let dtype_bytes = match string(attention, "attention.", "dtype")?.as_str() {
            "float32" => 4,
            "float64" => 8,
            _ => 2,
        };
        Ok(Geometry { num_q_heads: dim("num_q_heads")?, num_kv_heads: dim("num_kv_heads")?, head_dim: dim("head_dim")?,
                      dtype_bytes })
    }
}

/// Every captured wrapper: decode by batch bucket, prefill by token bucket.
#[derive(Debug, Clone, Default)]
pub struct Planners {
    pub decode: BTreeMap<usize, WrapperSpec>,
    pub prefill: BTreeMap<usize, WrapperSpec>,
}

impl Planners {
    pub fn is_empty(&self) -> bool {
        self.decode.is_empty() && self.prefill.is_empty()
    }

    /// `attention.planners` (absent or `{}` for a backend without host planners).
    pub fn from_json(attention: &Value) -> Result<Planners, String> {
        let mut planners = Planners::default();
        let all = match attention.get("planners").and_then(Value::as_object) {
            Some(all) => all,
            None => return Ok(planners),
        };
        for (group, out) in [("decode", &mut planners.decode), ("prefill", &mut planners.prefill)] {
            for (key, entry) in all.get(group).and_then(Value::as_object).into_iter().flatten() {
                let path = format!("attention.planners.{group}.{key}.");
                let bucket = key.parse::<usize>().map_err(|_| format!("{path}: {key:?} is not a size"))?;
                out.insert(bucket, wrapper(entry, &path)?);
            }
        }
        Ok(planners)
    }
}

fn buffer(entry: &Value, path: &str, name: &str) -> Result<Buffer, String> {
    let b = get(entry, path, name)?;
    let field = |f: &str| b.get(f).and_then(Value::as_u64).ok_or(format!("{path}{name}.{f} is not a number"));
    Ok(Buffer { ptr: field("ptr")?, nbytes: field("nbytes")? })
}

fn optional_buffer(entry: &Value, path: &str, name: &str) -> Result<Option<Buffer>, String> {
    if entry.get(name).is_none() {
        return Ok(None);
    }
    buffer(entry, path, name).map(Some)
}

fn kind(entry: &Value, path: &str) -> Result<PlannerKind, String> {
    let planner = string(entry, path, "planner")?;
    let backend = entry.get("backend").and_then(Value::as_str).unwrap_or("");
    Ok(match (planner.as_str(), backend) {
        ("decode", _) => PlannerKind::Decode,
        ("decode_tensor_cores", _) => PlannerKind::DecodeTensorCores,
        ("prefill", "fa2") => PlannerKind::PrefillFa2,
        ("prefill", "fa3") => PlannerKind::PrefillSm90,
        (p, b) => return Err(format!("{path}: planner {p:?} with backend {b:?} is not one the Rust planner has")),
    })
}

fn wrapper(entry: &Value, path: &str) -> Result<WrapperSpec, String> {
    let size = |name: &str| entry.get(name).and_then(Value::as_u64).map(|v| v as usize);
    let plan_info = get(entry, path, "plan_info")?.as_array()
        .ok_or(format!("{path}plan_info is not a list (the wrapper was never planned)"))?
        .iter().map(|v| v.as_i64().ok_or(format!("{path}plan_info holds a non-integer")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(WrapperSpec {
        kind: kind(entry, path)?,
        rows: size("rows").ok_or(format!("{path}rows is not a size"))?,
        float_workspace: buffer(entry, path, "float_workspace_buffer")?,
        int_workspace: buffer(entry, path, "int_workspace_buffer")?,
        kv_indptr: buffer(entry, path, "paged_kv_indptr_buf")?,
        last_page_len: buffer(entry, path, "paged_kv_last_page_len_buf")?,
        qo_indptr: optional_buffer(entry, path, "qo_indptr_buf")?,
        kv_lens: optional_buffer(entry, path, "kv_lens_buffer")?,
        max_total_num_rows: size("max_total_num_rows"),
        plan_info,
        reads_plan: match entry.get("reads_plan") {
            None => true,
            Some(v) => v.as_bool().ok_or(format!("{path}reads_plan is not a boolean"))?,
        },
    })
}
