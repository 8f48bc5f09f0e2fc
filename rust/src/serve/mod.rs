//! `_rt.serve(config_json)`: the Rust runtime's entry point (vox_serve/launch.py). Per replica the
//! engine is built by `vox_serve.engine.build_engine` in this interpreter; a scheduler thread then
//! serves it from its spec alone. This build serves bench mode (`--dp-size N`: N replicas, one scheduler thread each); HTTP
//! serving is the next issue.

pub mod attention_plan;
pub mod bench;
#[cfg(test)]
mod bench_tests;
pub mod cuda_launcher;
pub mod engines;
pub mod host_cost;
pub mod peer_copy;
pub mod prompts;
pub mod py_launcher;
pub mod requests;
