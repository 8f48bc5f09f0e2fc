//! FlashInfer's attention planners, compiled in from the installed package's headers
//! (rust/shim/planner.cu). A plan is the planner's info vector (what FlashInfer's run functions
//! take, e.g. `wrapper._plan_info`) plus the integer workspace it wrote into host memory; the first
//! `upload_bytes` of that buffer go to the device integer workspace before the launch.

use std::os::raw::c_char;

/// Device properties the planners read (the shim answers FlashInfer's CUDA queries from these).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PlannerDevice {
    pub num_sm: i32,
    pub cc_major: i32,
    pub cc_minor: i32,
    /// Occupancy of FlashInfer's (CUDA-core) decode kernel: blocks per SM. Only the decode planner
    /// reads it; the GPU reports it for the compiled kernel.
    pub decode_blocks_per_sm: i32,
}

/// Attention geometry of one model.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub num_qo_heads: u32,
    pub num_kv_heads: u32,
    pub head_dim_qk: u32,
    pub head_dim_vo: u32,
    pub page_size: u32,
}

/// The workspaces of one planned launch: device addresses (offsets are computed from them, they
/// are never dereferenced here) and the host buffer the integer workspace is written into.
pub struct Workspace<'a> {
    pub float_addr: u64,
    pub float_bytes: u64,
    pub int_addr: u64,
    /// As long as the device integer workspace.
    pub host_int: &'a mut [u8],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub info: Vec<i64>,
    pub upload_bytes: usize,
}

/// Settings of FlashInfer's (FA2) prefill planner beyond the geometry; `Default` is what the
/// Python wrapper passes when its arguments are left at their defaults.
#[derive(Debug, Clone, Copy)]
pub struct PrefillOptions {
    pub cuda_graph: bool,
    pub window_left: i32,
    pub fixed_split_size: i32,
    pub disable_split_kv: bool,
    pub num_colocated_ctas: i64,
    pub sizeof_dtype_o: u32,
}

impl Default for PrefillOptions {
    fn default() -> Self {
        PrefillOptions { cuda_graph: false, window_left: -1, fixed_split_size: -1, disable_split_kv: false,
                         num_colocated_ctas: 0, sizeof_dtype_o: 2 }
    }
}

/// The FlashInfer version the planner was compiled against ("" when it was not compiled in).
pub fn flashinfer_version() -> &'static str {
    env!("VOX_FLASHINFER_VERSION")
}

pub fn available() -> bool {
    cfg!(vox_planner)
}

fn check_indptr(name: &str, indptr: &[i32], batch_size: usize) -> Result<(), String> {
    if indptr.len() != batch_size + 1 {
        return Err(format!("{name}: {} entries for {batch_size} sequences (need batch + 1)", indptr.len()));
    }
    if indptr[0] != 0 || indptr.windows(2).any(|w| w[1] < w[0]) {
        return Err(format!("{name}: must start at 0 and never decrease"));
    }
    Ok(())
}

fn check_workspace(ws: &Workspace) -> Result<(), String> {
    if ws.float_addr == 0 || ws.int_addr == 0 {
        return Err("workspace: device addresses must be non-null".into());
    }
    if ws.host_int.is_empty() {
        return Err("workspace: the host integer buffer is empty".into());
    }
    Ok(())
}

#[cfg(vox_planner)]
mod ffi {
    use super::PlannerDevice;
    use std::os::raw::c_char;

