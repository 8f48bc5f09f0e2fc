//! A scenario through the Rust scheduler on the simulated engine (vox_serve/sim/driver.py): the
//! driver plays the clients -- sends each request at its arrival time and its streamed text at
//! theirs, records every chunk's arrival on the virtual clock -- and, when nothing can run, moves
//! the clock to the next event or fails the queue's head if none will come.

use std::collections::{HashMap, VecDeque};

use serde_json::{json, Value};

use super::cost::CostModel;
use super::worker::{SimWorker, TEXT_END_ID, TEXT_ID_BASE};
use crate::sched::config::{boolean, float, int, string, EngineLimits, ProgramMeta, SchedulerConfig};
use crate::sched::engine_loop::EngineLoop;
use crate::sched::trace::Tracer;
use crate::sched::types::TextFeed;
use crate::sched::{Clock, Event, Prompt, ReqKey, Request, SamplingParams, Scheduler};

/// One client request of a scenario (vox_serve/sim/workload.py `Arrival`).
#[derive(Debug, Clone)]
pub struct Arrival {
    pub t: f64,
    pub req_id: String,
    pub prompt_len: usize,
    pub num_frames: i64,
    pub streaming: bool,
    pub ignore_eos: bool,
    pub max_tokens: Option<i64>,
    pub text_pieces: Vec<(f64, i64)>,
    pub text_end: Option<f64>,
}

impl Arrival {
    pub fn from_json(a: &Value) -> Result<Arrival, String> {
        let p = "arrivals[].";
        let pieces = match a.get("text_pieces") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items.iter().map(|x| match x.as_array().map(Vec::as_slice) {
                Some([t, n]) => Ok((t.as_f64().ok_or("a text piece's time")?, n.as_i64().ok_or("a text piece's ids")?)),
                _ => Err("arrivals[].text_pieces: pieces are [time, ids]"),
            }).collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err("arrivals[].text_pieces is not a list".into()),
        };
        Ok(Arrival {
            t: float(a, p, "t")?, req_id: string(a, p, "req_id")?, prompt_len: int(a, p, "prompt_len")? as usize,
            num_frames: int(a, p, "num_frames")?,
            streaming: a.get("streaming").and_then(Value::as_bool).unwrap_or(true),
            ignore_eos: boolean(a, p, "ignore_eos")?,
            max_tokens: a.get("max_tokens").and_then(Value::as_i64),
            text_pieces: pieces,
            text_end: a.get("text_end").and_then(Value::as_f64),
        })
    }
}

#[derive(Debug, Clone, Default)]
struct ClientTrace {
    sent: f64,
    chunks: Vec<(f64, usize)>,
    finished: Option<f64>,
    error: Option<String>,
    finish_reason: Option<String>,
}

pub struct Simulation {
    lp: EngineLoop<SimWorker>,
    clock: Clock,
    meta: ProgramMeta,
    arrivals: VecDeque<Arrival>,
    /// Pending text: (time, request, ids, ends).
    texts: Vec<(f64, String, i64, bool)>,
    order: Vec<String>,
    traces: HashMap<String, ClientTrace>,
    keys: HashMap<ReqKey, String>,
}

impl Simulation {
    pub fn new(meta: ProgramMeta, limits: EngineLimits, config: SchedulerConfig, costs: CostModel,
               mut arrivals: Vec<Arrival>) -> Simulation {
        let clock = Clock::virtual_at(0.0);
        let scheduler = Scheduler::new(meta.clone(), limits.clone(), config, clock.clone());
        let worker = SimWorker::new(meta.clone(), limits, costs, clock.clone());
        arrivals.sort_by(|a, b| a.t.total_cmp(&b.t));
        Simulation { lp: EngineLoop::new(scheduler, worker, Some(Tracer::in_memory())), clock, meta,
                     arrivals: arrivals.into(), texts: Vec::new(), order: Vec::new(), traces: HashMap::new(),
                     keys: HashMap::new() }
    }

    /// Run to the end; the trace records and each request as its client saw it, as JSON.
    pub fn run(mut self) -> Result<Value, String> {
        while !self.arrivals.is_empty() || self.lp.busy() {
            while self.arrivals.front().map_or(false, |a| a.t <= self.clock.now()) {
                let a = self.arrivals.pop_front().expect("checked");
                self.send(a);
            }
            self.send_text()?;
            let stepped = self.lp.step();
            self.drain();
            if !stepped {
                self.wait()?;
                self.drain();
            }
        }
        let records = self.lp.tracer.as_mut().and_then(|t| t.records.take()).unwrap_or_default();
        let requests: Vec<Value> = self.order.iter().map(|id| {
            let t = &self.traces[id];
            json!({"req_id": id, "sent": t.sent, "chunks": t.chunks, "finished": t.finished, "error": t.error,
                   "finish_reason": t.finish_reason})
        }).collect();
        Ok(json!({"records": records, "requests": requests, "num_steps": self.lp.num_steps,
                  "virtual_seconds": self.clock.now()}))
    }

