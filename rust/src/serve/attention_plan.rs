//! Captured FlashInfer launches planned in Rust, with FlashInfer's own planners compiled in
//! (`crate::planner`, rust/shim/planner.cu): no Python per step on a GPU.
//!
//! Per captured LM launch: the launch's CSR offsets are read from the step's `step_in` host buffer
//! (where the writer put them), the planner its graph was captured with plans it into a pinned
//! region of this step's parity, the plan is checked against the one captured (in graph mode it
//! depends only on the wrapper's fixed sizes, so a difference means the graph would run with a
//! stale plan), and the copies the launch needs are returned for the launch stream: the offsets
//! into the wrapper's buffers and the integer workspace to the device. The regions are
//! double-buffered by step parity, so a step can be planned while the previous one runs; a parity's
//! region is written again only after its step has been collected (as its `step_in` buffer is).
//!
//! FlashInfer's decode planner needs the occupancy of its decode kernel, which only the GPU knows:
//! it is found at start-up as the blocks per SM that reproduce every captured decode plan.

use super::super::driver::layout::{Field, HostBuf};
use super::super::driver::planners::{Geometry, PlannerKind, Planners, WrapperSpec};
use super::super::driver::{EngineSpec, Launch, Stage};
use crate::planner::{self, AttentionShape, Plan, PlannerDevice, PrefillOptions, Workspace};

/// Occupancies tried when reproducing the captured decode plans.
const MAX_BLOCKS_PER_SM: i32 = 64;

/// One asynchronous host-to-device copy a launch needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upload {
    pub dst: u64,
    pub src: u64,
    pub nbytes: usize,
}

/// The `step_in` fields planners read.
struct PlanFields {
    decode_indptr: Field,
    decode_last: Field,
    prefill_qo: Field,
    prefill_indptr: Field,
    prefill_last: Field,
}

/// Host memory the plans are written into: `2 parities x 2 LM stages` regions, each an integer
/// workspace followed by the launch's KV lengths. `base` is page-locked on a GPU.
pub struct HostRegions {
    pub base: *mut u8,
    pub len: usize,
}

// The regions belong to the scheduler thread that owns the launcher.
unsafe impl Send for HostRegions {}

pub struct LaunchPlanner {
    device: PlannerDevice,
    shape: AttentionShape,
    dtype_bytes: u32,
    planners: Planners,
    fields: PlanFields,
    regions: HostRegions,
    int_bytes: usize,
    region_bytes: usize,
}

fn wrappers(planners: &Planners) -> impl Iterator<Item = &WrapperSpec> + Clone {
    planners.decode.values().chain(planners.prefill.values())
}

/// The largest integer workspace of the spec's wrappers (what each region holds first).
fn int_workspace_bytes(planners: &Planners) -> usize {
    wrappers(planners).map(|w| w.int_workspace.nbytes as usize).max().unwrap_or(0)
}

/// Host bytes of one region: an integer workspace, then a launch's KV lengths.
pub fn region_bytes(planners: &Planners) -> usize {
    let rows = wrappers(planners).map(|w| w.rows).max().unwrap_or(0);
    align(int_workspace_bytes(planners)) + align(rows * 4)
}

pub fn regions_needed(planners: &Planners) -> usize {
    4 * region_bytes(planners)
}

fn align(n: usize) -> usize {
    (n + 255) / 256 * 256
}

fn read_i32(h: HostBuf, field: &Field, n: usize) -> Result<Vec<i32>, String> {
    if n > field.len() {
        return Err(format!("a plan of {n} entries exceeds its step_in field of {}", field.len()));
    }
    Ok((0..n).map(|i| h.get_i(field, i) as i32).collect())
}

