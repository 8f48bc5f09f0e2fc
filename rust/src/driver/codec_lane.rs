//! The codec lane that the replicas of `--codec-gpu G` share: every replica's codec half runs on GPU
//! G, and one replica's codec batch at a time holds the lane, from queuing its launches until its
//! PCM is back. Who goes next is decided when the lane frees: the waiting batch with the earliest
//! chunk deadline (`CodecLaunch::deadline`: a stream's playback deadline, or its first-audio
//! deadline), ties and batches without a stream in arrival order; a batch passed over `MAX_PASSES`
//! times goes next whatever the deadlines, so no replica starves behind more urgent ones.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Times a waiting batch may be overtaken by later ones before it is served next.
pub const MAX_PASSES: u32 = 2;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Waiter {
    /// Arrival order at the lane.
    pub ticket: u64,
    /// None: no stream waits on this batch.
    pub deadline: Option<f64>,
    /// Later batches served before this one.
    pub passed: u32,
}

/// The index in `waiting` of the batch to serve next (None when nobody waits).
pub fn next_holder(waiting: &[Waiter]) -> Option<usize> {
    let starved = waiting.iter().enumerate().filter(|(_, w)| w.passed >= MAX_PASSES).min_by_key(|(_, w)| w.ticket);
    if let Some((i, _)) = starved {
        return Some(i);
    }
    let due = |w: &Waiter| w.deadline.unwrap_or(f64::INFINITY);
    waiting.iter().enumerate()
        .min_by(|(_, a), (_, b)| due(a).total_cmp(&due(b)).then(a.ticket.cmp(&b.ticket)))
        .map(|(i, _)| i)
}

#[derive(Default)]
struct LaneState {
    held: bool,
    next_ticket: u64,
    waiting: Vec<Waiter>,
    grants: u64,
}

/// The lane; replicas hold it through an `Arc`.
#[derive(Default)]
pub struct CodecLane {
    state: Mutex<LaneState>,
    freed: Condvar,
}

impl CodecLane {
    fn lock(&self) -> MutexGuard<'_, LaneState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait until this batch holds the lane; the lane frees when the turn is dropped (also when a
    /// replica's thread unwinds, so a failing replica never holds the others back).
    pub fn turn(self: &Arc<Self>, deadline: Option<f64>) -> LaneTurn {
        self.acquire(deadline);
        LaneTurn { lane: self.clone() }
    }

    /// Wait until this batch holds the lane; every `acquire` is followed by one `release`.
    fn acquire(&self, deadline: Option<f64>) {
        let mut state = self.lock();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.waiting.push(Waiter { ticket, deadline, passed: 0 });
        loop {
            if !state.held {
                let next = next_holder(&state.waiting).expect("this batch waits");
                if state.waiting[next].ticket == ticket {
                    state.waiting.remove(next);
                    for w in state.waiting.iter_mut().filter(|w| w.ticket < ticket) {
                        w.passed += 1;
                    }
                    state.held = true;
                    state.grants += 1;
                    return;
                }
            }
            state = self.freed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn release(&self) {
        let mut state = self.lock();
        state.held = false;
        drop(state);
        self.freed.notify_all();
    }

    /// Batches waiting for the lane now.
    pub fn num_waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Whether a batch holds the lane now.
    pub fn is_held(&self) -> bool {
        self.lock().held
    }

    /// Batches that have held the lane.
    pub fn grants(&self) -> u64 {
        self.lock().grants
    }
}

/// A batch's hold on the lane, freed when dropped.
pub struct LaneTurn {
    lane: Arc<CodecLane>,
}

impl Drop for LaneTurn {
    fn drop(&mut self) {
        self.lane.release();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    fn waiter(ticket: u64, deadline: Option<f64>, passed: u32) -> Waiter {
        Waiter { ticket, deadline, passed }
    }

    #[test]
    fn the_earliest_deadline_goes_first_then_arrival_order() {
        assert_eq!(next_holder(&[]), None);
        let w = [waiter(0, None, 0), waiter(1, Some(5.0), 0), waiter(2, Some(3.0), 0), waiter(3, Some(3.0), 0)];
        assert_eq!(next_holder(&w), Some(2));
        assert_eq!(next_holder(&[waiter(4, None, 0), waiter(2, None, 0)]), Some(1));
    }

    #[test]
    fn a_batch_passed_over_too_often_goes_next() {
        let w = [waiter(0, None, MAX_PASSES), waiter(1, Some(1.0), 0), waiter(2, None, MAX_PASSES + 1)];
        assert_eq!(next_holder(&w), Some(0));
        let w = [waiter(5, Some(9.0), MAX_PASSES - 1), waiter(6, Some(1.0), 0)];
        assert_eq!(next_holder(&w), Some(1));
    }

    /// Replicas waiting while the lane is held are served by deadline when it frees, one at a time.
    #[test]
    fn waiting_replicas_are_served_one_at_a_time_by_deadline() {
        let lane = Arc::new(CodecLane::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        lane.acquire(Some(0.0));
        let mut threads = Vec::new();
        for (i, deadline) in [(0, None), (1, Some(2.0)), (2, Some(1.0))] {
            let (held, order) = (lane.clone(), order.clone());
            threads.push(std::thread::spawn(move || {
                held.acquire(deadline);
                order.lock().unwrap().push(i);
                std::thread::sleep(Duration::from_millis(5)); // holds it: nobody else may enter
                assert_eq!(order.lock().unwrap().last(), Some(&i));
                held.release();
            }));
            while lane.num_waiting() < i + 1 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        lane.release();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(*order.lock().unwrap(), [2, 1, 0]);
        assert_eq!((lane.grants(), lane.num_waiting()), (4, 0));
    }

    #[test]
    fn a_thread_that_panics_while_holding_a_turn_frees_the_lane() {
        let lane = Arc::new(CodecLane::default());
        let held = lane.clone();
        assert!(std::thread::spawn(move || {
            let _turn = held.turn(None);
            panic!("a failing replica");
        }).join().is_err());
        assert!(!lane.is_held());
        drop(lane.turn(Some(1.0)));
        assert_eq!(lane.grants(), 2);
    }

    /// A batch with no stream behind it is not starved by a stream of urgent ones.
    #[test]
    fn a_batch_without_a_deadline_is_served_after_max_passes() {
        let lane = Arc::new(CodecLane::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        lane.acquire(None);
        let spawn = |name: &'static str, deadline: Option<f64>| {
            let (lane, order) = (lane.clone(), order.clone());
            std::thread::spawn(move || {
                lane.acquire(deadline);
                order.lock().unwrap().push(name);
                lane.release();
            })
        };
        let mut threads = vec![spawn("bulk", None)];
        for (k, name) in ["urgent-1", "urgent-2", "urgent-3"].into_iter().enumerate() {
            while lane.num_waiting() < k + 1 {
                std::thread::sleep(Duration::from_millis(1));
            }
            threads.push(spawn(name, Some(k as f64)));
        }
        while lane.num_waiting() < 4 {
            std::thread::sleep(Duration::from_millis(1));
        }
        lane.release();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(*order.lock().unwrap(), ["urgent-1", "urgent-2", "bulk", "urgent-3"]);
    }
}
