//! The sampling kernels (rust/kernels/sampling.cu), compiled by nvcc into a fatbin that is
//! embedded here and loaded per device with the driver API. Launches go to the caller's stream,
//! so they are captured when that stream is capturing a CUDA graph; loading happens outside any
//! capture (`load` at warm-up, or the first launch, which warm-up performs).

use std::ffi::c_void;
use std::os::raw::c_uint;
use std::sync::Mutex;

use super::driver::{check, CuFunction, CuModule, CuStream};
use super::{bind, CudaError, CudaResult};

#[cfg(vox_kernels)]
static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sampling.fatbin"));
#[cfg(not(vox_kernels))]
static FATBIN: &[u8] = &[];

/// Largest vocabulary one sampling block holds in registers (1024 threads x 8 columns; as the
/// Triton sampler).
pub const MAX_SAMPLE_VOCAB: usize = 8192;
const SAMPLE_THREADS: u32 = 1024;
/// Vocabularies up to this take `vox_sample_256` (256 threads x 8 columns).
const SMALL_SAMPLE_VOCAB: usize = 2048;
const SMALL_SAMPLE_THREADS: u32 = 256;
const HASH_THREADS: u32 = 256;

pub fn embedded() -> bool {
    !FATBIN.is_empty()
}

pub fn fatbin() -> &'static [u8] {
    FATBIN
}

/// The SM architectures the fatbin holds code for (VOX_CUDA_ARCHS limited to nvcc's).
pub fn archs() -> Vec<u32> {
    env!("VOX_KERNEL_ARCHS").split(',').filter_map(|a| a.parse().ok()).collect()
}

#[derive(Clone, Copy)]
struct Functions {
    hash_uniform: usize,
    sample: usize,
    sample_256: usize,
}

static LOADED: Mutex<Vec<(i32, Functions)>> = Mutex::new(Vec::new());

/// Load the kernels into `device`'s primary context (once; later calls return at once).
pub fn load(device: i32) -> CudaResult<()> {
    functions(device).map(|_| ())
}

fn functions(device: i32) -> CudaResult<Functions> {
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, f)) = loaded.iter().find(|(d, _)| *d == device) {
        return Ok(*f);
    }
    if !embedded() {
        return Err(CudaError("this build of vox_serve._rt has no CUDA kernels (nvcc was missing at build time)".into()));
    }
    let api = bind(device)?;
    // The driver reads the image through aligned loads: give it an 8-byte-aligned copy.
    let mut image = vec![0u64; (FATBIN.len() + 7) / 8];
    // SAFETY: image holds at least FATBIN.len() bytes.
    unsafe { std::ptr::copy_nonoverlapping(FATBIN.as_ptr(), image.as_mut_ptr() as *mut u8, FATBIN.len()) };
    let mut module: CuModule = std::ptr::null_mut();
    // SAFETY: a complete fatbin image; the module stays loaded for the process.
    check(api, unsafe { (api.module_load_data)(&mut module, image.as_ptr() as *const c_void) },
          "loading the sampling kernels (cuModuleLoadData; is this GPU's architecture in the build's VOX_CUDA_ARCHS?)")?;
    let get = |name: &[u8]| -> CudaResult<usize> {
        let mut f: CuFunction = std::ptr::null_mut();
        // SAFETY: name is NUL-terminated; module is loaded.
        check(api, unsafe { (api.module_get_function)(&mut f, module, name.as_ptr() as *const _) }, "cuModuleGetFunction")?;
        Ok(f as usize)
    };
    // Their shared memory (a few KB static, at most MAX_SAMPLE_VOCAB bytes dynamic) is within the
    // default 48 KB: no opt-in attribute.
    let f = Functions {
        hash_uniform: get(b"vox_hash_uniform\0")?,
        sample: get(b"vox_sample\0")?,
        sample_256: get(b"vox_sample_256\0")?,
    };
    loaded.push((device, f));
    Ok(f)
}

fn launch(device: i32, function: usize, grid: u32, block: u32, shared: u32, stream: u64,
          params: &mut [*mut c_void]) -> CudaResult<()> {
    let api = bind(device)?;
    // SAFETY: params point at values laid out as the kernel's parameters, alive for the call.
    let code = unsafe {
        (api.launch_kernel)(function as CuFunction, grid, 1, 1, block, 1, 1, shared, stream as CuStream,
                            params.as_mut_ptr(), std::ptr::null_mut())
    };
    check(api, code, "cuLaunchKernel")
}

/// `out[r, j] = hash_uniform(seed[r], offset[r], j)` for `rows x n` float32 entries.
pub fn hash_uniform(device: i32, stream: u64, seed: u64, offset: u64, out: u64, rows: u64, n: u64, salt: u32
                    ) -> CudaResult<()> {
    let total = rows * n;
    if total == 0 {
        return Ok(());
    }
    let f = functions(device)?;
    let grid = u32::try_from((total + HASH_THREADS as u64 - 1) / HASH_THREADS as u64)
        .map_err(|_| CudaError(format!("hash_uniform: {total} values exceed one launch")))?;
    let (mut total, mut n, mut salt) = (total as i64, n as i64, salt);
    let (mut seed, mut offset, mut out) = (seed, offset, out);
    let mut params = [&mut seed as *mut u64 as *mut c_void, &mut offset as *mut u64 as *mut c_void,
                      &mut out as *mut u64 as *mut c_void, &mut total as *mut i64 as *mut c_void,
                      &mut n as *mut i64 as *mut c_void, &mut salt as *mut u32 as *mut c_void];
    launch(device, f.hash_uniform, grid, HASH_THREADS, 0, stream, &mut params)
}

/// The kernel's argument block (`SampleArgs` in sampling.cu): device addresses, 0 for none.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct SampleArgs {
    pub logits: u64,
    pub allowed: u64,
    pub history: u64,
    pub penalty: u64,
    pub temperature: u64,
    pub top_k: u64,
    pub top_p: u64,
    pub min_p: u64,
    pub seed: u64,
    pub offset: u64,
    pub out: u64,
    pub vocab: i32,
    pub history_len: i32,
    pub salt: u32,
}

/// The dynamic shared memory of a sampling block: the history marks, a byte per id (the radix
/// selects' histograms and the reduction scratch are static).
fn sample_shared_bytes(vocab: usize) -> usize {
    vocab
}

/// One token per row of `rows x vocab` float32 logits (see sampling.cu for the arguments).
pub fn sample(device: i32, stream: u64, rows: u32, mut args: SampleArgs) -> CudaResult<()> {
    let vocab = args.vocab as usize;
    if vocab == 0 || vocab > MAX_SAMPLE_VOCAB {
        return Err(CudaError(format!("vocab: the sampling kernel takes 1..={MAX_SAMPLE_VOCAB} ids, not {vocab}")));
    }
    if args.history != 0 && args.penalty == 0 {
        return Err(CudaError("penalty: a history needs per-row repetition penalties".into()));
    }
    if rows == 0 {
        return Ok(());
    }
    let f = functions(device)?;
    let (function, threads) =
        if vocab <= SMALL_SAMPLE_VOCAB { (f.sample_256, SMALL_SAMPLE_THREADS) } else { (f.sample, SAMPLE_THREADS) };
    let mut params = [&mut args as *mut SampleArgs as *mut c_void];
    launch(device, function, rows, threads, sample_shared_bytes(vocab) as c_uint, stream, &mut params)
}
