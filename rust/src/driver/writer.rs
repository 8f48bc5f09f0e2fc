//! The host half of a step (vox_serve/rt/step_writer.py): a plan written into a `step_in` host
//! buffer, every launch's rows padded to its bucket with the spec's padding conventions; which
//! launches follow; how many bytes go up and come back; and the outputs read into a StepResult.

use super::layout::{ArenaLayout, Field, HostBuf};
use super::spec::{EngineSpec, Half, Stage, StageSpec};
use crate::sched::plan::{CodecLaunch, LmLaunch, SlotInit, StepPlan, StepResult};
use crate::sched::types::{Conditioning, NO_SLOT};

const NO_SLOT_I: i64 = NO_SLOT as i64;
/// A request's codec prefix among its conditioning (core/meta.py `CODEC_PREFIX`): frames of codes that
/// prime its codec slot at admission (the `codec_prime` stage), never a declared slot field.
pub const CODEC_PREFIX: &str = "codec_prefix";

/// What a launch's attention planner is told (rt/attention/base.py `AttentionPlan`).
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionPlan {
    pub num_seqs: usize,
    pub qo_lens: Vec<i64>,
    pub kv_lens: Vec<i64>,
    pub num_rows: usize,
    pub graph_tokens: Option<usize>,
    pub decode: bool,
}

/// One stage launch of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub stage: Stage,
    pub bucket: usize,
    /// Prefill: the sequences of the launch (max_prefill_seqs when captured).
    pub num_seqs: Option<usize>,
    pub attention: Option<AttentionPlan>,
    /// Codec: the plan's codec rows this launch covers, in output order.
    pub rows: Vec<usize>,
}

impl Launch {
    fn bare(stage: Stage, bucket: usize) -> Launch {
        Launch { stage, bucket, num_seqs: None, attention: None, rows: Vec::new() }
    }
}

