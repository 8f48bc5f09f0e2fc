//! The disaggregated worker on hand-made half specs (`writer_tests::spec`) with launchers and a copier
//! that record what they are asked: the plan's split, the launch order of worker/disagg_worker.py, the
//! hand-over's size and the joined result.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use super::codec_lane::CodecLane;
use super::disagg::{split_plan, DisaggregatedWorker, HandoverCopy};
use super::layout::{ArenaLayout, DType};
use super::spec::{EngineSpec, Half, Stage};
use super::layout::HostBuf;
use super::worker::{EngineWorker, Launcher};
use super::writer::{AttentionPlan, Launch, CODEC_PREFIX};
use super::writer_tests::{admit, arena, spec};
use crate::sched::engine_loop::Worker;
use crate::sched::plan::{CodecLaunch, LmLaunch, StepPlan};
use crate::sched::types::ReqKey;

type Log = Rc<RefCell<Vec<String>>>;

struct Recorder {
    half: &'static str,
    log: Log,
    /// Whether the steps launched so far have finished (None: always; `Launcher::done`).
    finished: Option<Rc<Cell<bool>>>,
}

impl Launcher for Recorder {
    fn timer(&self) -> &'static str {
        "wall"
    }

    fn upload(&mut self, _parity: usize, _nbytes: usize) -> Result<(), String> {
        self.log.borrow_mut().push(format!("{} upload", self.half));
        Ok(())
    }

    fn plan_attention(&mut self, _launch: &Launch, _plan: &AttentionPlan, _parity: usize) -> Result<(), String> {
        Ok(())
    }

    fn run(&mut self, _parity: usize, launch: &Launch) -> Result<Option<f64>, String> {
        self.log.borrow_mut().push(format!("{} {}", self.half, launch.stage.name()));
        Ok(Some(if self.half == "lm" { 1.0 } else { 2.0 }))
    }

    fn download(&mut self, _parity: usize, nbytes: usize) -> Result<(), String> {
        let size = if self.half == "whole" { format!(" {nbytes}") } else { String::new() };
        self.log.borrow_mut().push(format!("{} download{size}", self.half));
        Ok(())
    }

    fn download_early(&mut self, _parity: usize, offset: usize, nbytes: usize) -> Result<(), String> {
        self.log.borrow_mut().push(format!("{} early {offset}+{nbytes}", self.half));
        Ok(())
    }

    fn wait_early(&mut self, _parity: usize) -> Result<(), String> {
        self.log.borrow_mut().push(format!("{} wait early", self.half));
        Ok(())
    }

    fn wait(&mut self, _parity: usize, _launches: &[Launch]) -> Result<Vec<(&'static str, f64)>, String> {
        self.log.borrow_mut().push(format!("{} wait", self.half));
        Ok(Vec::new())
    }

    fn done(&mut self, _parity: usize) -> Result<bool, String> {
        Ok(self.finished.as_ref().map_or(true, |f| f.get()))
    }
}

struct CopyRecorder(Log);

impl HandoverCopy for CopyRecorder {
    fn before_gather(&mut self) -> Result<(), String> {
        self.0.borrow_mut().push("wait copied".into());
        Ok(())
    }

    fn gathered(&mut self) -> Result<(), String> {
        self.0.borrow_mut().push("record gathered".into());
        Ok(())
    }

    fn copy(&mut self, _dst: u64, _src: u64, nbytes: usize) -> Result<(), String> {
        self.0.borrow_mut().push(format!("copy {nbytes}"));
        Ok(())
    }
}

/// Host memory behind an arena's addresses (u64 words keep every field aligned).
fn backed(mut a: ArenaLayout, memory: &mut Vec<Vec<u64>>) -> ArenaLayout {
    let mut words = vec![0u64; (a.nbytes + 7) / 8];
    let ptr = words.as_mut_ptr() as u64;
    memory.push(words);
    a.device_ptr = ptr;
    a.host_ptrs = vec![ptr];
    a
}

const HANDOVER_BYTES: usize = 4 * 2 * 2 * 4; // codec_codes [max_codec_batch, window, codes_per_frame] int32

