// Sampling kernels of the captured stages, loaded from the extension's embedded fatbin with the
// driver API (rust/src/cuda/kernels.rs) and launched on the caller's stream, so they can run inside
// a CUDA-graph capture.
//
// They compute what vox_serve/rt/kernels.py (the reference) computes:
// - vox_hash_uniform: the counter-based uniforms of `hash_uniform`, bit for bit (uint32 arithmetic
//   wraps exactly like the reference's masked int64 arithmetic);
// - vox_sample: `sample`: allowed mask, repetition penalty, temperature, softmax, top-k / top-p /
//   min-p over the descending order (ties by ascending id), renormalisation, then the exponential
//   race argmax(p / -log U) over the same uniforms. Greedy rows (temperature <= 0) take the argmax.
//   One block per row, on one of two paths (chosen per row, so a block never diverges):
//   - rows with top_p < 1 need the cumulative mass in descending order: a bitonic sort of the row's
//     keys in shared memory, then scans over the ranks;
//   - the others (top_p >= 1, and greedy rows) need no order: each thread keeps its columns in
//     registers; the rank-0 token is a block argmax, and top-k keeps the keys up to the k-th
//     smallest, found by a radix select (8 bits a pass, integer counts, so deterministic).
// Probabilities can differ from the reference's in the last bits (sums in another order), so a
// draw whose top-p boundary or race is tied to the last bit can pick another token; greedy rows and
// the RNG bits are exact.

#include <stdint.h>

namespace {

constexpr int kThreads = 1024;
constexpr int kMaxPerThread = 8;  // sort_len <= 8192
constexpr uint32_t kNegInfBits = 0xFF800000u;
constexpr uint32_t kGolden = 0x9E3779B9u;

__device__ __forceinline__ uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}

__device__ __forceinline__ uint32_t mix_word(uint32_t key, uint32_t word) {
  return fmix32(((key ^ word) * kGolden) ^ 0x7F4A7C15u);
}

// The per-(seed, offset) key of the reference's `_hash_bits`: the four 32-bit words of seed and
// offset (two's complement) mixed into the salt.
__device__ __forceinline__ uint32_t hash_key(int64_t seed, int64_t offset, uint32_t salt) {
  const uint64_t s = static_cast<uint64_t>(seed), o = static_cast<uint64_t>(offset);
  uint32_t key = salt;
  key = mix_word(key, static_cast<uint32_t>(s));
  key = mix_word(key, static_cast<uint32_t>(s >> 32));
  key = mix_word(key, static_cast<uint32_t>(o));
  return mix_word(key, static_cast<uint32_t>(o >> 32));
}

// (k + 0.5) * 2^-23 for the top 23 bits k: exact in float32, strictly inside (0, 1).
__device__ __forceinline__ float hash_uniform_at(uint32_t key, uint32_t column) {
  const uint32_t bits = fmix32(fmix32(key + column * kGolden) ^ key);
  return (static_cast<float>(bits >> 9) + 0.5f) * (1.0f / 8388608.0f);
}

// Order-preserving map of float bits to uint32 (larger float -> larger integer).
__device__ __forceinline__ uint32_t float_order(float z) {
  const uint32_t bits = __float_as_uint(z);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ float order_float(uint32_t order) {
  return __uint_as_float((order & 0x80000000u) ? (order & 0x7FFFFFFFu) : ~order);
}

// The filtered logit a sort key carries in its upper word (inverted order).
__device__ __forceinline__ float sorted_logit(uint64_t key) { return order_float(~static_cast<uint32_t>(key >> 32)); }

template <typename T, typename Op>
__device__ T block_reduce(T value, T* scratch, Op op) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int d = 16; d > 0; d >>= 1) value = op(value, __shfl_xor_sync(0xFFFFFFFFu, value, d));
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = scratch[lane];
  for (int d = 16; d > 0; d >>= 1) value = op(value, __shfl_xor_sync(0xFFFFFFFFu, value, d));
  return value;
}

