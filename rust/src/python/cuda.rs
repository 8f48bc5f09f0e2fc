//! Python bindings of the driver-API calls and the sampling kernels: raw handles in (device
//! ordinal, stream, graph exec, pointers as ints, as PyTorch hands them out), RuntimeError out.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::cuda::{self, kernels, CudaError};

fn err(e: CudaError) -> PyErr {
    PyRuntimeError::new_err(e.0)
}

/// The CUDA driver's version (e.g. 13000), loading libcuda.so.1; RuntimeError without a driver.
#[pyfunction]
fn cuda_driver_version() -> PyResult<i32> {
    cuda::driver_version().map_err(err)
}

#[pyfunction]
fn cuda_device_count() -> PyResult<i32> {
    cuda::device_count().map_err(err)
}

/// `(num_sm, cc_major, cc_minor)` of a device.
#[pyfunction]
fn cuda_device_props(device: i32) -> PyResult<(i32, i32, i32)> {
    let p = cuda::device_props(device).map_err(err)?;
    Ok((p.num_sm, p.cc_major, p.cc_minor))
}

/// Launch an instantiated CUDA graph (`torch.cuda.CUDAGraph.raw_cuda_graph_exec()`) on a stream.
#[pyfunction]
fn graph_launch(device: i32, graph_exec: u64, stream: u64) -> PyResult<()> {
    cuda::graph_launch(device, graph_exec, stream).map_err(err)
}

#[pyfunction]
fn memcpy_htod_async(device: i32, dst: u64, src: u64, num_bytes: usize, stream: u64) -> PyResult<()> {
    cuda::memcpy_htod_async(device, dst, src, num_bytes, stream).map_err(err)
}

#[pyfunction]
fn memcpy_dtoh_async(device: i32, dst: u64, src: u64, num_bytes: usize, stream: u64) -> PyResult<()> {
    cuda::memcpy_dtoh_async(device, dst, src, num_bytes, stream).map_err(err)
}

#[pyfunction]
fn stream_synchronize(device: i32, stream: u64) -> PyResult<()> {
    cuda::stream_synchronize(device, stream).map_err(err)
}

/// A CUDA event (driver API) of one device.
#[pyclass(name = "Event")]
struct PyEvent {
    inner: cuda::Event,
}

#[pymethods]
impl PyEvent {
    #[new]
    #[args(timing = "false")]
    fn new(device: i32, timing: bool) -> PyResult<Self> {
        Ok(PyEvent { inner: cuda::Event::new(device, timing).map_err(err)? })
    }

    fn record(&self, stream: u64) -> PyResult<()> {
        self.inner.record(stream).map_err(err)
    }

    fn query(&self) -> PyResult<bool> {
        self.inner.query().map_err(err)
    }

    fn synchronize(&self, py: Python) -> PyResult<()> {
        py.allow_threads(|| self.inner.synchronize()).map_err(err)
    }

    fn elapsed_ms(&self, end: &PyEvent) -> PyResult<f32> {
        self.inner.elapsed_ms(&end.inner).map_err(err)
    }
}

/// Whether this build embeds the sampling kernels' fatbin.
#[pyfunction]
fn kernels_embedded() -> bool {
    kernels::embedded()
}

/// The SM architectures the embedded kernels were compiled for.
#[pyfunction]
fn kernel_archs() -> Vec<u32> {
    kernels::archs()
}

/// The embedded fatbin itself (for inspection, e.g. `cuobjdump --list-elf`).
#[pyfunction]
fn kernel_fatbin(py: Python<'_>) -> &PyBytes {
    PyBytes::new(py, kernels::fatbin())
}

/// Load the kernels into a device's context now (not during a graph capture).
#[pyfunction]
fn load_kernels(device: i32) -> PyResult<()> {
    kernels::load(device).map_err(err)
}

/// `out[rows, n]` float32 = the reference `hash_uniform(seed, offset, n)` of one salt.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn launch_hash_uniform(device: i32, stream: u64, seed: u64, offset: u64, out: u64, rows: u64, n: u64, salt: u32
                       ) -> PyResult<()> {
    kernels::hash_uniform(device, stream, seed, offset, out, rows, n, salt).map_err(err)
}

/// `out[rows]` int64 = the reference `sample(...)` draw. Every pointer is a device address of a
/// contiguous tensor (`allowed` uint8/bool, `history` int64 `[rows, history_len]`, 0 = none).
#[pyfunction("*", device, stream, logits, out, rows, vocab, temperature, top_k, top_p, min_p, seed, offset, salt,
             allowed = "0", history = "0", history_len = "0", penalty = "0")]
#[allow(clippy::too_many_arguments)]
fn launch_sample(device: i32, stream: u64, logits: u64, out: u64, rows: u32, vocab: i32, temperature: u64,
                 top_k: u64, top_p: u64, min_p: u64, seed: u64, offset: u64, salt: u32, allowed: u64, history: u64,
                 history_len: i32, penalty: u64) -> PyResult<()> {
    if history != 0 && history_len <= 0 {
        return Err(PyValueError::new_err("history_len: must be > 0 with a history"));
    }
    let args = kernels::SampleArgs {
        logits, allowed, history, penalty, temperature, top_k, top_p, min_p, seed, offset, out, vocab,
        history_len, salt,
    };
    kernels::sample(device, stream, rows, args).map_err(err)
}

pub fn register(m: &PyModule) -> PyResult<()> {
    m.add("MAX_SAMPLE_VOCAB", kernels::MAX_SAMPLE_VOCAB)?;
    m.add_class::<PyEvent>()?;
    for f in [
        wrap_pyfunction!(cuda_driver_version, m)?, wrap_pyfunction!(cuda_device_count, m)?,
        wrap_pyfunction!(cuda_device_props, m)?, wrap_pyfunction!(graph_launch, m)?,
        wrap_pyfunction!(memcpy_htod_async, m)?, wrap_pyfunction!(memcpy_dtoh_async, m)?,
        wrap_pyfunction!(stream_synchronize, m)?, wrap_pyfunction!(kernels_embedded, m)?,
        wrap_pyfunction!(kernel_archs, m)?, wrap_pyfunction!(kernel_fatbin, m)?, wrap_pyfunction!(load_kernels, m)?,
        wrap_pyfunction!(launch_hash_uniform, m)?, wrap_pyfunction!(launch_sample, m)?,
    ] {
        m.add_function(f)?;
    }
    Ok(())
}
