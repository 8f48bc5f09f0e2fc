//! Bench mode's run (vox_serve/bench.py): one phase of requests through the replicas' scheduler
//! threads without HTTP. The calling thread plays the clients: it sends each request, when its
//! arrival offset from the phase start has come, to the least-loaded live replica (fewest requests
//! sent and not yet ended; ties to the lowest index). A replica whose thread fails (a panic) fails
//! the requests it held, naming itself; the others go on, and later requests go to them. The
//! outcomes go back to Python, which reports them for both runtimes (vox_serve/bench_report.py).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::sched::engine_loop::{EngineLoop, Worker};
use crate::sched::{Event, ReqKey, Request};

/// A request and when it arrives: seconds from the phase start.
pub struct Arrival {
    pub req: Request,
    pub offset: f64,
}

/// A request's outcome: its final state, when it was queued, its audio chunks and its end (seconds
/// from the phase start).
pub struct Outcome {
    pub req: Request,
    pub offset: f64,
    /// The replica it was sent to.
    pub replica: usize,
    /// None: the scheduler refused it (the error says why).
    pub admitted: Option<f64>,
    /// (arrival, samples) of each audio chunk.
    pub chunks: Vec<(f64, usize)>,
    pub pcm: Vec<u8>,
    pub finished: Option<f64>,
}

impl Outcome {
    fn failed(&mut self, error: String) {
        self.req.finish_reason = Some("error".into());
        self.req.error = Some(error);
    }
}

/// What the client side and the replicas share: the phase clock, every request's outcome (by
/// arrival index), and per replica its load and whether it is alive.
struct Shared {
    start: Instant,
    outcomes: Mutex<Vec<Outcome>>,
    load: Vec<AtomicUsize>,
    alive: Vec<AtomicBool>,
    /// Set once every request due at the start is in its replica's channel: the scheduler threads
    /// wait for it before their first step, so requests sent together are admitted together (the
    /// same batches on every run, as the Python runtime's bench mode admits them).
    opened: (Mutex<bool>, Condvar),
}

impl Shared {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn open(&self) {
        *self.opened.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.opened.1.notify_all();
    }