impl LaunchPlanner {
    /// `regions`: at least `regions_needed(&spec.planners)` bytes. Errors when the spec's wrappers
    /// cannot be planned here (then the launches are planned through Python).
    pub fn new(spec: &EngineSpec, device: PlannerDevice, regions: HostRegions) -> Result<LaunchPlanner, String> {
        if !planner::available() {
            return Err("this build of vox_serve._rt has no FlashInfer planner".into());
        }
        if spec.attention_backend != "flashinfer" || spec.planners.is_empty() {
            return Err(format!("attention backend {:?} publishes no planners", spec.attention_backend));
        }
        if regions.len < regions_needed(&spec.planners) {
            return Err("the planner's host regions are too small".into());
        }
        let a = &spec.step_in;
        let fields = PlanFields {
            decode_indptr: a.field("decode_kv_indptr")?.clone(), decode_last: a.field("decode_last_page_len")?.clone(),
            prefill_qo: a.field("prefill_qo_indptr")?.clone(), prefill_indptr: a.field("prefill_kv_indptr")?.clone(),
            prefill_last: a.field("prefill_last_page_len")?.clone(),
        };
        let Geometry { num_q_heads, num_kv_heads, head_dim, dtype_bytes } = spec.geometry;
        let shape = AttentionShape { num_qo_heads: num_q_heads, num_kv_heads, head_dim_qk: head_dim,
                                     head_dim_vo: head_dim, page_size: spec.page_size as u32 };
        let mut planner = LaunchPlanner { device, shape, dtype_bytes, planners: spec.planners.clone(), fields, regions,
                                          int_bytes: int_workspace_bytes(&spec.planners),
                                          region_bytes: region_bytes(&spec.planners) };
        planner.calibrate()?;
        planner.check_captured()?;
        Ok(planner)
    }

    /// The decode kernel occupancy found (None: no CUDA-core decode wrapper needs it).
    pub fn decode_blocks_per_sm(&self) -> Option<i32> {
        let used = self.planners.decode.values().any(|w| w.kind == PlannerKind::Decode);
        if used { Some(self.device.decode_blocks_per_sm) } else { None }
    }

    /// The decode kernel's blocks per SM: the first occupancy that reproduces every captured CUDA-core
    /// decode plan (with `num_sm >= num_kv_heads` a split plan pins it down; plans that do not split
    /// do not depend on it).
    fn calibrate(&mut self) -> Result<(), String> {
        let mut device = self.device;
        let decode = self.planners.decode.values().filter(|w| w.kind == PlannerKind::Decode);
        for blocks in 1..=MAX_BLOCKS_PER_SM {
            device.decode_blocks_per_sm = blocks;
            if decode.clone().all(|w| self.probe(&device, w).map(|p| p.info == w.plan_info).unwrap_or(false)) {
                self.device = device;
                return Ok(());
            }
        }
        Err("no decode kernel occupancy reproduces the captured decode plans".into())
    }

    /// Every wrapper, planned for a launch of one-token sequences, gives the plan it was captured with.
    fn check_captured(&self) -> Result<(), String> {
        for w in wrappers(&self.planners) {
            let plan = self.probe(&self.device, w)?;
            if plan.info != w.plan_info {
                return Err(format!("the {:?} planner does not reproduce the captured plan of {} rows: {:?} vs {:?}",
                                   w.kind, w.rows, plan.info, w.plan_info));
            }
        }
        Ok(())
    }

    /// A plan of `w` for sequences of one page each: one token each, as many as its token rows hold (the
    /// rest empty, as a captured prefill's padded sequences are).
    fn probe(&self, device: &PlannerDevice, w: &WrapperSpec) -> Result<Plan, String> {
        let pages: Vec<i32> = (0..=w.rows as i32).collect();
        let tokens = w.max_total_num_rows.unwrap_or(w.rows) as i32;
        let qo: Vec<i32> = pages.iter().map(|&i| i.min(tokens)).collect();
        let kv_lens = vec![1; w.rows];
        self.run_planner(device, w, &qo, &pages, &kv_lens, 0)
    }

    /// Region `index` (of 4: parity x {prefill, decode}).
    fn region(&self, index: usize) -> *mut u8 {
        // SAFETY: 4 regions of region_bytes fit (checked in new()).
        unsafe { self.regions.base.add(index * self.region_bytes) }
    }

    /// Plan `w` into region `region` (written through the regions' raw pointer: no Rust reference aliases it).
    fn run_planner(&self, device: &PlannerDevice, w: &WrapperSpec, qo: &[i32], indptr: &[i32], kv_lens: &[i32],
                   region: usize) -> Result<Plan, String> {
        // SAFETY: the region lies inside the regions (checked in new()) and is int_bytes long.
        let host_int = unsafe { std::slice::from_raw_parts_mut(self.region(region), self.int_bytes) };
        let mut ws = Workspace { float_addr: w.float_workspace.ptr, float_bytes: w.float_workspace.nbytes,
                                 int_addr: w.int_workspace.ptr, host_int };
        let opts = PrefillOptions { cuda_graph: true, sizeof_dtype_o: self.dtype_bytes, ..PrefillOptions::default() };
        let total_rows = w.max_total_num_rows.unwrap_or(w.rows) as u32;
        match w.kind {
            PlannerKind::Decode => planner::decode(device, &self.shape, &mut ws, indptr, true),
            PlannerKind::DecodeTensorCores => {
                let one_each: Vec<i32> = (0..=w.rows as i32).collect();
                planner::prefill(device, &self.shape, &mut ws, &one_each, indptr, w.rows as u32, &opts)
            }
            PlannerKind::PrefillFa2 => planner::prefill(device, &self.shape, &mut ws, qo, indptr, total_rows, &opts),
            PlannerKind::PrefillSm90 => planner::prefill_sm90(device, &self.shape, &mut ws, qo, indptr, kv_lens,
                                                              total_rows, true, true),
        }
    }

