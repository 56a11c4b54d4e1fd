// trace_rt.h -- the memory-access recorder of the executor's trace builds (tests/cudacpu/
// trace.py), in place of the ThreadSanitizer runtime.
//
// A trace build compiles the translation unit with -fsanitize=thread -static-libtsan -shared:
// GCC then calls __tsan_readN / __tsan_writeN(address) before every load and store, and links
// no ThreadSanitizer runtime, so the hooks below (appended to the unit) receive those calls.
// An access is kept when it lies in one of the ranges given to cudacpu_trace_begin (the guarded
// copies of a launch's array arguments) and happens inside a CUDA thread: its block, thread,
// site (the hook's return address: one per load or store instruction), address, size and
// direction. Stacks, __shared__ (thread_local) and the scheduler's data are never in a range.
//
// One OS thread runs the launch (trace.py sets CUDACPU_WORKERS=1): the buffer has no lock.
// The hooks are not instrumented themselves, and atomics keep their semantics.
#pragma once
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

#define CUDACPU_TRACE_HOOK extern "C" __attribute__((no_sanitize_thread, noinline, used))

namespace cudacpu_trace {

struct Record {
  uint64_t addr;
  uint64_t site;   // return address of the hook: the instrumented instruction
  uint32_t block;  // linear block index: x + gridDim.x * (y + gridDim.y * z)
  uint32_t info;   // thread (linear in its block) << 16 | write << 15 | size in bytes
};

constexpr int kMaxRanges = 64;
inline Record* g_records = nullptr;
inline size_t g_count = 0, g_capacity = 0;
inline uint64_t g_lo[kMaxRanges], g_hi[kMaxRanges];
inline int g_ranges = 0;
inline bool g_on = false;
inline uint32_t g_block_limit = 0xffffffffu;  // record blocks of a lower linear index only
inline bool g_overflow = false;  // the buffer could not grow: the trace is incomplete

__attribute__((no_sanitize_thread, always_inline)) inline void record(const void* p,
                                                                      unsigned size,
                                                                      unsigned write,
                                                                      void* site) {
  if (!g_on) return;
  const uint64_t a = (uint64_t)p;
  bool hit = false;
  for (int i = 0; i < g_ranges; ++i) {
    if (a >= g_lo[i] && a < g_hi[i]) {
      hit = true;
      break;
    }
  }
  if (!hit || !cudacpu::tl_fiber) return;
  const uint3 b = blockIdx, t = threadIdx;
  const dim3 gd = gridDim, bd = blockDim;
  const uint32_t linear = b.x + gd.x * (b.y + gd.y * b.z);
  if (linear >= g_block_limit) return;
  if (g_count == g_capacity) {
    const size_t grown = g_capacity ? 2 * g_capacity : (size_t)1 << 20;
    Record* bigger = (Record*)realloc(g_records, grown * sizeof(Record));
    if (!bigger) {
      g_overflow = true;
      return;
    }
    g_records = bigger;
    g_capacity = grown;
  }
  Record& r = g_records[g_count++];
  r.addr = a;
  r.site = (uint64_t)site;
  r.block = linear;
  r.info = ((t.x + bd.x * (t.y + bd.y * t.z)) << 16) | (write << 15) | (size & 0x7fffu);
}

}  // namespace cudacpu_trace

// Record accesses to [lo[i], hi[i]) until cudacpu_trace_end; drops earlier records.
CUDACPU_TRACE_HOOK int cudacpu_trace_begin(const uint64_t* lo, const uint64_t* hi, int n) {
  using namespace cudacpu_trace;
  if (n > kMaxRanges) return 1;
  for (int i = 0; i < n; ++i) {
    g_lo[i] = lo[i];
    g_hi[i] = hi[i];
  }
  g_ranges = n;
  g_count = 0;
  g_overflow = false;
  g_on = true;
  return 0;
}
// Record only the blocks of linear index below `limit` (0xffffffff: every block).
CUDACPU_TRACE_HOOK void cudacpu_trace_block_limit(uint32_t limit) {
  cudacpu_trace::g_block_limit = limit;
}
CUDACPU_TRACE_HOOK void cudacpu_trace_end() { cudacpu_trace::g_on = false; }
CUDACPU_TRACE_HOOK size_t cudacpu_trace_count() { return cudacpu_trace::g_count; }
CUDACPU_TRACE_HOOK const void* cudacpu_trace_records() { return cudacpu_trace::g_records; }
CUDACPU_TRACE_HOOK int cudacpu_trace_overflow() { return cudacpu_trace::g_overflow; }
// Load address of this library (sites are reported as offsets from it).
CUDACPU_TRACE_HOOK uint64_t cudacpu_trace_base() {
  Dl_info info;
  return dladdr((void*)&cudacpu_trace_count, &info) ? (uint64_t)info.dli_fbase : 0;
}

