//! The step writer's codec_prime section (docs/engine-contract.md, `codec_prefix_frames`) on a
//! hand-made spec: admissions with a codec prefix first, their prefixes and lengths, the launch's
//! bucket, the upload's end, and the errors.

use std::collections::{BTreeMap, HashMap};

use serde_json::json;

use super::layout::{ArenaLayout, DType, Field, HostBuf};
use super::spec::{EngineSpec, Half, Stage, StageSpec};
use super::writer::{StepWriter, CODEC_PREFIX};
use crate::sched::config::{EngineLimits, ProgramMeta};
use crate::sched::plan::{SlotInit, StepPlan};
use crate::sched::types::{Conditioning, NO_SLOT};

const ADMITS: usize = 4; // max_prefill_seqs
const FRAMES: usize = 3; // codec_prefix_frames
const CODES: usize = 2; // codes_per_frame

/// Fields laid out one after another, as the spec publishes them.
pub(crate) fn arena(fields: &[(&str, Vec<usize>, DType)]) -> ArenaLayout {
    let mut offset = 0;
    let mut out = HashMap::new();
    for (name, shape, dtype) in fields {
        let nbytes = shape.iter().product::<usize>() * dtype.size();
        out.insert(name.to_string(), Field { offset, nbytes, shape: shape.clone(), dtype: *dtype });
        offset += (nbytes + 7) / 8 * 8;
    }
    ArenaLayout { name: "step_in".into(), nbytes: offset, device_ptr: 0, host_ptrs: vec![0], fields: out }
}

fn step_in(primes: bool) -> ArenaLayout {
    let (b, t, s) = (4, 16, ADMITS);
    let mut f: Vec<(&str, Vec<usize>, DType)> = vec![("admit_slot", vec![s], DType::I32)];
    for name in ["admit_prompt_len", "admit_temperature", "admit_top_k", "admit_top_p", "admit_min_p",
                 "admit_repetition_penalty", "admit_repetition_window", "admit_seed", "admit_allow_stop"] {
        f.push((name, vec![s], DType::F32));
    }
    for name in ["page_slot", "page_index", "page_id"] {
        f.push((name, vec![8], DType::I32));
    }
    f.extend([("decode_slot", vec![b], DType::I32), ("decode_pos", vec![b], DType::I32),
              ("decode_ids", vec![b, 1], DType::I32), ("decode_kv_indptr", vec![b + 1], DType::I32),
              ("decode_last_page_len", vec![b], DType::I32), ("codec_slot", vec![b], DType::I32),
              ("codec_first_frame", vec![b], DType::I32), ("codec_window_end", vec![b], DType::I32),
              ("prefill_slot", vec![s], DType::I32), ("prefill_kv_len", vec![s], DType::I32),
              ("prefill_sample", vec![s], DType::Bool), ("prefill_qo_indptr", vec![s + 1], DType::I32),
              ("prefill_kv_indptr", vec![s + 1], DType::I32), ("prefill_last_page_len", vec![s], DType::I32),
              ("prefill_ids", vec![t, 1], DType::I32), ("prefill_pos", vec![t], DType::I32),
              ("prefill_tok_slot", vec![t], DType::I32)]);
    if primes {
        f.push(("codec_prime_codes", vec![s, FRAMES, CODES], DType::I32));
        f.push(("codec_prime_len", vec![s], DType::I64));
    }
    arena(&f)
}

/// A hand-made spec (torch backend, page size 4, decode buckets 1, 2, 4; a prefill bucket of 16 tokens).
pub(crate) fn spec(primes: bool) -> EngineSpec {
    let meta = json!({"name": "t", "sample_rate": 8, "input_columns": 1, "codes_per_step": CODES,
                      "codes_per_frame": CODES, "samples_per_frame": 4, "frames_per_chunk": 2,
                      "codec_lookback_frames": 0, "codec_lookahead_frames": 0, "skip_leading_frames": 0,
                      "max_model_len": 64, "max_text_chars": 10, "stop_rule": {"token": 0, "keeps_frame": false},
                      "stateful_codec": true});
    let limits = json!({"max_batch": 4, "max_prefill_tokens": 16, "max_prefill_seqs": ADMITS, "max_codec_batch": 4,
                        "frames_per_chunk": 2, "num_pages": 8, "page_size": 4, "max_model_len": 64});
    let stage = |buckets: Vec<usize>| StageSpec { buckets, handles: BTreeMap::new(), captured_seqs: None };
    let mut stages = BTreeMap::from([(Stage::Prologue, stage(vec![1])), (Stage::Codec, stage(vec![1, 2, 4])),
                                     (Stage::Prefill, stage(vec![16])), (Stage::Decode, stage(vec![1, 2, 4]))]);
    if primes {
        stages.insert(Stage::CodecPrime, stage(vec![1, 2, 4]));
    }
    EngineSpec { engine_id: 0, device: "cpu".into(), half: Half::Whole, handover: None, meta: ProgramMeta::from_json(&meta).unwrap(),
                 limits: EngineLimits::from_json(&limits).unwrap(), step_in: step_in(primes), step_out: arena(&[]),
                 stages, attention_backend: "torch".into(), planner: String::new(), page_size: 4,
                 geometry: Default::default(), planners: Default::default(), partition_stream: None }
}

