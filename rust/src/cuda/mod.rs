//! CUDA through the driver API: contexts, graph launches, async copies, events, and the embedded
//! sampling kernels. Every call names the device whose primary context (the one PyTorch's runtime
//! uses) it runs in, and takes streams, graphs and pointers as the raw handles PyTorch hands out.

pub mod driver;
pub mod kernels;

use std::ffi::c_void;
use std::os::raw::c_int;
use std::sync::Mutex;

pub use driver::{CudaError, CudaResult};
use driver::{api, check, Api, CuContext, CuEvent, CuStream};

/// Primary contexts retained so far, by device ordinal (as addresses: raw pointers are not Send).
static CONTEXTS: Mutex<Vec<(i32, usize)>> = Mutex::new(Vec::new());

/// The driver API with `device`'s primary context current on this thread.
pub fn bind(device: i32) -> CudaResult<&'static Api> {
    let api = api()?;
    let ctx = primary_context(api, device)?;
    let mut current: CuContext = std::ptr::null_mut();
    // SAFETY: plain driver calls with valid out-pointers; ctx came from cuDevicePrimaryCtxRetain.
    unsafe {
        check(api, (api.ctx_get_current)(&mut current), "cuCtxGetCurrent")?;
        if current != ctx {
            check(api, (api.ctx_set_current)(ctx), "cuCtxSetCurrent")?;
        }
    }
    Ok(api)
}

fn primary_context(api: &'static Api, device: i32) -> CudaResult<CuContext> {
    let mut contexts = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, ctx)) = contexts.iter().find(|(d, _)| *d == device) {
        return Ok(*ctx as CuContext);
    }
    let count = device_count()?;
    if device < 0 || device >= count {
        return Err(CudaError(format!("device {device} does not exist ({count} CUDA devices)")));
    }
    let mut dev = 0;
    let mut ctx: CuContext = std::ptr::null_mut();
    // SAFETY: valid out-pointers; the retained context stays alive for the process.
    unsafe {
        check(api, (api.device_get)(&mut dev, device), "cuDeviceGet")?;
        check(api, (api.primary_ctx_retain)(&mut ctx, dev), "cuDevicePrimaryCtxRetain")?;
    }
    contexts.push((device, ctx as usize));
    Ok(ctx)
}

pub fn driver_version() -> CudaResult<i32> {
    let api = api()?;
    let mut version = 0;
    // SAFETY: valid out-pointer.
    check(api, unsafe { (api.driver_get_version)(&mut version) }, "cuDriverGetVersion")?;
    Ok(version)
}

pub fn device_count() -> CudaResult<i32> {
    let api = api()?;
    let mut count = 0;
    // SAFETY: valid out-pointer.
    check(api, unsafe { (api.device_get_count)(&mut count) }, "cuDeviceGetCount")?;
    Ok(count)
}

/// What the attention planner needs to know about a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceProps {
    pub num_sm: i32,
    pub cc_major: i32,
    pub cc_minor: i32,
}