    fn wrapper(&self, launch: &Launch) -> Result<&WrapperSpec, String> {
        let att = launch.attention.as_ref().ok_or("an LM launch without an attention plan")?;
        let (group, key) = match launch.stage {
            Stage::Decode => (&self.planners.decode, att.num_rows),
            Stage::Prefill => (&self.planners.prefill, att.graph_tokens.ok_or("an eager prefill has no captured plan")?),
            other => return Err(format!("{} launches are not planned", other.name())),
        };
        let w = group.get(&key).ok_or_else(|| format!("no captured planner for {}[{key}]", launch.stage.name()))?;
        if w.rows != att.num_rows {
            return Err(format!("{}[{key}] plans {} rows; its wrapper has {}", launch.stage.name(), att.num_rows, w.rows));
        }
        Ok(w)
    }

    /// Plan a captured LM launch of the step whose `step_in` host buffer is `h`: the copies to issue on the
    /// launch stream before its graph, in order.
    pub fn plan(&self, launch: &Launch, h: HostBuf, parity: usize) -> Result<Vec<Upload>, String> {
        let w = self.wrapper(launch)?;
        if !w.reads_plan {
            return Ok(Vec::new()); // its graph runs a planless kernel
        }
        let rows = w.rows;
        let decode = launch.stage == Stage::Decode;
        let f = &self.fields;
        let (indptr_f, last_f) = if decode { (&f.decode_indptr, &f.decode_last) } else { (&f.prefill_indptr, &f.prefill_last) };
        let indptr = read_i32(h, indptr_f, rows + 1)?;
        let last = read_i32(h, last_f, rows)?;
        let page = self.shape.page_size as i32;
        let kv_lens: Vec<i32> = (0..rows).map(|i| (indptr[i + 1] - indptr[i] - 1) * page + last[i]).collect();
        let qo = if decode { Vec::new() } else { read_i32(h, &self.fields.prefill_qo, rows + 1)? };
        let region = 2 * (parity % 2) + usize::from(decode);
        let base = self.region(region);
        let plan = self.run_planner(&self.device, w, &qo, &indptr, &kv_lens, region)?;
        if plan.info != w.plan_info {
            return Err(format!("the FlashInfer plan of {}[{rows} rows] differs from the one its graph was captured \
                                with ({:?} vs {:?})", launch.stage.name(), plan.info, w.plan_info));
        }
        let host = |f: &Field| h.base as u64 + f.offset as u64;
        let mut copies = vec![Upload { dst: w.kv_indptr.ptr, src: host(indptr_f), nbytes: (rows + 1) * 4 },
                              Upload { dst: w.last_page_len.ptr, src: host(last_f), nbytes: rows * 4 }];
        if !decode {
            if let Some(q) = w.qo_indptr {
                copies.push(Upload { dst: q.ptr, src: host(&self.fields.prefill_qo), nbytes: (rows + 1) * 4 });
            }
            if let Some(k) = w.kv_lens.filter(|k| k.nbytes as usize >= rows * 4) {
                // SAFETY: the KV lengths follow the integer workspace inside this region.
                let dst = unsafe { base.add(align(self.int_bytes)) } as *mut i32;
                for (i, &n) in kv_lens.iter().enumerate() {
                    // SAFETY: region_bytes leaves room for the largest wrapper's rows.
                    unsafe { dst.add(i).write_unaligned(n) };
                }
                copies.push(Upload { dst: k.ptr, src: dst as u64, nbytes: rows * 4 });
            }
        }
        copies.push(Upload { dst: w.int_workspace.ptr, src: base as u64, nbytes: plan.upload_bytes });
        Ok(copies)
    }
}