pub(crate) fn admit(slot: usize, prefix: &[[i32; CODES]]) -> SlotInit {
    let conditioning = if prefix.is_empty() { Vec::new() } else {
        vec![Conditioning { name: CODEC_PREFIX.into(), rows: prefix.len(),
                            values: prefix.iter().flatten().map(|&c| c as f32).collect() }]
    };
    SlotInit { slot, prompt_len: 3, temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, repetition_penalty: 1.0,
               repetition_window: 8, seed: slot as i64, allow_stop: true, conditioning }
}

fn plan(admits: Vec<SlotInit>) -> StepPlan {
    StepPlan { admits, ..StepPlan::default() }
}

/// A zeroed host buffer of the arena (u64 words keep every field aligned).
fn buffer(a: &ArenaLayout) -> (Vec<u64>, HostBuf) {
    let mut words = vec![0u64; (a.nbytes + 7) / 8];
    let base = words.as_mut_ptr() as *mut u8;
    (words, HostBuf { base })
}

fn column(h: HostBuf, f: &Field) -> Vec<i64> {
    (0..f.len()).map(|i| h.get_i(f, i)).collect()
}

#[test]
fn admissions_with_a_prefix_come_first_and_are_primed_at_the_smallest_bucket() {
    let spec = spec(true);
    let writer = StepWriter::new(&spec).unwrap();
    let (_keep, h) = buffer(&spec.step_in);
    let admits = vec![admit(5, &[]), admit(6, &[[1, 2], [3, 4]]), admit(7, &[]), admit(8, &[[9, 10]])];
    let (launches, end) = writer.write(h, &plan(admits)).unwrap();
    let stages: Vec<(Stage, usize)> = launches.iter().map(|l| (l.stage, l.bucket)).collect();
    assert_eq!(stages, vec![(Stage::Prologue, 1), (Stage::CodecPrime, 2)]);
    let a = &spec.step_in;
    assert_eq!(column(h, a.field("admit_slot").unwrap()), vec![6, 8, 5, 7]); // stable: primed, then the others
    assert_eq!(column(h, a.field("admit_seed").unwrap()), vec![6, 8, 5, 7]);
    assert_eq!(column(h, a.field("codec_prime_len").unwrap()), vec![2, 1, 0, 0]);
    let codes = column(h, a.field("codec_prime_codes").unwrap());
    assert_eq!(&codes[..4], &[1, 2, 3, 4]);
    assert_eq!(&codes[FRAMES * CODES..FRAMES * CODES + 2], &[9, 10]);
    assert_eq!(end, a.end_of("codec_prime_len").unwrap()); // the prime section goes up only in such steps
}

#[test]
fn a_step_without_prefixes_neither_primes_nor_uploads_the_section() {
    let spec = spec(true);
    let writer = StepWriter::new(&spec).unwrap();
    let (_keep, h) = buffer(&spec.step_in);
    let (launches, end) = writer.write(h, &plan(vec![admit(1, &[]), admit(2, &[])])).unwrap();
    assert_eq!(launches.iter().map(|l| l.stage).collect::<Vec<_>>(), vec![Stage::Prologue]);
    assert_eq!(end, spec.step_in.end_of("page_id").unwrap());
    assert_eq!(column(h, spec.step_in.field("admit_slot").unwrap()), vec![1, 2, i64::from(NO_SLOT), i64::from(NO_SLOT)]);
}

#[test]
fn a_prefix_longer_than_declared_is_refused() {
    let spec = spec(true);
    let writer = StepWriter::new(&spec).unwrap();
    let (_keep, h) = buffer(&spec.step_in);
    let err = writer.write(h, &plan(vec![admit(1, &[[0, 0]; FRAMES + 1])])).unwrap_err();
    assert!(err.contains(CODEC_PREFIX) && err.contains("exceeds the declared 3"), "{err}");
}

#[test]
fn a_prefix_for_a_program_without_codec_prime_is_refused() {
    let spec = spec(false);
    let writer = StepWriter::new(&spec).unwrap();
    let (_keep, h) = buffer(&spec.step_in);
    let err = writer.write(h, &plan(vec![admit(1, &[[1, 2]])])).unwrap_err();
    assert!(err.contains(CODEC_PREFIX) && err.contains("codec_prefix_frames"), "{err}");
}