/// The hand-made spec (`writer_tests::spec`, which primes codec slots), its arenas backed.
fn whole(memory: &mut Vec<Vec<u64>>) -> EngineSpec {
    let mut s = spec(true);
    s.step_in = backed(s.step_in, memory);
    let out = arena(&[("prefill_kind", vec![4], DType::I32), ("decode_kind", vec![4], DType::I32),
                      ("codec_pcm", vec![4, 8], DType::I16)]);
    s.step_out = backed(out, memory);
    s
}

/// One half of the hand-made spec.
fn half(half: Half, memory: &mut Vec<Vec<u64>>) -> EngineSpec {
    let mut s = whole(memory);
    s.half = half;
    if half == Half::Lm {
        s.stages.remove(&Stage::CodecPrime);
    } else {
        s.stages.remove(&Stage::Prefill);
        s.stages.remove(&Stage::Decode);
    }
    s.handover = Some(backed(arena(&[("codec_codes", vec![4, 2, 2], DType::I32)]), memory));
    s
}

fn rows(slots: &[i32]) -> LmLaunch {
    LmLaunch { keys: vec![ReqKey { index: 0, generation: 0 }; slots.len()], slot: slots.to_vec(),
               start: vec![3; slots.len()], num_tokens: vec![1; slots.len()], sample: vec![true; slots.len()],
               input_ids: vec![7; slots.len()], columns: 1, ..LmLaunch::default() }
}

/// A step that admits slot 6 with a codec prefix, decodes one chunk of slot 1 and one token of slot 2.
fn step() -> StepPlan {
    let codec = CodecLaunch { keys: vec![ReqKey { index: 1, generation: 0 }], slot: vec![1], chunk_index: vec![1],
                              first_frame: vec![0], window_end: vec![2], num_frames: vec![2], is_last: vec![false],
                              deadline: None };
    StepPlan { step_id: 9, admits: vec![admit(6, &[[1, 2]])], codec, decode: rows(&[2]), ..StepPlan::default() }
}

fn worker(log: &Log, memory: &mut Vec<Vec<u64>>) -> DisaggregatedWorker<Recorder, CopyRecorder> {
    let (lm, codec) = (half(Half::Lm, memory), half(Half::Codec, memory));
    DisaggregatedWorker::new((&lm, Recorder { half: "lm", log: log.clone(), finished: None }),
                             (&codec, Recorder { half: "codec", log: log.clone(), finished: None }),
                             CopyRecorder(log.clone()))
        .unwrap()
}

#[test]
fn split_plan_gives_the_codec_prefix_to_the_codec_half_only() {
    let plan = step();
    let (lm, codec) = split_plan(&plan);
    assert_eq!((lm.step_id, codec.step_id), (9, 9));
    assert!(lm.admits[0].conditioning.iter().all(|c| c.name != CODEC_PREFIX));
    assert_eq!(lm.decode, plan.decode);
    assert_eq!(lm.codec, plan.codec);
    assert_eq!(codec.admits, plan.admits);
    assert_eq!(codec.codec, plan.codec);
    assert!(codec.decode.is_empty() && codec.prefill.is_empty() && codec.pages.is_empty());
    let unprimed = StepPlan { admits: vec![admit(3, &[])], ..step() };
    assert!(matches!(split_plan(&unprimed).0, std::borrow::Cow::Borrowed(_))); // no copy of the LM rows
}

#[test]
fn the_codec_half_is_queued_between_the_gathers_and_the_lm_rows() {
    let (log, mut memory) = (Log::default(), Vec::new());
    let mut w = worker(&log, &mut memory);
    let handle = w.launch(&step()).unwrap();
    let want = ["lm upload", "wait copied", "lm prologue", "lm codec", "record gathered",
                "codec upload", "codec prologue", "codec codec_prime", &format!("copy {HANDOVER_BYTES}"), "codec codec",
                "codec download", "lm decode", "lm download"];
    assert_eq!(*log.borrow(), want);
    let result = w.collect(handle).unwrap();
    assert_eq!(result.step_id, 9);
    assert_eq!(result.decode_kind.len(), 1);
    assert_eq!(result.pcm.len(), 1);
    // the LM half's gather is the hand-over, the codec half's prologue its own
    let seconds: HashMap<&str, f64> = result.stage_seconds.iter().copied().collect();
    assert_eq!(result.stage_seconds.iter().map(|s| s.0).collect::<Vec<_>>(),
               ["prologue", "handover", "decode", "codec_prologue", "codec_prime", "codec"]);
    assert_eq!((seconds["handover"], seconds["codec"]), (1.0, 2.0));
}