// Exclusive prefix sum over the threads' values (in thread order), in double.
__device__ double block_exclusive_scan(double value, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double inclusive = value;
  for (int d = 1; d < 32; d <<= 1) {
    const double up = __shfl_up_sync(0xFFFFFFFFu, inclusive, d);
    if (lane >= d) inclusive += up;
  }
  __syncthreads();
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    double total = scratch[lane], run = total;
    for (int d = 1; d < 32; d <<= 1) {
      const double up = __shfl_up_sync(0xFFFFFFFFu, run, d);
      if (lane >= d) run += up;
    }
    scratch[lane] = run - total;  // warp offsets
  }
  __syncthreads();
  return scratch[warp] + inclusive - value;
}

struct ScoreId {
  float score;
  int32_t id;
};

__device__ __forceinline__ ScoreId better(ScoreId a, ScoreId b) {
  // Higher score wins; among equal scores the lower id (the reference's argmax over ids).
  return (b.score > a.score || (b.score == a.score && b.id < a.id)) ? b : a;
}

__device__ __forceinline__ ScoreId shfl_xor(ScoreId v, int d) {
  return {__shfl_xor_sync(0xFFFFFFFFu, v.score, d), __shfl_xor_sync(0xFFFFFFFFu, v.id, d)};
}

__device__ ScoreId block_argmax(ScoreId value, ScoreId* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int d = 16; d > 0; d >>= 1) value = better(value, shfl_xor(value, d));
  __syncthreads();
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = scratch[lane];
  for (int d = 16; d > 0; d >>= 1) value = better(value, shfl_xor(value, d));
  return value;
}