#[cfg(all(test, vox_planner))]
mod tests {
    //! On a hand-made spec with FlashInfer wrappers whose captured plans the shim itself made at a
    //! known decode occupancy (device addresses are only offsets to the planners, never read).
    use super::*;
    use crate::driver::planners::{Buffer, WrapperSpec};
    use crate::driver::writer_tests::spec;
    use crate::driver::AttentionPlan;

    const BLOCKS: i32 = 3;
    const WS: u64 = 1 << 20;

    fn device() -> PlannerDevice {
        PlannerDevice { num_sm: 132, cc_major: 9, cc_minor: 0, decode_blocks_per_sm: BLOCKS }
    }

    fn buf(ptr: u64, nbytes: u64) -> Buffer {
        Buffer { ptr, nbytes }
    }

    /// A wrapper of `rows` whose captured plan the shim makes for one-token sequences.
    fn wrapper(kind: PlannerKind, rows: usize, base: u64, total_rows: Option<usize>) -> WrapperSpec {
        let mut w = WrapperSpec { kind, rows, float_workspace: buf(0x1000_0000, 128 << 20), int_workspace: buf(base, WS),
                                  kv_indptr: buf(base + WS, 4 * 65), last_page_len: buf(base + WS + 512, 4 * 64),
                                  qo_indptr: Some(buf(base + WS + 1024, 4 * 65)),
                                  kv_lens: Some(buf(base + WS + 2048, 4 * 64)), max_total_num_rows: total_rows,
                                  plan_info: Vec::new(), reads_plan: true };
        let mut host = vec![0u8; WS as usize];
        let shape = AttentionShape { num_qo_heads: 24, num_kv_heads: 8, head_dim_qk: 128, head_dim_vo: 128, page_size: 4 };
        let mut ws = Workspace { float_addr: w.float_workspace.ptr, float_bytes: w.float_workspace.nbytes,
                                 int_addr: base, host_int: &mut host };
        let offsets: Vec<i32> = (0..=rows as i32).collect();
        let opts = PrefillOptions { cuda_graph: true, ..PrefillOptions::default() };
        w.plan_info = match kind {
            PlannerKind::Decode => planner::decode(&device(), &shape, &mut ws, &offsets, true),
            _ => planner::prefill(&device(), &shape, &mut ws, &offsets, &offsets,
                                  total_rows.unwrap_or(rows) as u32, &opts),
        }.unwrap().info;
        w
    }

    fn flashinfer_spec() -> EngineSpec {
        let mut s = spec(false);
        s.attention_backend = "flashinfer".into();
        s.geometry = Geometry { num_q_heads: 24, num_kv_heads: 8, head_dim: 128, dtype_bytes: 2 };
        for (i, rows) in [1usize, 2, 4].into_iter().enumerate() {
            s.planners.decode.insert(rows, wrapper(PlannerKind::Decode, rows, 0x2000_0000 * (i as u64 + 1), None));
        }
        s.planners.prefill.insert(16, wrapper(PlannerKind::PrefillFa2, 4, 0x9000_0000, Some(16)));
        s
    }

    fn planner_of(s: &EngineSpec, memory: &mut Vec<u8>) -> Result<LaunchPlanner, String> {
        memory.resize(regions_needed(&s.planners), 0);
        let dev = PlannerDevice { decode_blocks_per_sm: 1, ..device() };
        LaunchPlanner::new(s, dev, HostRegions { base: memory.as_mut_ptr(), len: memory.len() })
    }

    #[test]
    fn finds_the_decode_occupancy_the_captured_plans_were_made_with() {
        let (s, mut memory) = (flashinfer_spec(), Vec::new());
        assert_eq!(planner_of(&s, &mut memory).unwrap().decode_blocks_per_sm(), Some(BLOCKS));
    }

    #[test]
    fn refuses_a_captured_plan_it_cannot_reproduce() {
        let (mut s, mut memory) = (flashinfer_spec(), Vec::new());
        s.planners.prefill.get_mut(&16).unwrap().plan_info[0] += 1;
        let e = planner_of(&s, &mut memory).err().unwrap();
        assert!(e.contains("does not reproduce the captured plan"), "{e}");
    }