    fn wait_open(&self) {
        let mut opened = self.opened.0.lock().unwrap_or_else(|e| e.into_inner());
        while !*opened {
            opened = self.opened.1.wait(opened).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn outcomes(&self) -> std::sync::MutexGuard<'_, Vec<Outcome>> {
        self.outcomes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn least_loaded(&self) -> Option<usize> {
        let replicas: Vec<(usize, bool)> = self.load.iter().zip(&self.alive)
            .map(|(load, alive)| (load.load(Ordering::SeqCst), alive.load(Ordering::SeqCst))).collect();
        least_loaded(&replicas)
    }
}

/// Of (requests in hand, alive) per replica, the live replica with the fewest (the lowest index of those).
pub fn least_loaded(replicas: &[(usize, bool)]) -> Option<usize> {
    replicas.iter().enumerate().filter(|(_, r)| r.1).min_by_key(|(i, r)| (r.0, *i)).map(|(i, _)| i)
}

/// One replica's side of a phase: the requests it was sent, by scheduler key and request id.
struct ReplicaRun<'a> {
    replica: usize,
    shared: &'a Shared,
    by_key: HashMap<ReqKey, usize>,
    by_id: HashMap<String, usize>,
}

impl ReplicaRun<'_> {
    /// Queue request `index` (an arrival index); one the scheduler refuses ends at once.
    fn admit<W: Worker>(&mut self, lp: &mut EngineLoop<W>, index: usize) {
        let req = self.shared.outcomes()[index].req.clone();
        let now = self.shared.now();
        let added = lp.scheduler.add_request(req);
        let mut outcomes = self.shared.outcomes();
        let outcome = &mut outcomes[index];
        match added {
            Ok(key) => {
                self.by_key.insert(key, index);
                self.by_id.insert(outcome.req.req_id.clone(), index);
                outcome.admitted = Some(now);
            }
            Err(e) => {
                outcome.failed(e.to_string());
                self.shared.load[self.replica].fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// The scheduler's events since the last poll, timed now.
    fn collect<W: Worker>(&mut self, lp: &mut EngineLoop<W>) {
        let now = self.shared.now();
        for event in lp.scheduler.events.drain(..) {
            match event {
                Event::Audio { key, pcm } => {
                    let mut outcomes = self.shared.outcomes();
                    let outcome = &mut outcomes[self.by_key[&key]];
                    outcome.chunks.push((now, pcm.len() / 2));
                    outcome.pcm.extend_from_slice(&pcm);
                }
                Event::Done(req) => {
                    let mut outcomes = self.shared.outcomes();
                    let outcome = &mut outcomes[self.by_id[&req.req_id]];
                    outcome.req = *req;
                    outcome.finished = Some(now);
                    self.shared.load[self.replica].fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
    }

    /// The replica's loop for the phase: take what was sent, step, record; while nothing can run,
    /// wait for the next request (or the policy's own wake-up). Ends when the client side is done
    /// sending and every request sent here has ended.
    fn run<W: Worker>(&mut self, lp: &mut EngineLoop<W>, incoming: &Receiver<usize>) {
        let mut open = true;
        loop {
            while open {
                match incoming.try_recv() {
                    Ok(index) => self.admit(lp, index),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            let wait = lp.poll();
            self.collect(lp);
            let timeout = match (wait, open) {
                (None, false) => break,
                (None, true) => None,
                (Some(w), true) if w > 0.0 => Some(Duration::from_secs_f64(w)),
                (Some(w), false) if w > 0.0 => {
                    std::thread::sleep(Duration::from_secs_f64(w));
                    continue;
                }
                (Some(_), _) => continue,
            };
            let next = match timeout {
                None => incoming.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(t) => incoming.recv_timeout(t),
            };
            match next {
                Ok(index) => self.admit(lp, index),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => open = false,
            }
        }
        if let Some(t) = lp.tracer.as_mut() {
            t.flush();
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// Replica `replica`'s thread for one phase; gives its loop back, or None when it failed (it is
/// then marked dead, and `run` fails the requests it had not ended).
fn spawn_replica<W: Worker + Send + 'static>(replica: usize, mut lp: EngineLoop<W>, shared: Arc<Shared>,
                                             incoming: Receiver<usize>)
                                             -> std::io::Result<std::thread::JoinHandle<Option<EngineLoop<W>>>> {
    std::thread::Builder::new().name(format!("vox-scheduler-{replica}")).spawn(move || {
        let mut run = ReplicaRun { replica, shared: &shared, by_key: HashMap::new(), by_id: HashMap::new() };
        shared.wait_open();
        match catch_unwind(AssertUnwindSafe(|| run.run(&mut lp, &incoming))) {
            Ok(()) => Some(lp),
            Err(panic) => {
                shared.alive[replica].store(false, Ordering::SeqCst);
                eprintln!("vox-serve: replica {replica} failed: {}; the other replicas go on",
                          panic_message(panic.as_ref()));
                None
            }
        }
    })
}

/// Send each request at its offset to the least-loaded live replica; a request no replica can take
/// fails. The replicas start stepping (`Shared::open`) once the requests due at the start are sent.
fn send_arrivals(shared: &Shared, senders: &[Option<Sender<usize>>], offsets: &[f64]) {
    for (index, &offset) in offsets.iter().enumerate() {
        let wait = offset - shared.now();
        if wait > 0.0 {
            shared.open();
            std::thread::sleep(Duration::from_secs_f64(wait));
        }
        loop {
            let replica = match shared.least_loaded() {
                Some(replica) => replica,
                None => {
                    shared.outcomes()[index].failed("no replica is alive".into());
                    break;
                }
            };
            shared.outcomes()[index].replica = replica;
            shared.load[replica].fetch_add(1, Ordering::SeqCst);
            let sent = senders[replica].as_ref().map_or(false, |s| s.send(index).is_ok());
            if sent {
                break;
            }
            shared.load[replica].fetch_sub(1, Ordering::SeqCst);
            shared.alive[replica].store(false, Ordering::SeqCst);
        }
    }
    shared.open();
}

/// Run one phase on the replicas' loops (None: a replica that failed in an earlier phase), each on
/// a scheduler thread of its own, until every request has ended. Returns the loops for the next
/// phase, the outcomes in arrival order and the phase's wall seconds.
pub fn run<W: Worker + Send + 'static>(loops: Vec<Option<EngineLoop<W>>>, arrivals: Vec<Arrival>)
                                       -> (Vec<Option<EngineLoop<W>>>, Vec<Outcome>, f64) {
    let offsets: Vec<f64> = arrivals.iter().map(|a| a.offset).collect();
    let outcomes = arrivals.into_iter().map(|a| Outcome { req: a.req, offset: a.offset, replica: 0, admitted: None,
                                                          chunks: Vec::new(), pcm: Vec::new(), finished: None })
        .collect();
    let shared = Arc::new(Shared {
        start: Instant::now(), outcomes: Mutex::new(outcomes),
        load: loops.iter().map(|_| AtomicUsize::new(0)).collect(),
        alive: loops.iter().map(|lp| AtomicBool::new(lp.is_some())).collect(),
        opened: (Mutex::new(false), Condvar::new()),
    });
    let mut senders = Vec::new();
    let mut threads = Vec::new();
    for (replica, lp) in loops.into_iter().enumerate() {
        let (tx, rx) = channel();
        let thread = lp.map(|lp| spawn_replica(replica, lp, shared.clone(), rx));
        match thread {
            Some(Ok(thread)) => {
                senders.push(Some(tx));
                threads.push(Some(thread));
            }
            other => {
                if let Some(Err(e)) = other {
                    eprintln!("vox-serve: replica {replica}'s scheduler thread did not start: {e}");
                }
                shared.alive[replica].store(false, Ordering::SeqCst);
                senders.push(None);
                threads.push(None);
            }
        }
    }
    send_arrivals(&shared, &senders, &offsets);
    drop(senders);
    let loops = threads.into_iter().map(|t| t.and_then(|t| t.join().ok().flatten())).collect();
    let wall = shared.now();
    let mut outcomes = std::mem::take(&mut *shared.outcomes());
    for o in outcomes.iter_mut().filter(|o| o.finished.is_none() && o.req.error.is_none()) {
        let error = format!("replica {} failed before the request ended", o.replica);
        o.failed(error);
    }
    (loops, outcomes, wall)
}
