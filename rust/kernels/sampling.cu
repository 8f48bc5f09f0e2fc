// Sampling kernels of the captured stages, loaded from the extension's embedded fatbin with the
// driver API (rust/src/cuda/kernels.rs) and launched on the caller's stream, so they can run inside
// a CUDA-graph capture.
//
// They compute what vox_serve/rt/kernels.py (the reference) computes:
// - vox_hash_uniform: the counter-based uniforms of `hash_uniform`, bit for bit (uint32 arithmetic
//   wraps exactly like the reference's masked int64 arithmetic);
// - vox_sample (1024 threads, vocab <= 8192) and vox_sample_256 (256 threads, vocab <= 2048):
//   `sample`: allowed mask, repetition penalty, temperature, softmax, top-k / top-p / min-p over the
//   descending order (ties by ascending id), renormalisation, then the exponential race
//   argmax(p / -log U) over the same uniforms. One block per row; each thread keeps 8 strided
//   columns in registers, and nothing is sorted. A column's rank key is its filtered logit's
//   inverted order above its id, so ascending keys are the reference's stable descending order:
//   - rank 0 is a block argmax; greedy rows (temperature <= 0) stop there;
//   - top-k keeps the keys up to the k-th smallest, found by a radix select (8 bits a pass,
//     integer counts);
//   - top-p (top_p < 1, or NaN) keeps the ranks whose mass before them, within the top k, is below
//     top_p times the top-k mass: a prefix of the ranks, whose last key a second radix select finds
//     from histograms of counts and of probability mass per bin. The mass is summed in 2^-40 fixed
//     point with integer atomics, so both selects are deterministic;
//   - min-p, rank 0 always kept, the renormalisation and the race as in the reference.
// Probabilities can differ from the reference's in the last bits (sums in another order, the top-p
// mass in fixed point rather than a float32 cumsum), so a draw whose top-p boundary or race is tied
// to the last bit can pick another token; greedy rows and the RNG bits are exact.

#include <stdint.h>

namespace {

constexpr int kPerThread = 8;  // the columns a thread holds in registers: vocab <= Threads * 8
constexpr uint32_t kNegInfBits = 0xFF800000u;
constexpr uint32_t kGolden = 0x9E3779B9u;
using u64 = unsigned long long;  // the 64-bit integer type of atomicAdd and the shuffles

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

struct ScoreId {
  float score;
  int32_t id;
};

// Loses to every column's value: the identity of the argmax reductions.
__device__ __forceinline__ ScoreId no_score() { return {__uint_as_float(kNegInfBits), 0x7FFFFFFF}; }

__device__ __forceinline__ ScoreId better(ScoreId a, ScoreId b) {
  // Higher score wins; among equal scores the lower id (the reference's argmax over ids).
  return (b.score > a.score || (b.score == a.score && b.id < a.id)) ? b : a;
}

struct Better {
  __device__ ScoreId operator()(ScoreId a, ScoreId b) const { return better(a, b); }
};

struct Add {
  template <typename T>
  __device__ T operator()(T x, T y) const { return x + y; }
};

__device__ __forceinline__ double shfl_xor(double v, int d) { return __shfl_xor_sync(0xFFFFFFFFu, v, d); }
__device__ __forceinline__ u64 shfl_xor(u64 v, int d) { return __shfl_xor_sync(0xFFFFFFFFu, v, d); }
__device__ __forceinline__ ScoreId shfl_xor(ScoreId v, int d) {
  return {__shfl_xor_sync(0xFFFFFFFFu, v.score, d), __shfl_xor_sync(0xFFFFFFFFu, v.id, d)};
}

// The block's reduction of `value` (op commutative and associative; every thread gets the same
// result). Threads / 32 warps write their partials; lanes past the last warp read `identity`.
template <int Threads, typename T, typename Op>
__device__ T block_reduce(T value, T* scratch, Op op, T identity) {
  static_assert(Threads % 32 == 0 && Threads <= 1024, "whole warps, at most 32 of them");
  constexpr int kWarps = Threads / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int d = 16; d > 0; d >>= 1) value = op(value, shfl_xor(value, d));
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = lane < kWarps ? scratch[lane] : identity;
  for (int d = 16; d > 0; d >>= 1) value = op(value, shfl_xor(value, d));
  return value;
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
  uint32_t salt;
};

