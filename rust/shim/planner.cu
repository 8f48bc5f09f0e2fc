// FlashInfer's host-side attention planners behind a C ABI for the Rust runtime.
//
// The planners are header-only host code (flashinfer/attention/scheduler.cuh, from the installed
// flashinfer-python package). Three things make them usable from Rust without a CUDA runtime:
//   1. Device properties (SM count, compute capability) come from the caller: the few CUDA runtime
//      functions the planners call are defined below and answer from the caller's VoxDeviceProps.
//      Nothing links libcudart, so the process keeps the one runtime PyTorch loaded.
//   2. The planners end by copying the page-locked integer workspace to the device; that copy is
//      recorded instead (VoxPlanOut::int_bytes) and the Rust driver issues it on its launch stream.
//   3. Every FlashInfer exception is caught here and becomes an error code plus message: nothing
//      unwinds into Rust.
// The decode planner's work estimation needs the occupancy of FlashInfer's decode kernel, which
// only the GPU knows; the caller passes it (decode_blocks_per_sm).

#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

#include <flashinfer/attention/scheduler.cuh>

namespace {

struct VoxDeviceProps {
  int32_t num_sm;
  int32_t cc_major;
  int32_t cc_minor;
  int32_t decode_blocks_per_sm;
};

// One planner call at a time per thread: the runtime stubs below read the caller's properties.
thread_local const VoxDeviceProps* g_props = nullptr;
thread_local uint64_t g_copied_bytes = 0;

struct PlanParams {  // what DecodePlan reads from its Params type
  using IdType = int32_t;
  using DTypeO = uint16_t;
};

}  // namespace

// ---- the CUDA runtime entry points the planner headers reference (hidden in the extension) ----
// Host pass only: the device pass has its own (device-runtime) declarations of these names.
#if !defined(__CUDA_ARCH__)
extern "C" {
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  if (g_props == nullptr) return cudaErrorInvalidValue;
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = g_props->num_sm; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = g_props->cc_major; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = g_props->cc_minor; return cudaSuccess;
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t cudaMemcpyAsync(void*, const void*, size_t count, cudaMemcpyKind, cudaStream_t) {
  g_copied_bytes = count;
  return cudaSuccess;
}

const char* cudaGetErrorString(cudaError_t) { return "a CUDA runtime call the planner shim does not provide"; }

// nvcc registers every translation unit's (here empty) device code with the runtime at load time.
void** __cudaRegisterFatBinary(void*) {
  static void* handle = nullptr;
  return &handle;
}
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}
char __cudaInitModule(void**) { return 0; }
}
#endif

namespace {

int fail(char* err, size_t err_len, const char* message) {
  if (err != nullptr && err_len > 0) {
    std::strncpy(err, message, err_len - 1);
    err[err_len - 1] = '\0';
  }
  return 1;
}

template <typename Plan>
int guarded(const VoxDeviceProps* props, uint64_t* int_bytes, char* err, size_t err_len, Plan plan) {
  if (props == nullptr || props->num_sm <= 0) return fail(err, err_len, "device properties: num_sm must be > 0");
  g_props = props;
  g_copied_bytes = 0;
  int code = 0;
  try {
    cudaError_t status = plan();
    if (status != cudaSuccess) code = fail(err, err_len, "the planner's CUDA query failed (device properties)");
  } catch (const std::exception& e) {
    code = fail(err, err_len, e.what());
  } catch (...) {
    code = fail(err, err_len, "the planner threw a non-standard exception");
  }
  *int_bytes = g_copied_bytes;
  g_props = nullptr;
  return code;
}

// FlashInfer's decode work estimation with the kernel's occupancy given by the caller.
cudaError_t decode_work_estimation(bool& split_kv, uint32_t& max_grid_size, uint32_t& max_num_pages_per_batch,
                                   uint32_t& new_batch_size, uint32_t& gdy, uint32_t batch_size, int32_t* kv_indptr_h,
                                   uint32_t num_kv_heads, uint32_t page_size, bool enable_cuda_graph) {
  gdy = num_kv_heads;
  max_grid_size = uint32_t(g_props->decode_blocks_per_sm) * uint32_t(g_props->num_sm);
  if (batch_size * gdy >= max_grid_size) {
    split_kv = false;
    max_num_pages_per_batch = 1;
    for (uint32_t i = 0; i < batch_size; ++i) {
      max_num_pages_per_batch = std::max<uint32_t>(max_num_pages_per_batch, kv_indptr_h[i + 1] - kv_indptr_h[i]);
    }
    new_batch_size = batch_size;
    return cudaSuccess;
  }
  std::vector<int32_t> num_pages(batch_size);
  for (uint32_t i = 0; i < batch_size; ++i) num_pages[i] = kv_indptr_h[i + 1] - kv_indptr_h[i];
  std::tie(max_num_pages_per_batch, new_batch_size) = flashinfer::PartitionPagedKVCacheBinarySearchMinNumPagePerBatch(
      max_grid_size, gdy, num_pages, std::max(128 / page_size, 1U));
  // Short sequences skip the split-kv kernel unless a CUDA graph fixes the launch shape.
  split_kv = !(new_batch_size == batch_size && !enable_cuda_graph);
  return cudaSuccess;
}

template <uint32_t HEAD_DIM>
cudaError_t decode_plan(void* float_ws, size_t float_bytes, void* int_ws, void* pinned, size_t int_bytes,
                        flashinfer::DecodePlanInfo& info, int32_t* indptr, uint32_t batch_size, uint32_t num_qo_heads,
                        uint32_t num_kv_heads, uint32_t page_size, bool cuda_graph) {
  auto estimate = [num_kv_heads](bool& split_kv, uint32_t& max_grid, uint32_t& max_pages, uint32_t& new_batch,
                                 uint32_t& gdy, uint32_t batch, int32_t* kv_indptr, uint32_t, uint32_t page,
                                 bool graph, cudaStream_t) {
    return decode_work_estimation(split_kv, max_grid, max_pages, new_batch, gdy, batch, kv_indptr, num_kv_heads, page,
                                  graph);
  };
  return flashinfer::DecodePlan<HEAD_DIM, flashinfer::PosEncodingMode::kNone, void, PlanParams>(
      float_ws, float_bytes, int_ws, pinned, int_bytes, info, indptr, batch_size, num_qo_heads, page_size, cuda_graph,
      nullptr, estimate);
}

template <typename Info>
void write_info(const Info& info, int64_t* out, int32_t* out_len) {
  std::vector<int64_t> values = info.ToVector();
  for (size_t i = 0; i < values.size() && i < 16; ++i) out[i] = values[i];
  *out_len = int32_t(values.size());
}

}  // namespace