    fn drain(&mut self) {
        let now = self.clock.now();
        for event in self.lp.scheduler.events.drain(..) {
            match event {
                Event::Audio { key, pcm } => {
                    if let Some(t) = self.keys.get(&key).and_then(|id| self.traces.get_mut(id)) {
                        t.chunks.push((now, pcm.len() / 2));
                    }
                }
                Event::Done(req) => {
                    if let Some(t) = self.traces.get_mut(&req.req_id) {
                        t.finished = Some(now);
                        t.error = req.error.clone();
                        t.finish_reason = req.finish_reason.clone();
                    }
                }
            }
        }
    }

    fn wait(&mut self) -> Result<(), String> {
        let s = &self.lp.scheduler;
        let times = [self.arrivals.front().map(|a| a.t), s.next_wakeup(),
                     self.texts.iter().map(|e| e.0).reduce(f64::min)];
        match times.iter().flatten().copied().reduce(f64::min) {
            Some(t) => self.clock.advance_to(t),
            None => match s.waiting.front() {
                Some(&head) => {
                    let id = s.req(head).req_id.clone();
                    self.lp.scheduler.abort(&id, "stalled: the KV cache cannot hold this request");
                }
                None => return Err(format!("simulation stalled with {} requests and nothing to run", s.num_active())),
            },
        }
        Ok(())
    }

    fn send(&mut self, a: Arrival) {
        let (cps, cpf) = (self.meta.codes_per_step, self.meta.codes_per_frame);
        let tokens = (a.num_frames * cpf + cps - 1) / cps;
        let sampling = SamplingParams { temperature: 0.0, repetition_penalty: 1.0, ignore_eos: a.ignore_eos,
                                        max_tokens: a.max_tokens.unwrap_or(tokens + cpf),
                                        seed: self.order.len() as i64, ..SamplingParams::default() };
        let columns = self.meta.input_columns;
        let prompt = Prompt { ids: vec![1; a.prompt_len * columns], columns, ..Prompt::default() };
        let mut req = Request::new(a.req_id.clone(), prompt, sampling, a.streaming);
        if let Some(end) = a.text_end {
            req.text_feed = Some(TextFeed::default());
            self.texts.extend(a.text_pieces.iter().map(|&(t, n)| (t, a.req_id.clone(), n, false)));
            self.texts.push((end, a.req_id.clone(), 0, true));
        }
        self.order.push(a.req_id.clone());
        self.traces.insert(a.req_id.clone(), ClientTrace { sent: a.t, ..ClientTrace::default() });
        match self.lp.scheduler.add_request(req) {
            Ok(key) => {
                self.lp.scheduler.req_mut(key).stats.arrival = a.t;
                self.keys.insert(key, a.req_id.clone());
                self.lp.worker.set_length(key, a.num_frames);
                if a.text_end.is_some() {
                    self.lp.worker.set_text(key, a.text_pieces.iter().map(|p| p.1).sum());
                }
            }
            Err(e) => {
                let t = self.traces.get_mut(&a.req_id).expect("inserted above");
                t.finished = Some(self.clock.now());
                t.error = Some(e.to_string());
            }
        }
    }

    /// Deliver the text pieces that are due, in order (ids numbered per request).
    fn send_text(&mut self) -> Result<(), String> {
        let now = self.clock.now();
        let (mut due, later): (Vec<_>, Vec<_>) = self.texts.drain(..).partition(|e| e.0 <= now);
        self.texts = later;
        due.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.3.cmp(&b.3)));
        for (_, req_id, n, ends) in due {
            let s = &mut self.lp.scheduler;
            let have = match s.key_of(&req_id).and_then(|k| s.req(k).text_feed.as_ref().map(|f| f.ids.len())) {
                None => continue,
                Some(have) => have as i32,
            };
            let first = TEXT_ID_BASE + have;
            let mut ids: Vec<i32> = (first..first + n as i32).collect();
            if ends {
                ids.push(TEXT_END_ID);
            }
            s.append_text(&req_id, &ids, ends)?;
        }
        Ok(())
    }
}

/// `_rt.simulate`: a scenario (`meta`, `limits`, `scheduler`, `costs`, `arrivals`) to its results.
pub fn simulate(scenario: &Value) -> Result<Value, String> {
    let field = |name: &str| scenario.get(name).ok_or_else(|| format!("scenario.{name} is missing"));
    let meta = ProgramMeta::from_json(field("meta")?)?;
    let limits = EngineLimits::from_json(field("limits")?)?;
    let config = SchedulerConfig::from_json(field("scheduler")?)?;
    let costs = CostModel::from_json(field("costs")?)?;
    let arrivals = field("arrivals")?.as_array().ok_or("scenario.arrivals is not a list")?
        .iter().map(Arrival::from_json).collect::<Result<Vec<_>, _>>()?;
    Simulation::new(meta, limits, config, costs, arrivals).run()
}