// A column's rank key: the inverted order of its filtered logit above the token id, so ascending
// keys give descending logits with ties by ascending id (the reference's stable descending sort).
__device__ __forceinline__ uint64_t rank_key(float z, int col) {
  return (static_cast<uint64_t>(~float_order(z)) << 32) | static_cast<uint32_t>(col);
}

// A thread's i-th column: strided, so loads coalesce; columns >= vocab hold nothing.
template <int Threads>
__device__ __forceinline__ int column(int i) { return static_cast<int>(threadIdx.x) + i * Threads; }

// The row's repetition-penalty marks: present[col] = 1 for the tokens of its history.
template <int Threads>
__device__ void mark_history(const SampleArgs& a, int64_t row, uint8_t* present) {
  for (int col = threadIdx.x; col < a.vocab; col += Threads) present[col] = 0;
  __syncthreads();
  if (a.history != nullptr) {
    for (int j = threadIdx.x; j < a.history_len; j += Threads) {
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

// The race score of a kept probability (0 for a filtered token); U is strictly inside (0, 1), so
// -log U is finite and positive.
__device__ __forceinline__ float race_score(float prob, float kept_total, uint32_t key, int32_t id) {
  return (prob / kept_total) / -logf(hash_uniform_at(key, static_cast<uint32_t>(id)));
}

// ---- radix selects over the rank keys ----------------------------------------------------------

// 8 bits a pass over the high word (shifts 56, 48, 40, 32), then over the id's 16 low bits (8, 0);
// the bits between are 0.
constexpr int kBins = 256;
constexpr int kPasses = 6;
__device__ __forceinline__ int pass_shift(int pass) { return pass < 4 ? 56 - 8 * pass : 8 * (5 - pass); }

// Radix-select state in shared memory: the histograms of a pass, then warp 0's choice. A pass
// zeroes only the histograms, so the choice of the previous pass stays readable until warp 0
// overwrites it, after the pass's second barrier (which every thread reaches after reading it).
struct RadixState {
  u64 mass[kBins];      // per bin: the counted keys' probability mass, 2^-40 fixed point (top-p)
  uint32_t count[kBins];  // per bin: how many counted keys
  u64 before;           // choice: the mass of the counted keys below the chosen bin, plus the earlier passes' (top-p)
  uint32_t bin;         // choice: the chosen bin
  uint32_t rank;        // choice: the wanted rank inside it (top-k)
  uint32_t last;        // choice: whether the select ends in that bin
};

// Adds a counted key (and its fixed-point mass, < 2^41) to its bin. Called by every lane of the warp
// (uniform control flow): the lanes of one bin are summed in registers and their lowest lane adds the
// sums, so a bin shared by a whole warp (the first passes, where most keys have the same top bits) takes
// one pair of shared-memory atomics instead of 32 serialised ones (top-p at 4097 ids: 26 us, from 66). The mass is summed as two 21-bit halves
// (__reduce_add_sync sums 32-bit words; 32 halves fit).
__device__ __forceinline__ void count_in_bin(RadixState& r, uint32_t bin, bool counted, u64 mass) {
  const uint32_t voters = __ballot_sync(0xFFFFFFFFu, counted);
  if (!counted) return;
  const uint32_t peers = __match_any_sync(voters, bin);
  const uint32_t low = __reduce_add_sync(peers, static_cast<uint32_t>(mass & 0x1FFFFFu));
  const uint32_t high = __reduce_add_sync(peers, static_cast<uint32_t>(mass >> 21));
  if ((threadIdx.x & 31) != static_cast<uint32_t>(__ffs(peers) - 1)) return;
  atomicAdd(&r.count[bin], static_cast<uint32_t>(__popc(peers)));
  const u64 total = (static_cast<u64>(high) << 21) + low;
  if (total != 0) atomicAdd(&r.mass[bin], total);
}

// The selects' result: a key is at or below the selected one iff (key & mask) <= prefix.
struct KthKey {
  uint64_t prefix, mask;
};

// Warp 0: the bin holding the counted key of 0-based `rank`; each lane scans 8 bins.
__device__ void pick_kth_bin(RadixState& r, uint32_t rank) {
  const int lane = threadIdx.x, base = lane * (kBins / 32);
  uint32_t sum = 0;
  for (int b = 0; b < kBins / 32; ++b) sum += r.count[base + b];
  uint32_t inclusive = sum;
  for (int d = 1; d < 32; d <<= 1) {
    const uint32_t up = __shfl_up_sync(0xFFFFFFFFu, inclusive, d);
    if (lane >= d) inclusive += up;
  }
  uint32_t before = inclusive - sum;
  if (rank < before || rank >= inclusive) return;
  for (int b = 0; b < kBins / 32; ++b) {
    const uint32_t count = r.count[base + b];
    if (rank < before + count) {
      r.bin = base + b;
      r.rank = rank - before;
      r.last = rank - before + 1 == count;
      return;
    }
    before += count;
  }
}

// The key of 0-based `rank` among the row's (unique) keys, radix-selected 8 bits a pass. It stops at
// the first pass whose chosen bin ends at that rank: every key of that bin is then <= the wanted one.
template <int Threads>
__device__ KthKey select_kth(const float (&z)[kPerThread], int vocab, uint32_t rank, RadixState& r) {
  static_assert(Threads >= kBins, "one thread zeroes each bin");
  static_assert(Threads * kPerThread <= 65536, "the radix select counts 16 id bits");
  KthKey kth = {0, 0};
  for (int pass = 0; pass < kPasses; ++pass) {
    const int shift = pass_shift(pass);
    if (threadIdx.x < kBins) r.count[threadIdx.x] = 0;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const uint64_t key = rank_key(z[i], column<Threads>(i));
      // Plain atomics: without a mass to sum, they cost less here than aggregating (measured).
      if (column<Threads>(i) < vocab && (key & kth.mask) == kth.prefix) atomicAdd(&r.count[(key >> shift) & 0xFFu], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 32) pick_kth_bin(r, rank);
    __syncthreads();
    kth.prefix |= static_cast<uint64_t>(r.bin) << shift;
    kth.mask |= 0xFFull << shift;
    rank = r.rank;
    if (r.last) break;
  }
  return kth;
}

// A probability in 2^-40 fixed point (round to nearest): at most 2^40, so the sum of 8192 fits.
__device__ __forceinline__ u64 fixed_mass(float prob) { return __float2ull_rn(prob * 1099511627776.0f); }

// Warp 0: the last nonempty bin whose first key has a mass before it (`before` + the lower bins')
// below `threshold`: the bin of the last kept key. Each lane scans 8 bins; the highest candidate
// bin, unique to one lane, is written by that lane. There always is one: the first key counted in a
// pass has the mass before it of the previous choice, which was below the threshold (and 0 < it in
// the first pass).
__device__ void pick_boundary_bin(RadixState& r, u64 before, u64 threshold) {
  const int lane = threadIdx.x, base = lane * (kBins / 32);
  u64 sum = 0;
#pragma unroll 1
  for (int b = 0; b < kBins / 32; ++b) sum += r.mass[base + b];
  u64 inclusive = sum;
  for (int d = 1; d < 32; d <<= 1) {
    const u64 up = __shfl_up_sync(0xFFFFFFFFu, inclusive, d);
    if (lane >= d) inclusive += up;
  }
  u64 below = before + (inclusive - sum);
  int chosen = -1;
  u64 chosen_below = 0;
  uint32_t chosen_count = 0;
#pragma unroll 1
  for (int b = 0; b < kBins / 32; ++b) {
    const uint32_t count = r.count[base + b];
    if (count != 0 && below < threshold) {
      chosen = base + b;
      chosen_below = below;
      chosen_count = count;
    }
    below += r.mass[base + b];
  }
  int highest = chosen;
  for (int d = 16; d > 0; d >>= 1) highest = max(highest, __shfl_xor_sync(0xFFFFFFFFu, highest, d));
  if (chosen >= 0 && chosen == highest) {
    r.bin = chosen;
    r.before = chosen_below;
    r.last = chosen_count == 1;
  }
}

// The largest key among the `members` (bit i: the thread's i-th column) whose mass before it (the
// members' fixed-point mass of the smaller keys) is below `threshold` (> 0, so the smallest member
// qualifies): the same passes as select_kth over the members, with a histogram of mass besides the
// counts. It stops when the chosen bin holds one key (keys are unique: at the last pass at most).
template <int Threads>
__device__ KthKey select_boundary(const float (&z)[kPerThread], const float (&probs)[kPerThread], uint32_t members,
                                  u64 threshold, RadixState& r) {
  static_assert(Threads >= kBins, "one thread zeroes each bin");
  static_assert(Threads * kPerThread <= 65536, "the radix select counts 16 id bits");
  KthKey last = {0, 0};
  u64 before = 0;  // the members' mass below the keys matching the prefix
  for (int pass = 0; pass < kPasses; ++pass) {
    const int shift = pass_shift(pass);
    if (threadIdx.x < kBins) {
      r.count[threadIdx.x] = 0;
      r.mass[threadIdx.x] = 0;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const uint64_t key = rank_key(z[i], column<Threads>(i));
      const bool counted = ((members >> i) & 1u) && (key & last.mask) == last.prefix;
      count_in_bin(r, static_cast<uint32_t>(key >> shift) & 0xFFu, counted, fixed_mass(probs[i]));
    }
    __syncthreads();
    if (threadIdx.x < 32) pick_boundary_bin(r, before, threshold);
    __syncthreads();
    last.prefix |= static_cast<uint64_t>(r.bin) << shift;
    last.mask |= 0xFFull << shift;
    before = r.before;
    if (r.last) break;
  }
  return last;
}

// ---- one row ------------------------------------------------------------------------------------

// The shared memory of a block besides the history marks.
struct Shared {
  RadixState radix;
  double sum[32];
  u64 fixed[32];
  ScoreId arg[32];
};

// The thread's filtered logits; -0 reads as +0 so that keys order them equal, as the reference's
// sort does.
template <int Threads>
__device__ void load_logits(const SampleArgs& a, int64_t row, const uint8_t* present, float (&z)[kPerThread]) {
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int col = column<Threads>(i);
    const float x = col < a.vocab ? filtered_logit(a, row, col, present) : __uint_as_float(kNegInfBits);
    z[i] = x == 0.0f ? 0.0f : x;
  }
}

// Bit i set: the thread's i-th column is within the top k (all of them without a top-k).
template <int Threads>
__device__ uint32_t top_k_columns(const SampleArgs& a, int64_t row, const float (&z)[kPerThread], RadixState& r) {
  const int64_t top_k = a.top_k[row];
  KthKey kth = {~0ull, ~0ull};
  if (top_k > 0 && top_k < a.vocab) kth = select_kth<Threads>(z, a.vocab, static_cast<uint32_t>(top_k - 1), r);
  uint32_t bits = 0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int col = column<Threads>(i);
    if (col < a.vocab && (rank_key(z[i], col) & kth.mask) <= kth.prefix) bits |= 1u << i;
  }
  return bits;
}

// The top-k columns (`in_top_k`) that top-p keeps: rank r stays iff the top-k mass before it is below
// top_p * (top-k mass) (top-p on the renormalised top-k distribution), compared in fixed point. For
// an integer m, m < x iff m < ceil(x); a NaN or nonpositive top_p keeps none (rank 0 is added back).
template <int Threads>
__device__ uint32_t top_p_columns(const float (&z)[kPerThread], const float (&probs)[kPerThread], uint32_t in_top_k,
                                  float top_p, Shared& sh) {
  u64 local = 0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    if ((in_top_k >> i) & 1u) local += fixed_mass(probs[i]);
  }
  const u64 mass_k = block_reduce<Threads>(local, sh.fixed, Add(), 0ull);
  const u64 threshold =
      top_p > 0.0f ? static_cast<u64>(ceil(static_cast<double>(top_p) * static_cast<double>(mass_k))) : 0ull;
  if (threshold == 0) return 0u;
  const KthKey last = select_boundary<Threads>(z, probs, in_top_k, threshold, sh.radix);
  uint32_t bits = 0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    if (((in_top_k >> i) & 1u) && (rank_key(z[i], column<Threads>(i)) & last.mask) <= last.prefix) bits |= 1u << i;
  }
  return bits;
}