extern "C" {

// Workspace arguments: float_ws / int_ws are the device workspaces' addresses (only offsets are
// computed from them, never dereferenced); pinned is the host buffer the plan is written into.
int vox_decode_plan(const VoxDeviceProps* props, uint64_t float_ws, uint64_t float_bytes, uint64_t int_ws,
                    void* pinned, uint64_t int_bytes, int32_t* indptr, uint32_t batch_size, uint32_t num_qo_heads,
                    uint32_t num_kv_heads, uint32_t page_size, uint32_t head_dim, bool cuda_graph, int64_t* info_out,
                    int32_t* info_len, uint64_t* upload_bytes, char* err, size_t err_len) {
  return guarded(props, upload_bytes, err, err_len, [&]() -> cudaError_t {
    flashinfer::DecodePlanInfo info;
    void* fws = reinterpret_cast<void*>(float_ws);
    void* iws = reinterpret_cast<void*>(int_ws);
    cudaError_t status;
    switch (head_dim) {
      case 64: status = decode_plan<64>(fws, float_bytes, iws, pinned, int_bytes, info, indptr, batch_size,
                                        num_qo_heads, num_kv_heads, page_size, cuda_graph); break;
      case 128: status = decode_plan<128>(fws, float_bytes, iws, pinned, int_bytes, info, indptr, batch_size,
                                          num_qo_heads, num_kv_heads, page_size, cuda_graph); break;
      case 256: status = decode_plan<256>(fws, float_bytes, iws, pinned, int_bytes, info, indptr, batch_size,
                                          num_qo_heads, num_kv_heads, page_size, cuda_graph); break;
      default: FLASHINFER_ERROR("head_dim must be 64, 128 or 256, not " + std::to_string(head_dim));
    }
    write_info(info, info_out, info_len);
    return status;
  });
}

int vox_prefill_plan(const VoxDeviceProps* props, uint64_t float_ws, uint64_t float_bytes, uint64_t int_ws,
                     void* pinned, uint64_t int_bytes, int32_t* qo_indptr, int32_t* kv_indptr, uint32_t total_num_rows,
                     uint32_t batch_size, uint32_t num_qo_heads, uint32_t num_kv_heads, uint32_t head_dim_qk,
                     uint32_t head_dim_vo, uint32_t page_size, bool cuda_graph, uint32_t sizeof_dtype_o,
                     int32_t window_left, int32_t fixed_split_size, bool disable_split_kv, int64_t num_colocated_ctas,
                     int64_t* info_out, int32_t* info_len, uint64_t* upload_bytes, char* err, size_t err_len) {
  return guarded(props, upload_bytes, err, err_len, [&]() -> cudaError_t {
    flashinfer::PrefillPlanInfo info;
    cudaError_t status = flashinfer::PrefillPlan<int32_t>(
        reinterpret_cast<void*>(float_ws), float_bytes, reinterpret_cast<void*>(int_ws), pinned, int_bytes, info,
        qo_indptr, kv_indptr, total_num_rows, batch_size, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo,
        page_size, cuda_graph, sizeof_dtype_o, window_left, fixed_split_size, disable_split_kv, num_colocated_ctas,
        nullptr);
    write_info(info, info_out, info_len);
    return status;
  });
}

int vox_prefill_sm90_plan(const VoxDeviceProps* props, uint64_t float_ws, uint64_t float_bytes, uint64_t int_ws,
                          void* pinned, uint64_t int_bytes, int32_t* qo_indptr, int32_t* kv_indptr, int32_t* kv_len,
                          uint32_t total_num_rows, uint32_t batch_size, uint32_t num_qo_heads, uint32_t num_kv_heads,
                          uint32_t head_dim_qk, uint32_t head_dim_vo, uint32_t page_size, bool causal, bool cuda_graph,
                          uint32_t sizeof_dtype_o, int64_t* info_out, int32_t* info_len, uint64_t* upload_bytes,
                          char* err, size_t err_len) {
  return guarded(props, upload_bytes, err, err_len, [&]() -> cudaError_t {
    flashinfer::PrefillPlanSM90Info info;
    cudaError_t status = flashinfer::PrefillSM90Plan<int32_t>(
        reinterpret_cast<void*>(float_ws), float_bytes, reinterpret_cast<void*>(int_ws), pinned, int_bytes, info,
        qo_indptr, kv_indptr, kv_len, total_num_rows, batch_size, num_qo_heads, num_kv_heads, head_dim_qk,
        head_dim_vo, page_size, causal, cuda_graph, sizeof_dtype_o, nullptr);
    write_info(info, info_out, info_len);
    return status;
  });
}

}  // extern "C"