#[test]
fn with_a_shared_codec_lane_the_lm_half_goes_first_and_the_lane_is_held_until_the_pcm_is_back() {
    let (log, mut memory) = (Log::default(), Vec::new());
    let lane = Arc::new(CodecLane::default());
    let mut w = worker(&log, &mut memory).with_lane(lane.clone());
    let handle = w.launch(&step()).unwrap();
    let want = ["lm upload", "wait copied", "lm prologue", "lm codec", "record gathered", "lm decode", "lm download",
                "codec upload", "codec prologue", "codec codec_prime", &format!("copy {HANDOVER_BYTES}"), "codec codec",
                "codec download"];
    assert_eq!(*log.borrow(), want);
    assert!(lane.is_held() && lane.grants() == 1);
    let result = w.collect(handle).unwrap();
    assert!(!lane.is_held());
    assert_eq!((result.decode_kind.len(), result.pcm.len()), (1, 1));
    // a step without codec rows does not wait for the lane
    let handle = w.launch(&StepPlan { step_id: 10, decode: rows(&[2]), ..StepPlan::default() }).unwrap();
    assert!(!lane.is_held() && lane.grants() == 1);
    w.collect(handle).unwrap();
}

#[test]
fn a_step_without_codec_rows_copies_nothing() {
    let (log, mut memory) = (Log::default(), Vec::new());
    let mut w = worker(&log, &mut memory);
    let plan = StepPlan { step_id: 1, decode: rows(&[2, 3]), ..StepPlan::default() };
    w.launch(&plan).unwrap();
    assert_eq!(*log.borrow(), ["lm upload", "record gathered", "codec upload", "codec download", "lm decode",
                               "lm download"]);
}

#[test]
fn halves_of_other_layouts_or_the_wrong_half_are_refused() {
    let (log, mut memory) = (Log::default(), Vec::new());
    let (lm, mut codec) = (half(Half::Lm, &mut memory), half(Half::Codec, &mut memory));
    let rec = |half| Recorder { half, log: log.clone(), finished: None };
    let swapped = DisaggregatedWorker::new((&codec, rec("lm")), (&lm, rec("codec")), CopyRecorder(log.clone()));
    assert!(swapped.err().unwrap().contains("expected the spec of a disaggregated engine's lm half, got the codec"));
    codec.handover = Some(backed(arena(&[("codec_codes", vec![4, 3, 2], DType::I32)]), &mut memory));
    let differ = DisaggregatedWorker::new((&lm, rec("lm")), (&codec, rec("codec")), CopyRecorder(log.clone()));
    assert!(differ.err().unwrap().contains("hand-over arenas differ"));
}

/// A worker deferring its codec batches (`--overlap-detok`) whose codec half finishes when `finished` says.
fn deferring(log: &Log, memory: &mut Vec<Vec<u64>>, finished: &Rc<Cell<bool>>)
             -> DisaggregatedWorker<Recorder, CopyRecorder> {
    let (lm, codec) = (half(Half::Lm, memory), half(Half::Codec, memory));
    DisaggregatedWorker::new((&lm, Recorder { half: "lm", log: log.clone(), finished: None }),
                             (&codec, Recorder { half: "codec", log: log.clone(), finished: Some(finished.clone()) }),
                             CopyRecorder(log.clone()))
        .unwrap()
        .deferring_codec()
}

