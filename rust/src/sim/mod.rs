//! The simulated engine on the Rust side (vox_serve/sim/): a cost model, a worker that checks the
//! plan contract, and a driver that plays the clients of a scenario. The shared scenario tests
//! (tests/test_scheduler_scenarios.py) run both schedulers against it and the Python one.

pub mod cost;
pub mod driver;
pub mod worker;

pub use driver::simulate;
