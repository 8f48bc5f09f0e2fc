//! The scheduler's clock: monotonic seconds while serving, or a virtual clock that only the
//! simulated engine moves (vox_serve/sim/clock.py).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

fn process_start() -> Instant {
    // A Mutex, not OnceLock: the crate builds with Rust 1.63 (Debian's toolchain).
    static START: Mutex<Option<Instant>> = Mutex::new(None);
    *START.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(Instant::now)
}

/// Seconds on the process's monotonic clock.
pub fn monotonic() -> f64 {
    process_start().elapsed().as_secs_f64()
}

#[derive(Debug, Clone)]
pub enum Clock {
    Monotonic,
    /// Shared by the scheduler and the simulated engine (f64 bits).
    Virtual(Arc<AtomicU64>),
}

impl Clock {
    pub fn virtual_at(start: f64) -> Clock {
        Clock::Virtual(Arc::new(AtomicU64::new(start.to_bits())))
    }

    pub fn now(&self) -> f64 {
        match self {
            Clock::Monotonic => monotonic(),
            Clock::Virtual(t) => f64::from_bits(t.load(Ordering::Relaxed)),
        }
    }

    /// Move a virtual clock forward by `seconds` (never back).
    pub fn advance(&self, seconds: f64) {
        assert!(seconds >= 0.0, "time cannot go back ({seconds} s)");
        self.set(self.now() + seconds);
    }

    /// Move a virtual clock to `when` if it is later than now.
    pub fn advance_to(&self, when: f64) {
        if when > self.now() {
            self.set(when);
        }
    }

    fn set(&self, t: f64) {
        match self {
            Clock::Monotonic => panic!("the monotonic clock cannot be moved"),
            Clock::Virtual(v) => v.store(t.to_bits(), Ordering::Relaxed),
        }
    }
}