    extern "C" {
        pub fn vox_decode_plan(props: *const PlannerDevice, float_ws: u64, float_bytes: u64, int_ws: u64,
                               pinned: *mut u8, int_bytes: u64, indptr: *mut i32, batch_size: u32, num_qo_heads: u32,
                               num_kv_heads: u32, page_size: u32, head_dim: u32, cuda_graph: bool, info: *mut i64,
                               info_len: *mut i32, upload: *mut u64, err: *mut c_char, err_len: usize) -> i32;
        pub fn vox_prefill_plan(props: *const PlannerDevice, float_ws: u64, float_bytes: u64, int_ws: u64,
                                pinned: *mut u8, int_bytes: u64, qo_indptr: *mut i32, kv_indptr: *mut i32,
                                total_num_rows: u32, batch_size: u32, num_qo_heads: u32, num_kv_heads: u32,
                                head_dim_qk: u32, head_dim_vo: u32, page_size: u32, cuda_graph: bool,
                                sizeof_dtype_o: u32, window_left: i32, fixed_split_size: i32, disable_split_kv: bool,
                                num_colocated_ctas: i64, info: *mut i64, info_len: *mut i32, upload: *mut u64,
                                err: *mut c_char, err_len: usize) -> i32;
        pub fn vox_prefill_sm90_plan(props: *const PlannerDevice, float_ws: u64, float_bytes: u64, int_ws: u64,
                                     pinned: *mut u8, int_bytes: u64, qo_indptr: *mut i32, kv_indptr: *mut i32,
                                     kv_len: *mut i32, total_num_rows: u32, batch_size: u32, num_qo_heads: u32,
                                     num_kv_heads: u32, head_dim_qk: u32, head_dim_vo: u32, page_size: u32,
                                     causal: bool, cuda_graph: bool, sizeof_dtype_o: u32, info: *mut i64,
                                     info_len: *mut i32, upload: *mut u64, err: *mut c_char, err_len: usize) -> i32;
    }
}

#[cfg_attr(not(vox_planner), allow(dead_code))]
/// Runs one shim call with the output slots it fills; an error code becomes the shim's message.
fn call(run: impl FnOnce(*mut i64, *mut i32, *mut u64, *mut c_char, usize) -> i32) -> Result<Plan, String> {
    let mut info = [0i64; 16];
    let mut info_len = 0i32;
    let mut upload = 0u64;
    let mut err = [0 as c_char; 512];
    let code = run(info.as_mut_ptr(), &mut info_len, &mut upload, err.as_mut_ptr(), err.len());
    if code != 0 {
        // SAFETY: the shim NUL-terminates its message within err.
        let message = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned();
        return Err(format!("FlashInfer planner: {message}"));
    }
    Ok(Plan { info: info[..info_len.max(0) as usize].to_vec(), upload_bytes: upload as usize })
}

#[cfg(not(vox_planner))]
fn missing() -> Result<Plan, String> {
    Err("this build of vox_serve._rt has no FlashInfer planner (nvcc or the flashinfer-python headers were missing at build time)".into())
}

/// FlashInfer's decode planner (CUDA-core decode kernels). `indptr`: pages per sequence (CSR).
#[allow(unused_variables)]
pub fn decode(dev: &PlannerDevice, shape: &AttentionShape, ws: &mut Workspace, indptr: &[i32], cuda_graph: bool
              ) -> Result<Plan, String> {
    let batch = indptr.len().saturating_sub(1);
    check_indptr("indptr", indptr, batch)?;
    check_workspace(ws)?;
    if shape.head_dim_qk != shape.head_dim_vo {
        return Err("head_dim: the decode planner needs equal qk and vo head dims".into());
    }
    if shape.num_kv_heads == 0 || shape.num_qo_heads % shape.num_kv_heads != 0 {
        return Err(format!("num_qo_heads {} must be a multiple of num_kv_heads {}", shape.num_qo_heads, shape.num_kv_heads));
    }
    if dev.decode_blocks_per_sm <= 0 {
        return Err("decode_blocks_per_sm must be > 0".into());
    }
    #[cfg(vox_planner)]
    {
        let mut indptr = indptr.to_vec();
        let host = ws.host_int.as_mut_ptr();
        let host_len = ws.host_int.len() as u64;
        call(|info, len, up, err, err_len| unsafe {
            // SAFETY: every pointer is valid for the lengths passed; the shim catches all exceptions.
            ffi::vox_decode_plan(dev, ws.float_addr, ws.float_bytes, ws.int_addr, host, host_len, indptr.as_mut_ptr(),
                                 batch as u32, shape.num_qo_heads, shape.num_kv_heads, shape.page_size,
                                 shape.head_dim_qk, cuda_graph, info, len, up, err, err_len)
        })
    }
    #[cfg(not(vox_planner))]
    missing()
}

