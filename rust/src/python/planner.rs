//! Python bindings of FlashInfer's planners: a `Planner` owns the host copy of one integer
//! workspace and plans into it; a plan comes back as (FlashInfer's plan info list, the bytes of
//! the integer workspace that go to the device).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::planner::{self, AttentionShape, Plan, PlannerDevice, PrefillOptions, Workspace};

#[pyclass(name = "Planner")]
struct PyPlanner {
    device: PlannerDevice,
    shape: AttentionShape,
    float_addr: u64,
    float_bytes: u64,
    int_addr: u64,
    host_int: Vec<u8>,
    /// Bytes the last plan wrote: cleared before the next, so alignment gaps read as zeros.
    last_upload: usize,
}

fn finish<'py>(py: Python<'py>, host: &[u8], plan: Result<Plan, String>) -> PyResult<(Vec<i64>, &'py PyBytes)> {
    let plan = plan.map_err(PyValueError::new_err)?;
    Ok((plan.info, PyBytes::new(py, &host[..plan.upload_bytes.min(host.len())])))
}

#[pymethods]
impl PyPlanner {
    /// Device properties (`num_sm`, compute capability, the decode kernel's `decode_blocks_per_sm`),
    /// attention geometry, and the device workspaces (addresses and sizes).
    #[new]
    #[args("*", num_sm, cc_major, cc_minor, num_qo_heads, num_kv_heads, head_dim, page_size, float_workspace_addr,
           float_workspace_bytes, int_workspace_addr, int_workspace_bytes, decode_blocks_per_sm = "1",
           head_dim_vo = "0")]
    #[allow(clippy::too_many_arguments)]
    fn new(num_sm: i32, cc_major: i32, cc_minor: i32, num_qo_heads: u32, num_kv_heads: u32, head_dim: u32,
           page_size: u32, float_workspace_addr: u64, float_workspace_bytes: u64, int_workspace_addr: u64,
           int_workspace_bytes: usize, decode_blocks_per_sm: i32, head_dim_vo: u32) -> PyResult<Self> {
        if int_workspace_bytes == 0 || int_workspace_bytes > (1 << 30) {
            return Err(PyValueError::new_err("int_workspace_bytes: must be 1 byte .. 1 GiB"));
        }
        let head_dim_vo = if head_dim_vo == 0 { head_dim } else { head_dim_vo };
        Ok(PyPlanner {
            device: PlannerDevice { num_sm, cc_major, cc_minor, decode_blocks_per_sm },
            shape: AttentionShape { num_qo_heads, num_kv_heads, head_dim_qk: head_dim, head_dim_vo, page_size },
            float_addr: float_workspace_addr,
            float_bytes: float_workspace_bytes,
            int_addr: int_workspace_addr,
            host_int: vec![0; int_workspace_bytes],
            last_upload: 0,
        })
    }

    /// FlashInfer's decode planner; `indptr`: pages per sequence (CSR, batch + 1 entries).
    #[args(cuda_graph = "false")]
    fn decode<'py>(&mut self, py: Python<'py>, indptr: Vec<i32>, cuda_graph: bool) -> PyResult<(Vec<i64>, &'py PyBytes)> {
        let plan = self.plan(Box::new(|dev, shape, ws| planner::decode(dev, shape, ws, &indptr, cuda_graph)));
        finish(py, &self.host_int, plan)
    }

    /// FlashInfer's (FA2) prefill planner.
    #[args(cuda_graph = "false", "*", window_left = "-1", fixed_split_size = "-1", disable_split_kv = "false",
           num_colocated_ctas = "0")]
    #[allow(clippy::too_many_arguments)]
    fn prefill<'py>(&mut self, py: Python<'py>, qo_indptr: Vec<i32>, kv_indptr: Vec<i32>, total_num_rows: u32,
                    cuda_graph: bool, window_left: i32, fixed_split_size: i32, disable_split_kv: bool,
                    num_colocated_ctas: i64) -> PyResult<(Vec<i64>, &'py PyBytes)> {
        let opts = PrefillOptions { cuda_graph, window_left, fixed_split_size, disable_split_kv, num_colocated_ctas,
                                    sizeof_dtype_o: 2 };
        let plan = self.plan(Box::new(|dev, shape, ws| planner::prefill(dev, shape, ws, &qo_indptr, &kv_indptr, total_num_rows, &opts)));
        finish(py, &self.host_int, plan)
    }

    /// FlashInfer's SM90 prefill planner; `kv_len`: tokens per sequence.
    #[args(causal = "true", cuda_graph = "false")]
    #[allow(clippy::too_many_arguments)]
    fn prefill_sm90<'py>(&mut self, py: Python<'py>, qo_indptr: Vec<i32>, kv_indptr: Vec<i32>, kv_len: Vec<i32>,
                         total_num_rows: u32, causal: bool, cuda_graph: bool) -> PyResult<(Vec<i64>, &'py PyBytes)> {
        let plan = self.plan(Box::new(|dev, shape, ws| {
            planner::prefill_sm90(dev, shape, ws, &qo_indptr, &kv_indptr, &kv_len, total_num_rows, causal, cuda_graph)
        }));
        finish(py, &self.host_int, plan)
    }
}

type PlanFn<'a> = dyn FnOnce(&PlannerDevice, &AttentionShape, &mut Workspace) -> Result<Plan, String> + 'a;

impl PyPlanner {
    fn plan(&mut self, run: Box<PlanFn<'_>>) -> Result<Plan, String> {
        self.host_int[..self.last_upload].fill(0);
        let mut ws = Workspace { float_addr: self.float_addr, float_bytes: self.float_bytes, int_addr: self.int_addr,
                                 host_int: &mut self.host_int };
        let plan = run(&self.device, &self.shape, &mut ws);
        self.last_upload = plan.as_ref().map_or(self.host_int.len(), |p| p.upload_bytes.min(self.host_int.len()));
        plan
    }
}

/// The FlashInfer version the planner was compiled against; None when it was not compiled in.
#[pyfunction]
fn flashinfer_version() -> Option<&'static str> {
    Some(planner::flashinfer_version()).filter(|v| !v.is_empty())
}

#[pyfunction]
fn planner_available() -> bool {
    planner::available()
}

pub fn register(m: &PyModule) -> PyResult<()> {
    m.add_class::<PyPlanner>()?;
    m.add_function(wrap_pyfunction!(flashinfer_version, m)?)?;
    m.add_function(wrap_pyfunction!(planner_available, m)?)?;
    Ok(())
}