/// The `step_in` fields a step writes, looked up once.
struct InFields {
    admit_slot: Field,
    admit_sampling: Vec<(&'static str, Field)>,
    admit_slot_fields: Vec<(String, Field, Field)>,
    page_slot: Field,
    page_index: Field,
    page_id: Field,
    decode: [Field; 5],
    codec: Vec<[Field; 3]>,
    prefill: [Field; 9],
    prefill_vec: Option<(Field, Field)>,
    /// `codec_prime_codes` `[max_admits, frames, codes_per_frame]`, `codec_prime_len` (programs that
    /// declare `codec_prefix_frames`).
    codec_prime: Option<(Field, Field)>,
}

const SAMPLING: [&str; 9] = ["prompt_len", "temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                             "repetition_window", "seed", "allow_stop"];

fn sampling_value(a: &SlotInit, name: &str) -> f64 {
    match name {
        "prompt_len" => a.prompt_len as f64,
        "temperature" => a.temperature,
        "top_k" => a.top_k as f64,
        "top_p" => a.top_p,
        "min_p" => a.min_p,
        "repetition_penalty" => a.repetition_penalty,
        "repetition_window" => a.repetition_window as f64,
        "seed" => a.seed as f64,
        _ => f64::from(u8::from(a.allow_stop)),
    }
}

fn fields<const N: usize>(a: &ArenaLayout, names: [&str; N]) -> Result<[Field; N], String> {
    let v = names.iter().map(|n| a.field(n).cloned()).collect::<Result<Vec<_>, _>>()?;
    Ok(v.try_into().expect("N names give N fields"))
}

pub struct StepWriter {
    f: InFields,
    ends: Ends,
    /// The LM stages' buckets (a disaggregated engine's codec half has none).
    decode_buckets: Option<StageSpec>,
    codec_buckets: Vec<(Stage, StageSpec)>,
    prefill_buckets: Option<StageSpec>,
    /// The codec_prime stage's buckets, where the program declares it and the engine runs it (not an LM half).
    prime_buckets: Option<StageSpec>,
    max_batch: usize,
    max_codec_batch: usize,
    max_prefill_seqs: usize,
    max_prefill_tokens: i64,
    page_size: i64,
    has_first_chunks: bool,
    captured_prefill: bool,
    columns: usize,
}

struct Ends {
    pages: usize,
    decode: usize,
    codec: Vec<usize>,
    prefill: usize,
    codec_prime: usize,
}

impl StepWriter {
    pub fn new(spec: &EngineSpec) -> Result<StepWriter, String> {
        let a = &spec.step_in;
        let admit_sampling = SAMPLING.iter().map(|&n| Ok((n, a.field(&format!("admit_{n}"))?.clone())))
            .collect::<Result<Vec<_>, String>>()?;
        let admit_slot_fields = spec.meta.slot_fields.iter().map(|sf| {
            Ok((sf.name.clone(), a.field(&format!("admit_{}", sf.name))?.clone(),
                a.field(&format!("admit_{}_len", sf.name))?.clone()))
        }).collect::<Result<Vec<_>, String>>()?;
        let has_first_chunks = spec.limits.has_first_chunks();
        let codec_stages: Vec<Stage> = if has_first_chunks { vec![Stage::CodecFirst, Stage::Codec] }
                                       else { vec![Stage::Codec] };
        let mut codec = Vec::new();
        let mut codec_ends = Vec::new();
        let mut codec_buckets = Vec::new();
        for &stage in &codec_stages {
            let p = stage.name();
            codec.push(fields(a, [&format!("{p}_slot") as &str, &format!("{p}_first_frame"),
                                  &format!("{p}_window_end")])?);
            codec_ends.push(a.end_of(&format!("{p}_window_end"))?);
            codec_buckets.push((stage, spec.stage(stage)?.clone()));
        }
        let prefill_vec = if a.has("prefill_vec_token") {
            Some((a.field("prefill_vec_token")?.clone(), a.field("prefill_vec")?.clone()))
        } else {
            None
        };
        let codec_prime = if a.has("codec_prime_codes") {
            Some((a.field("codec_prime_codes")?.clone(), a.field("codec_prime_len")?.clone()))
        } else {
            None
        };
        let prime_buckets = if codec_prime.is_some() { optional_stage(spec, Stage::CodecPrime)? } else { None };
        let codec_prime_end = if codec_prime.is_some() { a.end_of("codec_prime_len")? } else { 0 };
        let last_prefill = if prefill_vec.is_some() { "prefill_vec" } else { "prefill_tok_slot" };
        let prefill_spec = optional_stage(spec, Stage::Prefill)?;
        let f = InFields {
            admit_slot: a.field("admit_slot")?.clone(),
            admit_sampling,
            admit_slot_fields,
            page_slot: a.field("page_slot")?.clone(),
            page_index: a.field("page_index")?.clone(),
            page_id: a.field("page_id")?.clone(),
            decode: fields(a, ["decode_slot", "decode_pos", "decode_ids", "decode_kv_indptr", "decode_last_page_len"])?,
            codec,
            prefill: fields(a, ["prefill_slot", "prefill_kv_len", "prefill_sample", "prefill_qo_indptr",
                                "prefill_kv_indptr", "prefill_last_page_len", "prefill_ids", "prefill_pos",
                                "prefill_tok_slot"])?,
            prefill_vec,
            codec_prime,
        };
        Ok(StepWriter {
            ends: Ends { pages: a.end_of("page_id")?, decode: a.end_of("decode_last_page_len")?, codec: codec_ends,
                         prefill: a.end_of(last_prefill)?, codec_prime: codec_prime_end },
            f,
            decode_buckets: optional_stage(spec, Stage::Decode)?,
            codec_buckets,
            captured_prefill: matches!(&prefill_spec, Some(p) if p.captured_seqs.is_some()),
            prime_buckets,
            prefill_buckets: prefill_spec,
            max_batch: spec.limits.max_batch,
            max_codec_batch: spec.limits.max_codec_batch,
            max_prefill_seqs: spec.limits.max_prefill_seqs,
            max_prefill_tokens: spec.limits.max_prefill_tokens,
            page_size: spec.page_size,
            has_first_chunks,
            columns: spec.meta.input_columns,
        })
    }

    /// Fill host buffer `h` for `plan`; returns its launches in order and the bytes to upload.
    pub fn write(&self, h: HostBuf, plan: &StepPlan) -> Result<(Vec<Launch>, usize), String> {
        let mut launches = Vec::with_capacity(6);
        let (mut end, mut primed_end) = (0, 0);
        if !plan.admits.is_empty() || !plan.pages.is_empty() {
            // The admissions that carry a codec prefix come first (a stable sort, as the Python writer's),
            // so a codec_prime launch of bucket b primes admit rows 0..b-1.
            let mut admits: Vec<&SlotInit> = plan.admits.iter().collect();
            admits.sort_by_key(|a| codec_prefix(a).is_none());
            self.admits(h, &admits)?;
            self.pages(h, plan)?;
            launches.push(Launch::bare(Stage::Prologue, 1));
            end = self.ends.pages;
            let num_primed = admits.iter().take_while(|a| codec_prefix(a).is_some()).count();
            if num_primed > 0 {
                launches.push(self.codec_prefixes(h, &admits[..num_primed])?);
                primed_end = self.ends.codec_prime;
            }
        }
        if !plan.codec.is_empty() {
            for (i, launch) in self.codec(h, &plan.codec)? {
                launches.push(launch);
                end = end.max(self.ends.codec[i]);
            }
        }
        if !plan.prefill.is_empty() {
            launches.push(self.prefill(h, &plan.prefill)?);
            end = end.max(self.ends.prefill);
        }
        if !plan.decode.is_empty() {
            launches.push(self.decode(h, &plan.decode)?);
            end = end.max(self.ends.decode);
        }
        Ok((launches, end.max(primed_end)))
    }

    fn admits(&self, h: HostBuf, admits: &[&SlotInit]) -> Result<(), String> {
        let (n, cap) = (admits.len(), self.f.admit_slot.len());
        if n > cap {
            return Err(format!("{n} admissions in one step; the engine takes {cap}"));
        }
        let slots: Vec<i32> = admits.iter().map(|a| a.slot as i32).collect();
        h.put_i32(&self.f.admit_slot, &slots, cap, NO_SLOT_I);
        for (name, field) in &self.f.admit_sampling {
            for (i, a) in admits.iter().enumerate() {
                h.set(field, i, sampling_value(a, name));
            }
        }
        for (name, values, lengths) in &self.f.admit_slot_fields {
            let width = values.row_len();
            for (i, a) in admits.iter().enumerate() {
                let length = match a.conditioning.iter().find(|c| &c.name == name) {
                    None => 0,
                    Some(c) => {
                        let declared = values.shape.get(1).copied().unwrap_or(1);
                        if c.rows > declared || c.values.len() > width {
                            return Err(format!("{name} of {} exceeds its declared {declared}", c.rows));
                        }
                        for (j, &v) in c.values.iter().enumerate() {
                            h.set(values, i * width + j, f64::from(v));
                        }
                        c.rows
                    }
                };
                h.set_i(lengths, i, length as i64);
            }
        }
        Ok(())
    }

    /// The codec prefixes of admit rows 0..n-1 and the codec_prime launch; rows past n get length 0
    /// (no-ops; the rest of a row's frames is never read).
    fn codec_prefixes(&self, h: HostBuf, primed: &[&SlotInit]) -> Result<Launch, String> {
        let ((codes, lengths), buckets) = match (&self.f.codec_prime, &self.prime_buckets) {
            (Some(fields), Some(buckets)) => (fields, buckets),
            _ => return Err(format!("a request carries {CODEC_PREFIX}, which this program does not declare \
                                     (meta.layout.codec_prefix_frames)")),
        };
        let (frames, row_len) = (codes.shape.get(1).copied().unwrap_or(0), codes.row_len());
        for (i, a) in primed.iter().enumerate() {
            let prefix = codec_prefix(a).expect("primed admissions carry a codec prefix");
            if prefix.rows > frames {
                return Err(format!("{CODEC_PREFIX} of {} frames exceeds the declared {frames}", prefix.rows));
            }
            if prefix.values.len() * frames != prefix.rows * row_len {
                return Err(format!("{CODEC_PREFIX}: {} codes do not make {} whole frames", prefix.values.len(),
                                   prefix.rows));
            }
            for (j, &code) in prefix.values.iter().enumerate() {
                h.set_i(codes, i * row_len + j, code as i64);
            }
            h.set_i(lengths, i, prefix.rows as i64);
        }
        for i in primed.len()..lengths.len() {
            h.set_i(lengths, i, 0);
        }
        Ok(Launch::bare(Stage::CodecPrime, buckets.bucket(primed.len())?))
    }

    fn pages(&self, h: HostBuf, plan: &StepPlan) -> Result<(), String> {
        let (p, cap) = (&plan.pages, self.f.page_slot.len());
        if p.len() > cap {
            return Err(format!("{} page-table updates in one step; the engine takes {cap}", p.len()));
        }
        h.put_i32(&self.f.page_slot, &p.slot, cap, NO_SLOT_I);
        h.put_i32(&self.f.page_index, &p.index, p.len(), 0);
        h.put_i32(&self.f.page_id, &p.page, p.len(), 0);
        Ok(())
    }

    fn codec(&self, h: HostBuf, codec: &CodecLaunch) -> Result<Vec<(usize, Launch)>, String> {
        if codec.len() > self.max_codec_batch {
            return Err(format!("{} codec rows exceed --max-codec-batch {}", codec.len(), self.max_codec_batch));
        }
        let mut out = Vec::new();
        for (i, (stage, spec)) in self.codec_buckets.iter().enumerate() {
            let first = *stage == Stage::CodecFirst;
            let rows: Vec<usize> = (0..codec.len())
                .filter(|&r| (self.has_first_chunks && codec.chunk_index[r] == 0) == first).collect();
            if rows.is_empty() {
                continue;
            }
            let bucket = spec.bucket(rows.len())?;
            let [slot, first_frame, window_end] = &self.f.codec[i];
            let pick = |col: &[i32]| -> Vec<i32> { rows.iter().map(|&r| col[r]).collect() };
            h.put_i32(slot, &pick(&codec.slot), bucket, NO_SLOT_I);
            h.put_i32(first_frame, &pick(&codec.first_frame), bucket, 0);
            h.put_i32(window_end, &pick(&codec.window_end), bucket, 1);
            out.push((i, Launch { rows, ..Launch::bare(*stage, bucket) }));
        }
        Ok(out)
    }

    /// `indptr [R + 1]`, `last [R]` of rows with `kv_lens` (rt/attention/base.py `paged_kv_offsets`).
    fn paged_kv_offsets(&self, h: HostBuf, kv_lens: &[i64], indptr: &Field, last: &Field) {
        let mut total = 0i64;
        h.set_i(indptr, 0, 0);
        for (i, &kv) in kv_lens.iter().enumerate() {
            let used = (kv + self.page_size - 1) / self.page_size;
            total += used;
            h.set_i(indptr, i + 1, total);
            h.set_i(last, i, kv - (used - 1) * self.page_size);
        }
    }

    fn decode(&self, h: HostBuf, rows: &LmLaunch) -> Result<Launch, String> {
        let n = rows.len();
        if n > self.max_batch || rows.num_tokens.iter().any(|&t| t != 1) {
            return Err("a decode launch has one token per row and at most max_batch rows".into());
        }
        let bucket = launched(&self.decode_buckets, Stage::Decode)?.bucket(n)?;
        let [slot, pos, ids, indptr, last] = &self.f.decode;
        h.put_i32(slot, &rows.slot, bucket, NO_SLOT_I);
        h.put_i32(pos, &rows.start, bucket, 0);
        h.put_i32(ids, &rows.input_ids, bucket * self.columns, 0);
        let kv_len: Vec<i64> = (0..bucket).map(|i| if i < n { rows.kv_len(i) } else { 1 }).collect();
        self.paged_kv_offsets(h, &kv_len, indptr, last);
        let attention = AttentionPlan { num_seqs: bucket, qo_lens: vec![1; bucket], kv_lens: kv_len, num_rows: bucket,
                                        graph_tokens: None, decode: true };
        Ok(Launch { attention: Some(attention), ..Launch::bare(Stage::Decode, bucket) })
    }

    fn prefill(&self, h: HostBuf, rows: &LmLaunch) -> Result<Launch, String> {
        let (n, t) = (rows.len(), rows.total_tokens());
        if n > self.max_prefill_seqs || t > self.max_prefill_tokens {
            return Err(format!("prefill of {n} seqs / {t} tokens exceeds the arena"));
        }
        let bucket = launched(&self.prefill_buckets, Stage::Prefill)?.bucket(t as usize)?;
        let seqs = if self.captured_prefill { self.max_prefill_seqs } else { n };
        let kv_len: Vec<i64> = (0..seqs).map(|i| if i < n { rows.kv_len(i) } else { 1 }).collect();
        let [slot, kv, sample, qo, indptr, last, ids, pos, tok_slot] = &self.f.prefill;
        h.put_i32(slot, &rows.slot, seqs, NO_SLOT_I);
        for (i, &k) in kv_len.iter().enumerate() {
            h.set_i(kv, i, k);
        }
        for i in 0..seqs {
            h.set_i(sample, i, i64::from(i < n && rows.sample[i]));
        }
        let mut total = 0i64;
        h.set_i(qo, 0, 0);
        for i in 0..seqs {
            total += if i < n { i64::from(rows.num_tokens[i]) } else { 0 };
            h.set_i(qo, i + 1, total);
        }
        self.paged_kv_offsets(h, &kv_len, indptr, last);
        let mut token = 0;
        for i in 0..n {
            for j in 0..rows.num_tokens[i] {
                h.set_i(pos, token, i64::from(rows.start[i] + j));
                h.set_i(tok_slot, token, i64::from(rows.slot[i]));
                token += 1;
            }
        }
        for k in token..bucket {
            h.set_i(pos, k, 0);
            h.set_i(tok_slot, k, NO_SLOT_I);
        }
        h.put_i32(ids, &rows.input_ids, bucket * self.columns, 0);
        match &self.f.prefill_vec {
            Some((vec_token, vec)) => {
                let (e, cap) = (rows.vector_token.len(), vec_token.len());
                if e > cap {
                    return Err(format!("{e} prompt vectors in one prefill; the arena holds {cap}"));
                }
                h.put_i32(vec_token, &rows.vector_token, cap, -1);
                for (k, &v) in rows.vectors.iter().enumerate() {
                    h.set(vec, k, f64::from(v));
                }
            }
            None if !rows.vector_token.is_empty() => {
                return Err("rows carry prompt vectors, which this program does not declare".into());
            }
            None => {}
        }
        let attention = AttentionPlan {
            num_seqs: n, qo_lens: rows.num_tokens.iter().map(|&x| i64::from(x)).collect(),
            kv_lens: kv_len[..n].to_vec(), num_rows: seqs,
            graph_tokens: if self.captured_prefill { Some(bucket) } else { None }, decode: false,
        };
        Ok(Launch { num_seqs: Some(seqs), attention: Some(attention), ..Launch::bare(Stage::Prefill, bucket) })
    }
}

/// The buckets of `stage`, which a whole engine must have and a disaggregated half may not run
/// (`core/stages.py` `EngineHalf.runs`).
fn optional_stage(spec: &EngineSpec, stage: Stage) -> Result<Option<StageSpec>, String> {
    match (spec.stages.get(&stage), spec.half) {
        (Some(s), _) => Ok(Some(s.clone())),
        (None, Half::Whole) => Err(format!("spec.stages has no {}", stage.name())),
        (None, _) => Ok(None),
    }
}

/// The buckets of a stage a plan launches; an error where this engine (a half) does not run it.
fn launched(buckets: &Option<StageSpec>, stage: Stage) -> Result<&StageSpec, String> {
    buckets.as_ref().ok_or_else(|| format!("a {} launch on an engine half that does not run it", stage.name()))
}

/// An admission's codec prefix, when it carries one of at least a frame.
fn codec_prefix(a: &SlotInit) -> Option<&Conditioning> {
    a.conditioning.iter().find(|c| c.name == CODEC_PREFIX && c.rows > 0)
}

/// Reads a step's outputs from a `step_out` host buffer (rt/step_writer.py `StepReader`).
pub struct StepReader {
    prefill_kind: Field,
    decode_kind: Field,
    pcm: Vec<(Stage, Field, usize)>,
    samples_per_frame: usize,
    /// False for a disaggregated engine's LM half: its codec stages hand windows over and make no PCM.
    reads_pcm: bool,
    /// Where the out kinds end and the PCM fields begin, when every PCM field lies after the out kinds (the
    /// layout `step_out` has): a step's PCM can then be copied back on its own (`pcm_bytes`).
    pub kinds_end: Option<usize>,
}

impl StepReader {
    pub fn new(spec: &EngineSpec) -> Result<StepReader, String> {
        let o = &spec.step_out;
        let spf = spec.meta.samples_per_frame as usize;
        let mut pcm = vec![(Stage::Codec, o.field("codec_pcm")?.clone(), spec.limits.frames_per_chunk as usize * spf)];
        if spec.limits.has_first_chunks() {
            pcm.push((Stage::CodecFirst, o.field("codec_first_pcm")?.clone(), spec.limits.first_frames() as usize * spf));
        }
        Ok(StepReader { prefill_kind: o.field("prefill_kind")?.clone(), decode_kind: o.field("decode_kind")?.clone(),
                        pcm, samples_per_frame: spf, reads_pcm: spec.half != Half::Lm, kinds_end: None }
            .with_kinds_end())
    }

    fn with_kinds_end(mut self) -> StepReader {
        let pcm_start = self.pcm.iter().map(|(_, f, _)| f.offset).min();
        self.kinds_end = pcm_start.filter(|&p| self.prefill_kind.end() <= p && self.decode_kind.end() <= p);
        self
    }

    fn pcm_field(&self, stage: Stage) -> &(Stage, Field, usize) {
        self.pcm.iter().find(|(s, _, _)| *s == stage).expect("a codec stage's PCM field")
    }

    /// Bytes of `step_out` to copy back: the out kinds come first, then each codec launch's rows.
    pub fn download_bytes(&self, launches: &[Launch]) -> usize {
        let mut end = self.pcm[0].1.offset;
        for l in self.codec_launches(launches) {
            let (_, field, samples) = self.pcm_field(l.stage);
            end = end.max(field.offset + l.rows.len() * samples * 2);
        }
        end
    }

    /// The bytes of `step_out` that hold the PCM of the step's codec rows, `[start, end)`; None when the step
    /// has no codec rows, or the layout does not keep them apart from the out kinds (`kinds_end`).
    pub fn pcm_bytes(&self, launches: &[Launch]) -> Option<(usize, usize)> {
        self.kinds_end?;
        let start = self.codec_launches(launches).map(|l| self.pcm_field(l.stage).1.offset).min()?;
        Some((start, self.download_bytes(launches)))
    }

    fn codec_launches<'a>(&'a self, launches: &'a [Launch]) -> impl Iterator<Item = &'a Launch> + 'a {
        launches.iter().filter(|l| self.reads_pcm && l.stage.decodes_windows() && !l.rows.is_empty())
    }

    /// The PCM of the step's codec rows (one per codec row of the plan) from host buffer `h`.
    pub fn read_pcm(&self, h: HostBuf, shape: &PlanShape, launches: &[Launch]) -> Vec<Vec<u8>> {
        let mut pcm = vec![Vec::new(); shape.num_frames.len()];
        for l in self.codec_launches(launches) {
            let (_, field, samples) = self.pcm_field(l.stage);
            for (i, &row) in l.rows.iter().enumerate() {
                let n = shape.num_frames[row] as usize * self.samples_per_frame;
                pcm[row] = h.bytes(field, i * samples * 2, n * 2);
            }
        }
        pcm
    }

    /// The step's out kinds and (unless `with_pcm` is false: it was read early) its PCM.
    pub fn read(&self, h: HostBuf, shape: &PlanShape, launches: &[Launch], with_pcm: bool) -> StepResult {
        let kinds = |f: &Field, n: usize| (0..n).map(|i| h.get_i(f, i) as i32).collect::<Vec<_>>();
        let pcm = if with_pcm { self.read_pcm(h, shape, launches) } else { Vec::new() };
        StepResult { step_id: shape.step_id, prefill_kind: kinds(&self.prefill_kind, shape.prefill_rows),
                     decode_kind: kinds(&self.decode_kind, shape.decode_rows), pcm, stage_seconds: Vec::new(),
                     codec_deferred: false, pcm_early: !with_pcm }
    }
}

/// What reading a step's outputs needs of its plan.
#[derive(Debug, Clone, Default)]
pub struct PlanShape {
    pub step_id: i64,
    pub prefill_rows: usize,
    pub decode_rows: usize,
    pub num_frames: Vec<i32>,
}

impl PlanShape {
    pub fn of(plan: &StepPlan) -> PlanShape {
        PlanShape { step_id: plan.step_id, prefill_rows: plan.prefill.len(), decode_rows: plan.decode.len(),
                    num_frames: plan.codec.num_frames.clone() }
    }
}