// Ascending bitonic sort of `n` (a power of two) keys in shared memory.
__device__ void bitonic_sort(uint64_t* keys, int n) {
  for (int k = 2; k <= n; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < n; i += kThreads) {
        const int partner = i ^ j;
        if (partner > i) {
          const uint64_t a = keys[i], b = keys[partner];
          if ((a > b) == ((i & k) == 0)) {
            keys[i] = b;
            keys[partner] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

struct SampleArgs {
  const float* logits;          // [rows, vocab]
  const uint8_t* allowed;       // [rows, vocab] or null; 0 bans a token
  const int64_t* history;       // [rows, history_len] or null; -1 marks an empty slot
  const float* penalty;         // [rows] (read only with history)
  const float* temperature;     // [rows]; <= 0 is greedy
  const int64_t* top_k;         // [rows]; <= 0 disables
  const float* top_p;           // [rows]; >= 1 disables
  const float* min_p;           // [rows]; 0 disables
  const int64_t* seed;          // [rows]
  const int64_t* offset;        // [rows]
  int64_t* out;                 // [rows]
  int32_t vocab;
  int32_t history_len;
  int32_t sort_len;             // power of two >= max(vocab, kThreads)
  uint32_t salt;
};

// A row's sort key: the inverted order of its filtered logit above the token id, so ascending keys
// give descending logits with ties by ascending id (the reference's stable descending sort).
__device__ __forceinline__ uint64_t rank_key(float z, int col) {
  return (static_cast<uint64_t>(~float_order(z)) << 32) | static_cast<uint32_t>(col);
}

// The row's repetition-penalty marks: present[col] = 1 for the tokens of its history.
__device__ void mark_history(const SampleArgs& a, int64_t row, uint8_t* present) {
  for (int col = threadIdx.x; col < a.vocab; col += kThreads) present[col] = 0;
  __syncthreads();
  if (a.history != nullptr) {
    for (int j = threadIdx.x; j < a.history_len; j += kThreads) {
      const int64_t token = a.history[row * a.history_len + j];
      if (token >= 0 && token < a.vocab) present[token] = 1;
    }
  }
  __syncthreads();
}

// The filtered logit of a column (< vocab): allowed mask, repetition penalty, temperature.
__device__ __forceinline__ float filtered_logit(const SampleArgs& a, int64_t row, int col, const uint8_t* present) {
  const float temperature = a.temperature[row];
  const float divisor = temperature <= 0.0f ? 1.0f : temperature;
  const float factor = a.history != nullptr ? a.penalty[row] : 1.0f;
  float x = a.logits[row * a.vocab + col];
  if (a.allowed != nullptr && a.allowed[row * a.vocab + col] == 0) x = __uint_as_float(kNegInfBits);
  if (present[col]) x = x > 0.0f ? x / factor : x * factor;
  return x / divisor;
}

// Sort keys of the row's columns, padded with -inf keys past the vocabulary up to sort_len.
__device__ void write_sort_keys(const SampleArgs& a, int64_t row, uint64_t* keys, uint8_t* present) {
  mark_history(a, row, present);
  for (int col = threadIdx.x; col < a.sort_len; col += kThreads) {
    const float z = col < a.vocab ? filtered_logit(a, row, col, present) : __uint_as_float(kNegInfBits);
    keys[col] = rank_key(z, col);
  }
  __syncthreads();
}

struct Add {
  __device__ double operator()(double x, double y) const { return x + y; }
};

// The race score of a kept probability (0 for a filtered token); U is strictly inside (0, 1), so
// -log U is finite and positive.
__device__ __forceinline__ float race_score(float prob, float kept_total, uint32_t key, int32_t id) {
  return (prob / kept_total) / -logf(hash_uniform_at(key, static_cast<uint32_t>(id)));
}

struct Scratch {
  double* sum;
  ScoreId* arg;
};

// ---- rows with top_p < 1: the sorted order ---------------------------------------------------

__device__ int32_t sample_sorted(const SampleArgs& a, int64_t row, uint64_t* keys, uint8_t* present, Scratch s) {
  write_sort_keys(a, row, keys, present);
  bitonic_sort(keys, a.sort_len);

  // Each thread owns `per` (<= kMaxPerThread) consecutive ranks of the sorted row (loops unrolled to
  // kMaxPerThread keep probs in registers).
  const int per = a.sort_len / kThreads, first = threadIdx.x * per;
  const float top = sorted_logit(keys[0]);
  float probs[kMaxPerThread];
  double local = 0.0;
#pragma unroll
  for (int i = 0; i < kMaxPerThread && i < per; ++i) {
    probs[i] = expf(sorted_logit(keys[first + i]) - top);
    local += probs[i];
  }
  const float total = static_cast<float>(block_reduce(local, s.sum, Add()));
  const int64_t top_k = a.top_k[row];
  local = 0.0;
#pragma unroll
  for (int i = 0; i < kMaxPerThread && i < per; ++i) {
    probs[i] /= total;
    if (top_k <= 0 || first + i < top_k) local += probs[i];
  }
  // Top-p is measured on the renormalised top-k distribution: against top_p * (top-k mass).
  const float mass_k = static_cast<float>(block_reduce(local, s.sum, Add()));
  local = 0.0;
#pragma unroll
  for (int i = 0; i < kMaxPerThread && i < per; ++i) local += probs[i];
  double cumulative = block_exclusive_scan(local, s.sum);

  const bool greedy = a.temperature[row] <= 0.0f;
  const float top_p = a.top_p[row];
  const float min_prob = a.min_p[row] * (1.0f / total);  // rank 0 has probability exp(0) / total
  local = 0.0;
#pragma unroll
  for (int i = 0; i < kMaxPerThread && i < per; ++i) {
    const int rank = first + i;
    cumulative += probs[i];
    const float mass_before = static_cast<float>(cumulative) - probs[i];  // the reference's cumsum - p
    bool keep = (top_k <= 0 || rank < top_k) && (top_p >= 1.0f || mass_before < top_p * mass_k);
    keep = (keep && probs[i] >= min_prob) || rank == 0;
    probs[i] = keep && (!greedy || rank == 0) ? probs[i] : 0.0f;
    local += probs[i];
  }
  const float kept_total = static_cast<float>(block_reduce(local, s.sum, Add()));

  const uint32_t key = hash_key(a.seed[row], a.offset[row], a.salt);
  ScoreId best = {-1.0f, 0x7FFFFFFF};
#pragma unroll
  for (int i = 0; i < kMaxPerThread && i < per; ++i) {
    const int32_t id = static_cast<int32_t>(keys[first + i] & 0xFFFFFFFFu);
    if (id < a.vocab) best = better(best, {race_score(probs[i], kept_total, key, id), id});
  }
  return block_argmax(best, s.arg).id;
}

// ---- rows with top_p >= 1 (and greedy rows): no order needed ---------------------------------

// A thread's i-th column: strided, so loads coalesce; columns >= vocab hold nothing.
__device__ __forceinline__ int column(int i) { return static_cast<int>(threadIdx.x) + i * kThreads; }

static_assert(kThreads * kMaxPerThread <= 65536, "the radix select counts 16 id bits");

// Radix-select state in shared memory: a histogram, then the chosen bin, the rank inside it and
// whether that rank is the bin's last.
constexpr int kBins = 256, kBinOut = kBins, kRankOut = kBins + 1, kLastOut = kBins + 2;
constexpr int kSelectWords = kBins + 3;

// Warp 0: the bin holding the counted key of 0-based `rank`; each lane scans 8 bins.
__device__ void pick_bin(uint32_t* hist, uint32_t rank) {
  const int lane = threadIdx.x, base = lane * (kBins / 32);
  uint32_t sum = 0;
  for (int b = 0; b < kBins / 32; ++b) sum += hist[base + b];
  uint32_t inclusive = sum;
  for (int d = 1; d < 32; d <<= 1) {
    const uint32_t up = __shfl_up_sync(0xFFFFFFFFu, inclusive, d);
    if (lane >= d) inclusive += up;
  }
  uint32_t before = inclusive - sum;
  if (rank < before || rank >= inclusive) return;
  for (int b = 0; b < kBins / 32; ++b) {
    const uint32_t count = hist[base + b];
    if (rank < before + count) {
      hist[kBinOut] = base + b;
      hist[kRankOut] = rank - before;
      hist[kLastOut] = rank - before + 1 == count;
      return;
    }
    before += count;
  }
}

// Top-k keeps a key iff (key & mask) <= prefix.
struct KthKey {
  uint64_t prefix, mask;
};

// The key of 0-based `rank` among the row's (unique) keys, radix-selected 8 bits a pass over the
// high word, then over the id's 16 low bits (the bits between are 0). It stops at the first pass
// whose chosen bin ends at that rank: every key of that bin is then <= the wanted one.
__device__ KthKey select_kth(const float (&z)[kMaxPerThread], int vocab, uint32_t rank, uint32_t* hist) {
  KthKey kth = {0, 0};
  for (int pass = 0; pass < 6; ++pass) {
    const int shift = pass < 4 ? 56 - 8 * pass : 8 * (5 - pass);  // 56, 48, 40, 32, 8, 0
    if (threadIdx.x < kBins) hist[threadIdx.x] = 0;
    __syncthreads();  // also: every thread has read the previous pass's choice
#pragma unroll
    for (int i = 0; i < kMaxPerThread; ++i) {
      const uint64_t key = rank_key(z[i], column(i));
      if (column(i) < vocab && (key & kth.mask) == kth.prefix) atomicAdd(&hist[(key >> shift) & 0xFFu], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 32) pick_bin(hist, rank);
    __syncthreads();
    kth.prefix |= static_cast<uint64_t>(hist[kBinOut]) << shift;
    kth.mask |= 0xFFull << shift;
    rank = hist[kRankOut];
    if (hist[kLastOut]) break;
  }
  return kth;
}

// The thread's filtered logits; -0 reads as +0 so that keys order them equal, as the reference's
// sort does (the sorted path keeps the raw bits).
__device__ void load_logits(const SampleArgs& a, int64_t row, const uint8_t* present, float (&z)[kMaxPerThread]) {
#pragma unroll
  for (int i = 0; i < kMaxPerThread; ++i) {
    const float x = column(i) < a.vocab ? filtered_logit(a, row, column(i), present) : __uint_as_float(kNegInfBits);
    z[i] = x == 0.0f ? 0.0f : x;
  }
}

// Bit i set: the thread's i-th column is within the top k (all of them without a top-k).
__device__ uint32_t top_k_columns(const SampleArgs& a, int64_t row, const float (&z)[kMaxPerThread], uint32_t* hist) {
  const int64_t top_k = a.top_k[row];
  KthKey kth = {~0ull, ~0ull};
  if (top_k > 0 && top_k < a.vocab) kth = select_kth(z, a.vocab, static_cast<uint32_t>(top_k - 1), hist);
  uint32_t bits = 0;
#pragma unroll
  for (int i = 0; i < kMaxPerThread; ++i) {
    if (column(i) < a.vocab && (rank_key(z[i], column(i)) & kth.mask) <= kth.prefix) bits |= 1u << i;
  }
  return bits;
}

__device__ int32_t sample_unsorted(const SampleArgs& a, int64_t row, uint32_t* hist, uint8_t* present, Scratch s) {
  mark_history(a, row, present);
  float z[kMaxPerThread];
  load_logits(a, row, present, z);
  ScoreId first = {__uint_as_float(kNegInfBits), 0x7FFFFFFF};  // rank 0: the max, ties to the lowest id
#pragma unroll
  for (int i = 0; i < kMaxPerThread; ++i) {
    if (column(i) < a.vocab) first = better(first, {z[i], column(i)});
  }
  first = block_argmax(first, s.arg);
  if (a.temperature[row] <= 0.0f) return first.id;

  const uint32_t in_top_k = top_k_columns(a, row, z, hist);
  float probs[kMaxPerThread];
  double local = 0.0;
#pragma unroll
  for (int i = 0; i < kMaxPerThread; ++i) {
    probs[i] = column(i) < a.vocab ? expf(z[i] - first.score) : 0.0f;
    local += probs[i];
  }
  const float total = static_cast<float>(block_reduce(local, s.sum, Add()));
  const float min_prob = a.min_p[row] * (1.0f / total);  // rank 0 has probability exp(0) / total
  local = 0.0;
#pragma unroll
  for (int i = 0; i < kMaxPerThread; ++i) {
    probs[i] /= total;
    const bool keep = (((in_top_k >> i) & 1u) && probs[i] >= min_prob) || column(i) == first.id;
    probs[i] = keep ? probs[i] : 0.0f;
    local += probs[i];
  }
  const float kept_total = static_cast<float>(block_reduce(local, s.sum, Add()));

  const uint32_t key = hash_key(a.seed[row], a.offset[row], a.salt);
  ScoreId best = {-1.0f, 0x7FFFFFFF};
#pragma unroll
  for (int i = 0; i < kMaxPerThread; ++i) {
    if (column(i) < a.vocab) best = better(best, {race_score(probs[i], kept_total, key, column(i)), column(i)});
  }
  return block_argmax(best, s.arg).id;
}

}  // namespace

extern "C" __global__ void vox_hash_uniform(const int64_t* seed, const int64_t* offset, float* out, int64_t total,
                                            int64_t n, uint32_t salt) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t row = i / n;
  out[i] = hash_uniform_at(hash_key(seed[row], offset[row], salt), static_cast<uint32_t>(i % n));
}

// One block of kThreads per row; dynamic shared memory: sort_len * 8 + vocab bytes (the sort keys,
// or the radix select's words, then the history marks).
extern "C" __global__ void __launch_bounds__(kThreads) vox_sample(SampleArgs a) {
  extern __shared__ uint64_t keys[];
  __shared__ double sum_scratch[32];
  __shared__ ScoreId arg_scratch[32];
  static_assert(kSelectWords * 4 <= kThreads * 8, "sort_len >= kThreads");
  uint8_t* present = reinterpret_cast<uint8_t*>(keys + a.sort_len);
  const int64_t row = blockIdx.x;
  const Scratch s = {sum_scratch, arg_scratch};
  // Greedy rows keep rank 0 whatever top_p is; a NaN top_p takes the sorted path (which keeps rank 0).
  const bool sorted = !(a.top_p[row] >= 1.0f) && a.temperature[row] > 0.0f;
  const int32_t token = sorted ? sample_sorted(a, row, keys, present, s)
                               : sample_unsorted(a, row, reinterpret_cast<uint32_t*>(keys), present, s);
  if (threadIdx.x == 0) a.out[row] = token;
}