    #[test]
    fn a_decode_launch_copies_its_offsets_and_the_planned_workspace() {
        let (s, mut memory) = (flashinfer_spec(), Vec::new());
        let p = planner_of(&s, &mut memory).unwrap();
        let mut step = vec![0u8; s.step_in.nbytes];
        let h = HostBuf { base: step.as_mut_ptr() };
        let (indptr, last): ([i32; 5], [i32; 4]) = ([0, 3, 4, 9, 10], [2, 4, 1, 1]);
        let f = (s.step_in.field("decode_kv_indptr").unwrap(), s.step_in.field("decode_last_page_len").unwrap());
        indptr.iter().enumerate().for_each(|(i, &v)| h.set_i(f.0, i, i64::from(v)));
        last.iter().enumerate().for_each(|(i, &v)| h.set_i(f.1, i, i64::from(v)));
        let attention = AttentionPlan { num_seqs: 4, qo_lens: vec![1; 4], kv_lens: vec![10, 4, 17, 1], num_rows: 4,
                                        graph_tokens: None, decode: true };
        let launch = Launch { stage: Stage::Decode, bucket: 4, num_seqs: None, attention: Some(attention), rows: vec![] };
        let copies = p.plan(&launch, h, 1).unwrap();
        let w = &s.planners.decode[&4];
        let base = h.base as u64;
        assert_eq!(copies[0], Upload { dst: w.kv_indptr.ptr, src: base + f.0.offset as u64, nbytes: 20 });
        assert_eq!(copies[1], Upload { dst: w.last_page_len.ptr, src: base + f.1.offset as u64, nbytes: 16 });
        // the workspace: what the shim plans for the same offsets, from parity 1's decode region
        let mut want = vec![0u8; WS as usize];
        let shape = AttentionShape { num_qo_heads: 24, num_kv_heads: 8, head_dim_qk: 128, head_dim_vo: 128, page_size: 4 };
        let mut ws = Workspace { float_addr: w.float_workspace.ptr, float_bytes: w.float_workspace.nbytes,
                                 int_addr: w.int_workspace.ptr, host_int: &mut want };
        let plan = planner::decode(&device(), &shape, &mut ws, &indptr, true).unwrap();
        let last_copy = copies.last().unwrap();
        assert_eq!((last_copy.dst, last_copy.nbytes), (w.int_workspace.ptr, plan.upload_bytes));
        let region = 3 * region_bytes(&s.planners);
        assert_eq!(last_copy.src, memory.as_ptr() as u64 + region as u64);
        assert_eq!(&memory[region..region + plan.upload_bytes], &want[..plan.upload_bytes]);
    }

    #[test]
    fn a_bucket_whose_graph_reads_no_plan_is_not_planned() {
        let (mut s, mut memory) = (flashinfer_spec(), Vec::new());
        s.planners.decode.get_mut(&2).unwrap().reads_plan = false; // a planless Triton decode was captured
        let p = planner_of(&s, &mut memory).unwrap();
        let mut step = vec![0u8; s.step_in.nbytes];
        let h = HostBuf { base: step.as_mut_ptr() };
        let launch = |rows: usize| {
            let attention = AttentionPlan { num_seqs: rows, qo_lens: vec![1; rows], kv_lens: vec![1; rows],
                                            num_rows: rows, graph_tokens: None, decode: true };
            Launch { stage: Stage::Decode, bucket: rows, num_seqs: None, attention: Some(attention), rows: vec![] }
        };
        let f = (s.step_in.field("decode_kv_indptr").unwrap(), s.step_in.field("decode_last_page_len").unwrap());
        for i in 0..=4 {
            h.set_i(f.0, i, i as i64);
        }
        (0..4).for_each(|i| h.set_i(f.1, i, 1));
        assert!(p.plan(&launch(2), h, 0).unwrap().is_empty());
        assert!(!p.plan(&launch(4), h, 0).unwrap().is_empty()); // the other buckets still are
        let e = p.plan(&launch(3), h, 0).err().unwrap(); // and a bucket without a wrapper is still an error
        assert!(e.contains("no captured planner for decode[3]"), "{e}");
    }

    #[test]
    fn a_launch_without_its_captured_wrapper_is_an_error() {
        let (s, mut memory) = (flashinfer_spec(), Vec::new());
        let p = planner_of(&s, &mut memory).unwrap();
        let mut step = vec![0u8; s.step_in.nbytes];
        let attention = AttentionPlan { num_seqs: 3, qo_lens: vec![1; 3], kv_lens: vec![1; 3], num_rows: 3,
                                        graph_tokens: None, decode: true };
        let launch = Launch { stage: Stage::Decode, bucket: 3, num_seqs: None, attention: Some(attention), rows: vec![] };
        let e = p.plan(&launch, HostBuf { base: step.as_mut_ptr() }, 0).err().unwrap();
        assert!(e.contains("no captured planner for decode[3]"), "{e}");
    }
}