// The row's token (every thread returns it).
template <int Threads>
__device__ int32_t sample_row(const SampleArgs& a, int64_t row, uint8_t* present, Shared& sh) {
  mark_history<Threads>(a, row, present);
  float z[kPerThread];
  load_logits<Threads>(a, row, present, z);
  ScoreId first = no_score();  // rank 0: the max, ties to the lowest id
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    if (column<Threads>(i) < a.vocab) first = better(first, {z[i], column<Threads>(i)});
  }
  first = block_reduce<Threads>(first, sh.arg, Better(), no_score());
  if (a.temperature[row] <= 0.0f) return first.id;

  uint32_t keep = top_k_columns<Threads>(a, row, z, sh.radix);
  float probs[kPerThread];
  double local = 0.0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    probs[i] = column<Threads>(i) < a.vocab ? expf(z[i] - first.score) : 0.0f;
    local += probs[i];
  }
  const float total = static_cast<float>(block_reduce<Threads>(local, sh.sum, Add(), 0.0));
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) probs[i] /= total;
  // Rows with top_p < 1 (a NaN top_p too) take the top-p select; the branch is uniform in the block.
  const float top_p = a.top_p[row];
  if (!(top_p >= 1.0f)) keep = top_p_columns<Threads>(z, probs, keep, top_p, sh);

  const float min_prob = a.min_p[row] * (1.0f / total);  // rank 0 has probability exp(0) / total
  local = 0.0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const bool kept = (((keep >> i) & 1u) && probs[i] >= min_prob) || column<Threads>(i) == first.id;
    probs[i] = kept ? probs[i] : 0.0f;
    local += probs[i];
  }
  const float kept_total = static_cast<float>(block_reduce<Threads>(local, sh.sum, Add(), 0.0));

  const uint32_t key = hash_key(a.seed[row], a.offset[row], a.salt);
  ScoreId best = no_score();
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int col = column<Threads>(i);
    if (col < a.vocab) best = better(best, {race_score(probs[i], kept_total, key, col), col});
  }
  return block_reduce<Threads>(best, sh.arg, Better(), no_score()).id;
}

}  // namespace

extern "C" __global__ void vox_hash_uniform(const int64_t* seed, const int64_t* offset, float* out, int64_t total,
                                            int64_t n, uint32_t salt) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t row = i / n;
  out[i] = hash_uniform_at(hash_key(seed[row], offset[row], salt), static_cast<uint32_t>(i % n));
}

// One block per row, of 1024 threads (vocab <= 8192) or 256 (vocab <= 2048); dynamic shared memory:
// vocab bytes (the history marks).
extern "C" __global__ void __launch_bounds__(1024) vox_sample(SampleArgs a) {
  __shared__ Shared shared;
  extern __shared__ uint8_t present[];
  const int32_t token = sample_row<1024>(a, blockIdx.x, present, shared);
  if (threadIdx.x == 0) a.out[blockIdx.x] = token;
}

extern "C" __global__ void __launch_bounds__(256) vox_sample_256(SampleArgs a) {
  __shared__ Shared shared;
  extern __shared__ uint8_t present[];
  const int32_t token = sample_row<256>(a, blockIdx.x, present, shared);
  if (threadIdx.x == 0) a.out[blockIdx.x] = token;
}