pub fn device_props(device: i32) -> CudaResult<DeviceProps> {
    let api = bind(device)?;
    let get = |attr: c_int| -> CudaResult<i32> {
        let mut value = 0;
        // SAFETY: valid out-pointer; `device` was validated by bind().
        check(api, unsafe { (api.device_get_attribute)(&mut value, attr, device) }, "cuDeviceGetAttribute")?;
        Ok(value)
    };
    Ok(DeviceProps {
        num_sm: get(driver::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        cc_major: get(driver::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        cc_minor: get(driver::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    })
}

/// Launch an instantiated graph (`cudaGraphExec_t`, e.g. `CUDAGraph.raw_cuda_graph_exec()`).
pub fn graph_launch(device: i32, graph_exec: u64, stream: u64) -> CudaResult<()> {
    if graph_exec == 0 {
        return Err(CudaError("graph_exec: a null graph handle".to_string()));
    }
    let api = bind(device)?;
    // SAFETY: the caller guarantees the handle is a live graph exec of this device.
    check(api, unsafe { (api.graph_launch)(graph_exec as *mut c_void, stream as CuStream) }, "cuGraphLaunch")
}

/// Asynchronous host-to-device copy on `stream` (pinned `src` for a truly async copy).
pub fn memcpy_htod_async(device: i32, dst: u64, src: u64, num_bytes: usize, stream: u64) -> CudaResult<()> {
    let api = bind(device)?;
    // SAFETY: the caller guarantees both ranges are valid for num_bytes until the copy completes.
    let code = unsafe { (api.memcpy_htod_async)(dst, src as *const c_void, num_bytes, stream as CuStream) };
    check(api, code, "cuMemcpyHtoDAsync")
}

/// Asynchronous device-to-host copy on `stream`.
pub fn memcpy_dtoh_async(device: i32, dst: u64, src: u64, num_bytes: usize, stream: u64) -> CudaResult<()> {
    let api = bind(device)?;
    // SAFETY: as memcpy_htod_async.
    let code = unsafe { (api.memcpy_dtoh_async)(dst as *mut c_void, src, num_bytes, stream as CuStream) };
    check(api, code, "cuMemcpyDtoHAsync")
}

/// Asynchronous copy from `src` on device `src_device` to `dst` on `dst_device`, on `stream` (one of
/// `dst_device`'s): direct where peer access is enabled, else staged by the driver, never through
/// memory of ours.
pub fn memcpy_peer_async(dst_device: i32, dst: u64, src_device: i32, src: u64, num_bytes: usize, stream: u64)
                         -> CudaResult<()> {
    let api = bind(dst_device)?;
    let (dst_ctx, src_ctx) = (primary_context(api, dst_device)?, primary_context(api, src_device)?);
    // SAFETY: the caller guarantees both device ranges are valid for num_bytes until the copy completes.
    let code = unsafe { (api.memcpy_peer_async)(dst, dst_ctx, src, src_ctx, num_bytes, stream as CuStream) };
    check(api, code, "cuMemcpyPeerAsync")
}

/// Let `device`'s context access `peer`'s memory directly; false where the two devices cannot
/// (copies between them are then staged by the driver).
pub fn enable_peer_access(device: i32, peer: i32) -> CudaResult<bool> {
    let api = bind(device)?;
    let (mut dev, mut peer_dev, mut can) = (0, 0, 0);
    // SAFETY: valid out-pointers; the ordinals are checked by bind() and cuDeviceGet.
    unsafe {
        check(api, (api.device_get)(&mut dev, device), "cuDeviceGet")?;
        check(api, (api.device_get)(&mut peer_dev, peer), "cuDeviceGet")?;
        check(api, (api.device_can_access_peer)(&mut can, dev, peer_dev), "cuDeviceCanAccessPeer")?;
    }
    if can == 0 {
        return Ok(false);
    }
    let peer_ctx = primary_context(api, peer)?;
    // SAFETY: `device`'s context is current (bind); peer_ctx is a retained primary context.
    let code = unsafe { (api.ctx_enable_peer_access)(peer_ctx, 0) };
    if code == driver::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(true);
    }
    check(api, code, "cuCtxEnablePeerAccess").map(|_| true)
}

/// Work queued on `stream` (of `device`) after this call waits for `event` (of any device).
pub fn stream_wait_event(device: i32, stream: u64, event: &Event) -> CudaResult<()> {
    let api = bind(device)?;
    // SAFETY: the event is live; the caller guarantees the stream handle is.
    check(api, unsafe { (api.stream_wait_event)(stream as CuStream, event.raw(), 0) }, "cuStreamWaitEvent")
}

pub fn stream_synchronize(device: i32, stream: u64) -> CudaResult<()> {
    let api = bind(device)?;
    // SAFETY: the caller guarantees the stream handle is live.
    check(api, unsafe { (api.stream_synchronize)(stream as CuStream) }, "cuStreamSynchronize")
}

/// Page-locked host memory (`cuMemHostAlloc`, portable), zeroed, freed on drop: what asynchronous
/// host-to-device copies read from without staging.
pub struct PinnedHost {
    device: i32,
    ptr: usize,
    len: usize,
}

impl PinnedHost {
    pub fn new(device: i32, len: usize) -> CudaResult<PinnedHost> {
        let api = bind(device)?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; flag 1 = CU_MEMHOSTALLOC_PORTABLE.
        check(api, unsafe { (api.mem_host_alloc)(&mut ptr, len.max(1), 1) }, "cuMemHostAlloc")?;
        // SAFETY: the allocation is len bytes long.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, len) };
        Ok(PinnedHost { device, ptr: ptr as usize, len })
    }

    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        if let Ok(api) = bind(self.device) {
            // SAFETY: allocated by cuMemHostAlloc and freed once.
            unsafe { (api.mem_free_host)(self.ptr as *mut c_void) };
        }
    }
}

/// A CUDA event of one device, destroyed on drop.
pub struct Event {
    device: i32,
    raw: usize,
}

impl Event {
    pub fn new(device: i32, timing: bool) -> CudaResult<Event> {
        let api = bind(device)?;
        let mut raw: CuEvent = std::ptr::null_mut();
        let flags = if timing { 0 } else { driver::CU_EVENT_DISABLE_TIMING };
        // SAFETY: valid out-pointer.
        check(api, unsafe { (api.event_create)(&mut raw, flags) }, "cuEventCreate")?;
        Ok(Event { device, raw: raw as usize })
    }

    fn raw(&self) -> CuEvent {
        self.raw as CuEvent
    }

    pub fn record(&self, stream: u64) -> CudaResult<()> {
        let api = bind(self.device)?;
        // SAFETY: the event is live; the caller guarantees the stream handle is.
        check(api, unsafe { (api.event_record)(self.raw(), stream as CuStream) }, "cuEventRecord")
    }

    /// Whether all work recorded before the event has completed (never blocks).
    pub fn query(&self) -> CudaResult<bool> {
        let api = bind(self.device)?;
        // SAFETY: the event is live.
        let code = unsafe { (api.event_query)(self.raw()) };
        if code == driver::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check(api, code, "cuEventQuery").map(|_| true)
    }

    pub fn synchronize(&self) -> CudaResult<()> {
        let api = bind(self.device)?;
        // SAFETY: the event is live.
        check(api, unsafe { (api.event_synchronize)(self.raw()) }, "cuEventSynchronize")
    }

    /// Milliseconds from `self` to `end` (both recorded, with timing enabled).
    pub fn elapsed_ms(&self, end: &Event) -> CudaResult<f32> {
        let api = bind(self.device)?;
        let mut ms = 0.0f32;
        // SAFETY: both events are live.
        check(api, unsafe { (api.event_elapsed_time)(&mut ms, self.raw(), end.raw()) }, "cuEventElapsedTime")?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(api) = bind(self.device) {
            // SAFETY: the event is live and dropped once.
            unsafe { (api.event_destroy)(self.raw()) };
        }
    }
}