/// FlashInfer's (FA2) prefill planner, which also serves the tensor-core decode path.
/// `qo_indptr`: query rows per sequence; `kv_indptr`: pages per sequence (CSR).
#[allow(unused_variables)]
pub fn prefill(dev: &PlannerDevice, shape: &AttentionShape, ws: &mut Workspace, qo_indptr: &[i32], kv_indptr: &[i32],
               total_num_rows: u32, opts: &PrefillOptions) -> Result<Plan, String> {
    let batch = qo_indptr.len().saturating_sub(1);
    check_indptr("qo_indptr", qo_indptr, batch)?;
    check_indptr("kv_indptr", kv_indptr, batch)?;
    check_workspace(ws)?;
    #[cfg(vox_planner)]
    {
        let (mut qo, mut kv) = (qo_indptr.to_vec(), kv_indptr.to_vec());
        let host = ws.host_int.as_mut_ptr();
        let host_len = ws.host_int.len() as u64;
        call(|info, len, up, err, err_len| unsafe {
            // SAFETY: as in decode().
            ffi::vox_prefill_plan(dev, ws.float_addr, ws.float_bytes, ws.int_addr, host, host_len, qo.as_mut_ptr(),
                                  kv.as_mut_ptr(), total_num_rows, batch as u32, shape.num_qo_heads,
                                  shape.num_kv_heads, shape.head_dim_qk, shape.head_dim_vo, shape.page_size,
                                  opts.cuda_graph, opts.sizeof_dtype_o, opts.window_left, opts.fixed_split_size,
                                  opts.disable_split_kv, opts.num_colocated_ctas, info, len, up, err, err_len)
        })
    }
    #[cfg(not(vox_planner))]
    missing()
}

/// FlashInfer's SM90 (FA3) prefill planner: the `auto` backend of the prefill wrapper on Hopper.
/// `kv_len`: tokens per sequence.
#[allow(unused_variables, clippy::too_many_arguments)]
pub fn prefill_sm90(dev: &PlannerDevice, shape: &AttentionShape, ws: &mut Workspace, qo_indptr: &[i32],
                    kv_indptr: &[i32], kv_len: &[i32], total_num_rows: u32, causal: bool, cuda_graph: bool
                    ) -> Result<Plan, String> {
    let batch = qo_indptr.len().saturating_sub(1);
    check_indptr("qo_indptr", qo_indptr, batch)?;
    check_indptr("kv_indptr", kv_indptr, batch)?;
    if kv_len.len() != batch {
        return Err(format!("kv_len: {} entries for {batch} sequences", kv_len.len()));
    }
    check_workspace(ws)?;
    #[cfg(vox_planner)]
    {
        let (mut qo, mut kv, mut lens) = (qo_indptr.to_vec(), kv_indptr.to_vec(), kv_len.to_vec());
        let host = ws.host_int.as_mut_ptr();
        let host_len = ws.host_int.len() as u64;
        call(|info, len, up, err, err_len| unsafe {
            // SAFETY: as in decode().
            ffi::vox_prefill_sm90_plan(dev, ws.float_addr, ws.float_bytes, ws.int_addr, host, host_len,
                                       qo.as_mut_ptr(), kv.as_mut_ptr(), lens.as_mut_ptr(), total_num_rows,
                                       batch as u32, shape.num_qo_heads, shape.num_kv_heads, shape.head_dim_qk,
                                       shape.head_dim_vo, shape.page_size, causal, cuda_graph, 2, info, len, up, err,
                                       err_len)
        })
    }
    #[cfg(not(vox_planner))]
    missing()
}