#[test]
fn a_deferred_codec_batch_lands_after_its_step_once_finished() {
    let (log, mut memory, finished) = (Log::default(), Vec::new(), Rc::new(Cell::new(false)));
    let mut w = deferring(&log, &mut memory, &finished);
    let handle = w.launch(&step()).unwrap();
    let launched = ["lm upload", "wait copied", "lm prologue", "lm codec", "record gathered", "codec upload",
                    "codec prologue", "codec codec_prime", &format!("copy {HANDOVER_BYTES}"), "codec codec",
                    "codec download", "lm decode", "lm download"];
    assert_eq!(*log.borrow(), launched);
    let result = w.collect(handle).unwrap();
    assert!(result.codec_deferred && result.pcm.is_empty());
    assert_eq!((result.step_id, result.decode_kind.len()), (9, 1));
    assert_eq!(log.borrow().last().unwrap(), "lm wait"); // the step waited for its LM half only
    assert!(w.land(false).is_empty());
    finished.set(true);
    let landed = w.land(false);
    assert_eq!(landed.len(), 1);
    assert_eq!(landed[0].step_id, 9);
    let codec = landed[0].result.as_ref().unwrap();
    assert_eq!(codec.pcm.len(), 1);
    assert_eq!(codec.stage_seconds.iter().map(|s| s.0).collect::<Vec<_>>(), ["codec_prologue", "codec_prime", "codec"]);
    assert!(w.land(false).is_empty());
}

#[test]
fn a_deferring_step_without_codec_rows_or_admissions_skips_the_codec_half() {
    let (log, mut memory, finished) = (Log::default(), Vec::new(), Rc::new(Cell::new(false)));
    let mut w = deferring(&log, &mut memory, &finished);
    let handle = w.launch(&StepPlan { step_id: 1, decode: rows(&[2, 3]), ..StepPlan::default() }).unwrap();
    assert_eq!(*log.borrow(), ["lm upload", "record gathered", "lm decode", "lm download"]);
    let result = w.collect(handle).unwrap();
    assert!(!result.codec_deferred);
    // admissions alone run the codec half, and hand nothing back when collected
    let admits = StepPlan { step_id: 2, admits: vec![admit(3, &[])], decode: rows(&[2]), ..StepPlan::default() };
    let handle = w.launch(&admits).unwrap();
    assert!(log.borrow().iter().any(|l| l == "codec prologue"));
    assert!(!w.collect(handle).unwrap().codec_deferred);
    finished.set(true);
    assert!(w.land(false).is_empty());
}

#[test]
fn the_codec_half_collects_a_backlogged_step_before_reusing_its_host_buffer() {
    // the hand-made spec has one host buffer: a second codec step waits for the first
    let (log, mut memory, finished) = (Log::default(), Vec::new(), Rc::new(Cell::new(false)));
    let mut w = deferring(&log, &mut memory, &finished);
    let first = w.launch(&step()).unwrap();
    w.collect(first).unwrap();
    log.borrow_mut().clear();
    let second = w.launch(&StepPlan { step_id: 10, ..step() }).unwrap();
    assert_eq!(&log.borrow()[..6], ["lm upload", "wait copied", "lm prologue", "lm codec", "record gathered",
                                     "codec wait"]);
    w.collect(second).unwrap();
    let landed = w.land(false);
    assert_eq!(landed.iter().map(|l| l.step_id).collect::<Vec<_>>(), [9]);
    // blocking lands the next batch with rows, past steps that only admitted
    let admits = StepPlan { step_id: 11, admits: vec![admit(3, &[])], ..StepPlan::default() };
    let handle = w.launch(&admits).unwrap();
    w.collect(handle).unwrap();
    let landed = w.land(true);
    assert_eq!(landed.iter().map(|l| l.step_id).collect::<Vec<_>>(), [10]);
    assert!(w.land(true).is_empty());
}

/// The whole engine's worker on `whole`'s spec, its codec rows' PCM samples set to 1, 2, ... in host memory.
fn whole_worker(log: &Log, memory: &mut Vec<Vec<u64>>, early: bool) -> (EngineWorker<Recorder>, usize) {
    let s = whole(memory);
    let pcm = s.step_out.field("codec_pcm").unwrap().clone();
    let h = HostBuf { base: s.step_out.host_ptrs[0] as *mut u8 };
    for i in 0..pcm.len() {
        h.set_i(&pcm, i, i as i64 + 1);
    }
    let w = EngineWorker::new(&s, Recorder { half: "whole", log: log.clone(), finished: None }).unwrap();
    (w.with_early_pcm(early), pcm.offset)
}