#define CUDACPU_TRACE_RW(N)                                                                  \
  CUDACPU_TRACE_HOOK void __tsan_read##N(void* p) {                                          \
    cudacpu_trace::record(p, N, 0, __builtin_return_address(0));                             \
  }                                                                                          \
  CUDACPU_TRACE_HOOK void __tsan_write##N(void* p) {                                         \
    cudacpu_trace::record(p, N, 1, __builtin_return_address(0));                             \
  }                                                                                          \
  CUDACPU_TRACE_HOOK void __tsan_unaligned_read##N(void* p) {                                \
    cudacpu_trace::record(p, N, 0, __builtin_return_address(0));                             \
  }                                                                                          \
  CUDACPU_TRACE_HOOK void __tsan_unaligned_write##N(void* p) {                               \
    cudacpu_trace::record(p, N, 1, __builtin_return_address(0));                             \
  }                                                                                          \
  CUDACPU_TRACE_HOOK void __tsan_volatile_read##N(void* p) {                                 \
    cudacpu_trace::record(p, N, 0, __builtin_return_address(0));                             \
  }                                                                                          \
  CUDACPU_TRACE_HOOK void __tsan_volatile_write##N(void* p) {                                \
    cudacpu_trace::record(p, N, 1, __builtin_return_address(0));                             \
  }
CUDACPU_TRACE_RW(1)
CUDACPU_TRACE_RW(2)
CUDACPU_TRACE_RW(4)
CUDACPU_TRACE_RW(8)
CUDACPU_TRACE_RW(16)
#undef CUDACPU_TRACE_RW

CUDACPU_TRACE_HOOK void __tsan_read_range(void* p, unsigned long n) {
  cudacpu_trace::record(p, (unsigned)(n < 0x7fff ? n : 0x7fff), 0, __builtin_return_address(0));
}
CUDACPU_TRACE_HOOK void __tsan_write_range(void* p, unsigned long n) {
  cudacpu_trace::record(p, (unsigned)(n < 0x7fff ? n : 0x7fff), 1, __builtin_return_address(0));
}
CUDACPU_TRACE_HOOK void __tsan_init() {}
CUDACPU_TRACE_HOOK void __tsan_func_entry(void*) {}
CUDACPU_TRACE_HOOK void __tsan_func_exit(void*) {}
CUDACPU_TRACE_HOOK void __tsan_vptr_update(void**, void*) {}
CUDACPU_TRACE_HOOK void __tsan_vptr_read(void**) {}
CUDACPU_TRACE_HOOK void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
CUDACPU_TRACE_HOOK void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

// Atomics (the launcher's block counter, std::mutex internals) keep their meaning, sequentially
// consistent whatever order was asked for.
#define CUDACPU_TRACE_RMW(N, T, OP, BUILTIN)                                                 \
  CUDACPU_TRACE_HOOK T __tsan_atomic##N##_##OP(volatile T* a, T v, int) {                    \
    return BUILTIN(a, v, __ATOMIC_SEQ_CST);                                                  \
  }
#define CUDACPU_TRACE_ATOMIC(N, T)                                                           \
  CUDACPU_TRACE_HOOK T __tsan_atomic##N##_load(const volatile T* a, int) {                   \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                             \
  }                                                                                          \
  CUDACPU_TRACE_HOOK void __tsan_atomic##N##_store(volatile T* a, T v, int) {                \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                \
  }                                                                                          \
  CUDACPU_TRACE_RMW(N, T, exchange, __atomic_exchange_n)                                    \
  CUDACPU_TRACE_RMW(N, T, fetch_add, __atomic_fetch_add)                                     \
  CUDACPU_TRACE_RMW(N, T, fetch_sub, __atomic_fetch_sub)                                     \
  CUDACPU_TRACE_RMW(N, T, fetch_and, __atomic_fetch_and)                                     \
  CUDACPU_TRACE_RMW(N, T, fetch_or, __atomic_fetch_or)                                       \
  CUDACPU_TRACE_RMW(N, T, fetch_xor, __atomic_fetch_xor)                                     \
  CUDACPU_TRACE_HOOK int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, \
                                                                    int, int) {              \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);  \
  }                                                                                          \
  CUDACPU_TRACE_HOOK int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v,   \
                                                                  int, int) {                \
    return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);   \
  }                                                                                          \
  CUDACPU_TRACE_HOOK T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int,  \
                                                               int) {                        \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);        \
    return c;                                                                                \
  }
CUDACPU_TRACE_ATOMIC(8, unsigned char)
CUDACPU_TRACE_ATOMIC(16, unsigned short)
CUDACPU_TRACE_ATOMIC(32, unsigned int)
CUDACPU_TRACE_ATOMIC(64, unsigned long)
#undef CUDACPU_TRACE_ATOMIC
#undef CUDACPU_TRACE_RMW
