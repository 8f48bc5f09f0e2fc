//! The CUDA driver API, resolved at run time from `libcuda.so.1` (the NVIDIA driver's library).
//!
//! The extension never links or bundles a CUDA runtime: PyTorch has already loaded one, and its
//! streams, graphs and allocations live in the device's primary context, which the driver API
//! reaches directly. On a machine without a driver, `api()` returns an error naming the library.

use std::ffi::{c_void, CStr};
use std::os::raw::{c_char, c_int, c_uint};
use std::sync::Mutex;

use libloading::Library;

pub type CuResult = c_int;
pub type CuDevice = c_int;
pub type CuContext = *mut c_void;
pub type CuStream = *mut c_void;
pub type CuEvent = *mut c_void;
pub type CuGraphExec = *mut c_void;
pub type CuModule = *mut c_void;
pub type CuFunction = *mut c_void;
pub type CuDevicePtr = u64;

pub const CUDA_SUCCESS: CuResult = 0;
pub const CUDA_ERROR_NOT_READY: CuResult = 600;
/// cuCtxEnablePeerAccess on a context that already has it: not a failure.
pub const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CuResult = 704;
pub const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
pub const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: c_int = 8;

/// An error from the driver (or from loading it), with the call that failed.
#[derive(Debug, Clone)]
pub struct CudaError(pub String);

impl std::fmt::Display for CudaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub type CudaResult<T> = Result<T, CudaError>;

macro_rules! driver_api {
    ($($field:ident: $symbol:literal => fn($($arg:ty),*);)*) => {
        /// Entry points of libcuda.so.1 (the `_v2` names where the ABI changed).
        pub struct Api {
            _lib: Library,
            $(pub $field: unsafe extern "C" fn($($arg),*) -> CuResult,)*
        }

        impl Api {
            fn load() -> Result<Api, String> {
                // SAFETY: loading the NVIDIA driver library runs its initialisers, which is what
                // every CUDA program does; the symbols are looked up with their documented types.
                unsafe {
                    let lib = Library::new("libcuda.so.1")
                        .map_err(|e| format!("the CUDA driver (libcuda.so.1) could not be loaded: {e}"))?;
                    $(
                        let $field = *lib
                            .get::<unsafe extern "C" fn($($arg),*) -> CuResult>(concat!($symbol, "\0").as_bytes())
                            .map_err(|e| format!("libcuda.so.1 has no {}: {e}", $symbol))?;
                    )*
                    Ok(Api { _lib: lib, $($field,)* })
                }
            }
        }
    };
}

driver_api! {
    init: "cuInit" => fn(c_uint);
    driver_get_version: "cuDriverGetVersion" => fn(*mut c_int);
    get_error_string: "cuGetErrorString" => fn(CuResult, *mut *const c_char);
    device_get_count: "cuDeviceGetCount" => fn(*mut c_int);
    device_get: "cuDeviceGet" => fn(*mut CuDevice, c_int);
    device_get_attribute: "cuDeviceGetAttribute" => fn(*mut c_int, c_int, CuDevice);
    primary_ctx_retain: "cuDevicePrimaryCtxRetain" => fn(*mut CuContext, CuDevice);
    ctx_get_current: "cuCtxGetCurrent" => fn(*mut CuContext);
    ctx_set_current: "cuCtxSetCurrent" => fn(CuContext);
    graph_launch: "cuGraphLaunch" => fn(CuGraphExec, CuStream);
    memcpy_htod_async: "cuMemcpyHtoDAsync_v2" => fn(CuDevicePtr, *const c_void, usize, CuStream);
    mem_host_alloc: "cuMemHostAlloc" => fn(*mut *mut c_void, usize, c_uint);
    mem_free_host: "cuMemFreeHost" => fn(*mut c_void);
    memcpy_dtoh_async: "cuMemcpyDtoHAsync_v2" => fn(*mut c_void, CuDevicePtr, usize, CuStream);
    memcpy_peer_async: "cuMemcpyPeerAsync" => fn(CuDevicePtr, CuContext, CuDevicePtr, CuContext, usize, CuStream);
    device_can_access_peer: "cuDeviceCanAccessPeer" => fn(*mut c_int, CuDevice, CuDevice);
    ctx_enable_peer_access: "cuCtxEnablePeerAccess" => fn(CuContext, c_uint);
    stream_wait_event: "cuStreamWaitEvent" => fn(CuStream, CuEvent, c_uint);
    stream_synchronize: "cuStreamSynchronize" => fn(CuStream);
    event_create: "cuEventCreate" => fn(*mut CuEvent, c_uint);
    event_record: "cuEventRecord" => fn(CuEvent, CuStream);
    event_query: "cuEventQuery" => fn(CuEvent);
    event_synchronize: "cuEventSynchronize" => fn(CuEvent);
    event_elapsed_time: "cuEventElapsedTime" => fn(*mut f32, CuEvent, CuEvent);
    event_destroy: "cuEventDestroy_v2" => fn(CuEvent);
    module_load_data: "cuModuleLoadData" => fn(*mut CuModule, *const c_void);
    module_get_function: "cuModuleGetFunction" => fn(*mut CuFunction, CuModule, *const c_char);
    func_set_attribute: "cuFuncSetAttribute" => fn(CuFunction, c_int, c_int);
    launch_kernel: "cuLaunchKernel" => fn(CuFunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CuStream, *mut *mut c_void, *mut *mut c_void);
}

static API: Mutex<Option<Result<&'static Api, String>>> = Mutex::new(None);

/// The driver API, loaded and initialised once per process.
pub fn api() -> CudaResult<&'static Api> {
    let mut slot = API.lock().unwrap_or_else(|e| e.into_inner());
    if slot.is_none() {
        *slot = Some(Api::load().and_then(|api| {
            let api: &'static Api = Box::leak(Box::new(api));
            // SAFETY: cuInit(0) is the documented first call; it is idempotent.
            let code = unsafe { (api.init)(0) };
            if code != CUDA_SUCCESS {
                return Err(format!("cuInit failed: {} (no usable NVIDIA GPU?)", describe(api, code)));
            }
            Ok(api)
        }));
    }
    slot.clone().unwrap().map_err(CudaError)
}

fn describe(api: &Api, code: CuResult) -> String {
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string (or leaves it null).
    unsafe { (api.get_error_string)(code, &mut text) };
    if text.is_null() {
        return format!("CUDA error {code}");
    }
    // SAFETY: the driver's error strings are NUL-terminated and static.
    let name = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    format!("{name} (CUDA error {code})")
}

/// `Ok(())` for CUDA_SUCCESS, else an error naming `what`.
pub fn check(api: &Api, code: CuResult, what: &str) -> CudaResult<()> {
    if code == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError(format!("{what}: {}", describe(api, code))))
    }
}