/// The first `n` samples of `whole_worker`'s PCM, as the host receives them.
fn samples(n: i16) -> Vec<u8> {
    (1..=n).flat_map(i16::to_le_bytes).collect()
}

#[test]
fn a_whole_engine_copies_its_pcm_back_after_its_codec_launch_and_hands_it_over_before_its_lm_rows_end() {
    let (log, mut memory) = (Log::default(), Vec::new());
    let (mut w, pcm_offset) = whole_worker(&log, &mut memory, true);
    let mut handle = w.launch(&step()).unwrap();
    // one row of 2 frames of 4 samples (int16), in a field of 8 samples a row; the last download stops at the PCM
    let want = ["whole upload", "whole prologue", "whole codec_prime", "whole codec",
                &format!("whole early {pcm_offset}+16"), "whole decode", &format!("whole download {pcm_offset}")];
    assert_eq!(*log.borrow(), want);
    let pcm = w.early_pcm(&mut handle).unwrap().unwrap();
    assert_eq!(pcm, [samples(8)]);
    assert_eq!(log.borrow().last().unwrap(), "whole wait early");
    assert!(w.early_pcm(&mut handle).is_none()); // handed over once
    let result = w.collect(handle).unwrap();
    assert!(result.pcm_early && result.pcm.is_empty());
    assert_eq!(result.decode_kind.len(), 1);
}

#[test]
fn a_whole_engine_step_hands_its_pcm_over_with_its_result_without_early_copies_or_codec_rows() {
    let (log, mut memory) = (Log::default(), Vec::new());
    let (mut w, pcm_offset) = whole_worker(&log, &mut memory, false);
    let mut handle = w.launch(&step()).unwrap();
    assert!(!log.borrow().iter().any(|l| l.contains("early")));
    assert_eq!(log.borrow().last().unwrap(), &format!("whole download {}", pcm_offset + 16));
    assert!(w.early_pcm(&mut handle).is_none());
    let result = w.collect(handle).unwrap();
    assert_eq!((result.pcm_early, result.pcm), (false, vec![samples(8)]));
    // with early copies on, a step without codec rows makes none
    let (log, mut memory) = (Log::default(), Vec::new());
    let (mut w, pcm_offset) = whole_worker(&log, &mut memory, true);
    let mut handle = w.launch(&StepPlan { step_id: 1, decode: rows(&[2, 3]), ..StepPlan::default() }).unwrap();
    assert_eq!(*log.borrow(), ["whole upload", "whole decode", &format!("whole download {pcm_offset}")]);
    assert!(w.early_pcm(&mut handle).is_none());
    assert!(!w.collect(handle).unwrap().pcm_early);
}

#[test]
fn a_disaggregated_step_hands_its_codec_halfs_pcm_over_early_and_frees_its_lane_unless_deferring() {
    let (log, mut memory) = (Log::default(), Vec::new());
    let lane = Arc::new(CodecLane::default());
    let mut w = worker(&log, &mut memory).with_lane(lane.clone());
    let mut handle = w.launch(&step()).unwrap();
    assert!(lane.is_held());
    let pcm = w.early_pcm(&mut handle).unwrap().unwrap();
    assert_eq!(pcm.len(), 1);
    assert_eq!(log.borrow().last().unwrap(), "codec wait"); // the LM half not waited for yet
    assert!(!lane.is_held());
    let result = w.collect(handle).unwrap();
    assert!(result.pcm_early && result.pcm.is_empty());
    assert_eq!(result.stage_seconds.iter().map(|s| s.0).collect::<Vec<_>>(),
               ["prologue", "handover", "decode", "codec_prologue", "codec_prime", "codec"]);
    let (log, mut memory, finished) = (Log::default(), Vec::new(), Rc::new(Cell::new(true)));
    let mut w = deferring(&log, &mut memory, &finished);
    let mut handle = w.launch(&step()).unwrap();
    assert!(w.early_pcm(&mut handle).is_none());
    assert!(w.collect(handle).unwrap().codec_deferred);
}
