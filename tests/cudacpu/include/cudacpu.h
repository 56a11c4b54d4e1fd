// cudacpu.h -- run the project's CUDA C++ kernels on the CPU, to check their logic (not speed).
//
// tests/cudacpu/executor.py compiles one translation unit with the host C++ compiler: this
// header, the kernel source, and per name expression an extern "C" launcher (taking `void**`
// arguments as cuLaunchKernel does) and a function describing the kernel's parameters.
//
// Execution model
//   * A grid runs block by block, in CUDACPU_SCHEDULE order (below); blocks are shared out to
//     CUDACPU_WORKERS OS threads (default 1, the caller's; blocks are independent, as in CUDA).
//   * The threads of one block are fibers (ucontext) on that block's OS thread: each runs
//     until it reaches a synchronisation point (__syncthreads, a warp collective such as
//     __shfl_xor_sync / __syncwarp / __ballot_sync) or returns, then the next one runs.
//     So nothing is lock-step: code that assumes warp-synchronous execution without
//     __syncwarp / _sync intrinsics sees stale data (as it may on Volta+).
//   * __shared__ is `static thread_local`: one copy per OS thread, i.e. per running block,
//     shared by that block's fibers. It is NOT cleared between blocks (as on a GPU).
//   * Warp collectives are resolved when every fiber of the block is blocked: all lanes named
//     in the mask must have arrived at a collective of the same kind with the same mask;
//     a lane in the mask that exited, sits at __syncthreads, or does not exist (partial
//     warp) is reported as an error, as is a lane calling with a mask that omits itself.
//   * __syncthreads is released when every live thread of the block waits at it; by default
//     it is an error if some threads of the block already exited (CUDACPU_ALLOW_EXIT_BARRIER=1
//     allows it). A block where every live thread waits and nothing can be released is
//     reported as a deadlock.
//   * CUDACPU_SCHEDULE=forward|reverse|random[:seed] picks the order of the blocks of a grid
//     and the order in which ready fibers run on each pass; running a test under several
//     orders exposes missing barriers and blocks that depend on each other.
//   * Errors (bad launch configuration, collective misuse, deadlock, __trap) fail the launch
//     with a message; the kernel's memory errors are left to ASan/UBSan builds.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <ucontext.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif
#include <unistd.h>

#include "cuda_bf16.h"
#include "cuda_fp16.h"

#if defined(__SANITIZE_ADDRESS__)
#define CUDACPU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDACPU_ASAN 1
#endif
#endif
#ifdef CUDACPU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// ------------------------------------------------------------------ qualifiers
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __shared__ static thread_local
#define __constant__ static
// __launch_bounds__(max threads, ...): a preprocessing pass (executor.launch_bounds) reads
// the bound through this mark; the launcher then refuses larger blocks, as a GPU does.
#ifdef CUDACPU_MARK_LAUNCH_BOUNDS
#define __launch_bounds__(...) cudacpu_launch_bounds_mark(__VA_ARGS__)
#else
#define __launch_bounds__(...)
#endif
#define __CUDACPU__ 1

// CUDA's 16-byte vector of unsigned ints, as a GCC vector: a load of one is one 16-byte
// access (one LDG.128 on the GPU, one record in a trace build), which a struct of four
// members would not be once GCC splits it. Kernels only move it whole (no .x .. .w here).
typedef unsigned int uint4 __attribute__((vector_size(16)));

// ------------------------------------------------------------------ built-in variables
struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
};
inline thread_local uint3 threadIdx = {0, 0, 0};
inline thread_local uint3 blockIdx = {0, 0, 0};
inline thread_local dim3 blockDim = {1, 1, 1};
inline thread_local dim3 gridDim = {1, 1, 1};
constexpr int warpSize = 32;

// ------------------------------------------------------------------ bit casts and helpers
template <typename To, typename From>
inline To cudacpu_bitcast(From v) {
  static_assert(sizeof(To) == sizeof(From), "size mismatch");
  To t;
  std::memcpy(&t, &v, sizeof(t));
  return t;
}
inline float __int_as_float(int v) { return cudacpu_bitcast<float>(v); }
inline float __uint_as_float(unsigned v) { return cudacpu_bitcast<float>(v); }
inline int __float_as_int(float v) { return cudacpu_bitcast<int>(v); }
inline unsigned __float_as_uint(float v) { return cudacpu_bitcast<unsigned>(v); }
inline double __longlong_as_double(long long v) { return cudacpu_bitcast<double>(v); }
inline long long __double_as_longlong(double v) { return cudacpu_bitcast<long long>(v); }

// CUDA's global min/max overloads (integers: plain compare; floats: fmin/fmax).
template <typename A, typename B,
          typename = std::enable_if_t<std::is_integral_v<A> && std::is_integral_v<B>>>
inline std::common_type_t<A, B> min(A a, B b) {
  typedef std::common_type_t<A, B> C;
  return (C)b < (C)a ? (C)b : (C)a;
}
template <typename A, typename B,
          typename = std::enable_if_t<std::is_integral_v<A> && std::is_integral_v<B>>>
inline std::common_type_t<A, B> max(A a, B b) {
  typedef std::common_type_t<A, B> C;
  return (C)a < (C)b ? (C)b : (C)a;
}
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// SIMD-in-a-word max of the lanes of type L (signed or unsigned bytes or halfwords).
template <typename L>
inline unsigned simd_max(unsigned a, unsigned b) {
  constexpr int bits = 8 * (int)sizeof(L);
  unsigned r = 0;
  for (int i = 0; i < 32 / bits; ++i) {
    const L x = (L)(a >> (bits * i)), y = (L)(b >> (bits * i));
    r |= ((unsigned)(x > y ? x : y) & (0xffffffffu >> (32 - bits))) << (bits * i);
  }
  return r;
}
inline unsigned __vmaxs4(unsigned a, unsigned b) { return simd_max<signed char>(a, b); }
inline unsigned __vmaxu4(unsigned a, unsigned b) { return simd_max<unsigned char>(a, b); }
inline unsigned __vmaxs2(unsigned a, unsigned b) { return simd_max<short>(a, b); }
inline unsigned __vmaxu2(unsigned a, unsigned b) { return simd_max<unsigned short>(a, b); }

// c plus the dot product of the 4 byte lanes of a and b (signed: int, unsigned: unsigned),
// wrapping as the GPU's IDP.4A does.
template <typename L, typename C>
inline C dot4(unsigned a, unsigned b, C c) {
  unsigned r = (unsigned)c;
  for (int i = 0; i < 4; ++i) r += (unsigned)((int)(L)(a >> (8 * i)) * (int)(L)(b >> (8 * i)));
  return (C)r;
}
inline int __dp4a(int a, int b, int c) { return dot4<signed char>((unsigned)a, (unsigned)b, c); }
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
  return dot4<unsigned char>(a, b, c);
}

// The high 32 bits of the 64-bit product.
inline unsigned __umulhi(unsigned a, unsigned b) {
  return (unsigned)(((unsigned long long)a * b) >> 32);
}

// Byte i of the result: byte (s >> 4i) & 7 of the 8 bytes y:x (x the low four).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long v = ((unsigned long long)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
}

// ------------------------------------------------------------------ runtime
namespace cudacpu {

enum class St : unsigned char { Ready, WaitBlock, WaitWarp, Done };
enum class WOp : unsigned char { Sync, Shfl, Ballot, Any, All };
inline const char* wop_name(WOp o) {
  switch (o) {
    case WOp::Sync: return "__syncwarp";
    case WOp::Shfl: return "__shfl*_sync";
    case WOp::Ballot: return "__ballot_sync";
    case WOp::Any: return "__any_sync";
    case WOp::All: return "__all_sync";
  }
  return "?";
}

struct Fiber {
  ucontext_t ctx;
  char* stack = nullptr;  // usable stack (a PROT_NONE guard page lies below it)
  size_t stack_size = 0;
  St st = St::Ready;
  uint3 tid = {0, 0, 0};
  // pending warp collective
  WOp op = WOp::Sync;
  unsigned mask = 0;
  int src = 0;
  uint64_t val = 0, result = 0;
  void* fake_stack = nullptr;
};

struct Block;
inline thread_local Block* tl_block = nullptr;
inline thread_local Fiber* tl_fiber = nullptr;

struct Block {
  std::vector<Fiber> fibers;
  ucontext_t sched;
  unsigned nthreads = 0;
  void (*fn)(void*) = nullptr;
  void* arg = nullptr;
  bool failed = false;
  std::string err;
  const void* sched_bottom = nullptr;
  size_t sched_size = 0;
  void* sched_fake = nullptr;

  ~Block() {
    for (auto& f : fibers)
      if (f.stack) munmap(f.stack - page(), f.stack_size + page());
  }
  static size_t page() { return (size_t)sysconf(_SC_PAGESIZE); }
};

inline size_t env_size(const char* name, size_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? (size_t)std::strtoull(v, nullptr, 10) : dflt;
}

inline std::string tid_str(const uint3& b, const uint3& t) {
  char s[128];
  std::snprintf(s, sizeof s, "block (%u,%u,%u) thread (%u,%u,%u)", b.x, b.y, b.z, t.x, t.y, t.z);
  return s;
}

// Record the first error of the block (the launch fails with it).
inline void fail(Block& b, const std::string& msg) {
  if (!b.failed) {
    b.failed = true;
    b.err = msg;
  }
}

// Fiber -> scheduler.
inline void yield_to_scheduler() {
  Block* b = tl_block;
  Fiber* f = tl_fiber;
#ifdef CUDACPU_ASAN
  __sanitizer_start_switch_fiber(f->st == St::Done ? nullptr : &f->fake_stack, b->sched_bottom,
                                 b->sched_size);
#endif
  swapcontext(&f->ctx, &b->sched);
#ifdef CUDACPU_ASAN
  __sanitizer_finish_switch_fiber(f->fake_stack, &b->sched_bottom, &b->sched_size);
#endif
}

inline void fiber_entry() {
  Block* b = tl_block;
#ifdef CUDACPU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &b->sched_bottom, &b->sched_size);
#endif
  b->fn(b->arg);
  tl_fiber->st = St::Done;
  yield_to_scheduler();
  std::abort();  // a finished fiber is never resumed
}

inline void resume(Block& b, Fiber& f) {
  tl_fiber = &f;
  threadIdx = f.tid;
#ifdef CUDACPU_ASAN
  __sanitizer_start_switch_fiber(&b.sched_fake, f.stack, f.stack_size);
#endif
  swapcontext(&b.sched, &f.ctx);
#ifdef CUDACPU_ASAN
  __sanitizer_finish_switch_fiber(b.sched_fake, nullptr, nullptr);
#endif
  tl_fiber = nullptr;
}

struct Options {
  int schedule = 0;  // 0 forward, 1 reverse, 2 random
  unsigned seed = 0;
  bool allow_exit_barrier = false;
  size_t stack = 256 * 1024;
  unsigned workers = 1;
  static Options from_env() {
    Options o;
    if (const char* s = std::getenv("CUDACPU_SCHEDULE")) {
      if (!std::strcmp(s, "reverse")) o.schedule = 1;
      if (!std::strncmp(s, "random", 6)) {
        o.schedule = 2;
        o.seed = s[6] == ':' ? (unsigned)std::strtoul(s + 7, nullptr, 10) : 12345u;
      }
    }
    o.allow_exit_barrier = env_size("CUDACPU_ALLOW_EXIT_BARRIER", 0) != 0;
    o.stack = env_size("CUDACPU_STACK_KB", 256) * 1024;
    o.workers = (unsigned)std::max<size_t>(1, env_size("CUDACPU_WORKERS", 1));
    return o;
  }
};

// Resolve pending warp collectives of warp w; returns true when some group was released.
inline bool release_warp(Block& b, unsigned w, const uint3& bid) {
  const unsigned base = w * 32;
  const unsigned nlanes = std::min(32u, b.nthreads - base);
  bool released = false;
  for (unsigned l = 0; l < nlanes && !b.failed; ++l) {
    Fiber& f = b.fibers[base + l];
    if (f.st != St::WaitWarp) continue;
    const unsigned m = f.mask;
    if (!((m >> l) & 1u)) {
      fail(b, tid_str(bid, f.tid) + ": " + wop_name(f.op) + " called with a mask that omits the calling lane");
      return false;
    }
    bool complete = true;
    for (unsigned j = 0; j < 32; ++j) {
      if (!((m >> j) & 1u)) continue;
      char why[160];
      if (j >= nlanes) {
        std::snprintf(why, sizeof why, "mask 0x%08x names lane %u, which does not exist (block of %u threads)", m, j, b.nthreads);
        fail(b, tid_str(bid, f.tid) + ": " + wop_name(f.op) + " " + why);
        return false;
      }
      Fiber& g = b.fibers[base + j];
      if (g.st == St::Done) {
        std::snprintf(why, sizeof why, "mask 0x%08x names lane %u, which has exited", m, j);
        fail(b, tid_str(bid, f.tid) + ": " + wop_name(f.op) + " " + why);
        return false;
      }
      if (g.st == St::WaitBlock) {
        std::snprintf(why, sizeof why, "mask 0x%08x names lane %u, which waits at __syncthreads (divergent warp: deadlock)", m, j);
        fail(b, tid_str(bid, f.tid) + ": " + wop_name(f.op) + " " + why);
        return false;
      }
      if (g.st == St::Ready) {  // cannot happen at a quiescent point
        complete = false;
        break;
      }
      if (g.mask != m || g.op != f.op) {
        std::snprintf(why, sizeof why, "lanes %u and %u meet with different collectives or masks (%s 0x%08x vs %s 0x%08x)", l, j,
                      wop_name(f.op), m, wop_name(g.op), g.mask);
        fail(b, tid_str(bid, f.tid) + ": " + why);
        return false;
      }
    }
    if (!complete) continue;
    // compute the results of the whole group, then release it
    uint64_t ballot = 0;
    for (unsigned j = 0; j < 32; ++j)
      if ((m >> j) & 1u) ballot |= (b.fibers[base + j].val != 0 ? 1ull : 0ull) << j;
    for (unsigned j = 0; j < 32; ++j) {
      if (!((m >> j) & 1u)) continue;
      Fiber& g = b.fibers[base + j];
      switch (g.op) {
        case WOp::Sync: g.result = 0; break;
        case WOp::Shfl:
          if (!((m >> g.src) & 1u) || (unsigned)g.src >= nlanes) {
            char why[128];
            std::snprintf(why, sizeof why, "shuffle reads lane %d, which is not in mask 0x%08x", g.src, m);
            fail(b, tid_str(bid, g.tid) + ": " + why);
            return false;
          }
          g.result = b.fibers[base + g.src].val;
          break;
        case WOp::Ballot: g.result = ballot; break;
        case WOp::Any: g.result = ballot != 0; break;
        case WOp::All: g.result = ballot == (uint64_t)m; break;
      }
    }
    for (unsigned j = 0; j < 32; ++j)
      if ((m >> j) & 1u) b.fibers[base + j].st = St::Ready;
    released = true;
  }
  return released;
}

// Run one block to completion on the calling OS thread.
inline void run_block(Block& b, const dim3& bdim, const uint3& bid, const Options& o,
                      std::mt19937& rng) {
  const size_t pg = Block::page();
  const size_t ss = (o.stack + pg - 1) / pg * pg;
  b.nthreads = bdim.x * bdim.y * bdim.z;
  if (b.fibers.size() < b.nthreads) b.fibers.resize(b.nthreads);
  for (unsigned i = 0; i < b.nthreads; ++i) {
    Fiber& f = b.fibers[i];
    if (!f.stack || f.stack_size != ss) {
      if (f.stack) munmap(f.stack - pg, f.stack_size + pg);
      void* p = mmap(nullptr, ss + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) {
        fail(b, "cudacpu: cannot map a fiber stack");
        return;
      }
      mprotect(p, pg, PROT_NONE);  // guard page: a fiber stack overflow faults
      f.stack = (char*)p + pg;
      f.stack_size = ss;
    }
#ifdef CUDACPU_ASAN
    __asan_unpoison_memory_region(f.stack, f.stack_size);
#endif
    f.st = St::Ready;
    f.tid = uint3{i % bdim.x, (i / bdim.x) % bdim.y, i / (bdim.x * bdim.y)};
    f.fake_stack = nullptr;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = f.stack_size;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_entry, 0);
  }
  std::vector<unsigned> order(b.nthreads);
  for (unsigned i = 0; i < b.nthreads; ++i) order[i] = o.schedule == 1 ? b.nthreads - 1 - i : i;
  const unsigned nwarps = (b.nthreads + 31) / 32;
  while (!b.failed) {
    if (o.schedule == 2) std::shuffle(order.begin(), order.end(), rng);
    for (unsigned i : order) {
      Fiber& f = b.fibers[i];
      if (f.st == St::Ready) resume(b, f);
      if (b.failed) return;
    }
    // quiescent: every live fiber waits at a collective or a barrier
    bool released = false;
    for (unsigned w = 0; w < nwarps && !b.failed; ++w) released |= release_warp(b, w, bid);
    if (b.failed) return;
    if (released) continue;
    // nothing released: no thread waits at a warp collective (release_warp releases a
    // complete group or fails the block), so every live thread waits at __syncthreads
    unsigned waiting = 0, done = 0;
    for (unsigned i = 0; i < b.nthreads; ++i) {
      St s = b.fibers[i].st;
      waiting += s == St::WaitBlock;
      done += s == St::Done;
    }
    if (done == b.nthreads) return;
    if (done && !o.allow_exit_barrier) {
      for (unsigned i = 0; i < b.nthreads; ++i)
        if (b.fibers[i].st == St::Done) {
          char s[200];
          std::snprintf(s, sizeof s, ": __syncthreads reached by %u threads while %u threads of the block already exited (e.g. this one); set CUDACPU_ALLOW_EXIT_BARRIER=1 to allow", waiting, done);
          fail(b, tid_str(bid, b.fibers[i].tid) + s);
          return;
        }
    }
    for (unsigned i = 0; i < b.nthreads; ++i)
      if (b.fibers[i].st == St::WaitBlock) b.fibers[i].st = St::Ready;
  }
}

// Launch a grid: fn(arg) is the kernel call with its arguments bound.
// max_threads: the kernel's __launch_bounds__ (0: none).
inline int launch_grid(dim3 grid, dim3 block, void (*fn)(void*), void* arg, char* err,
                       size_t errlen, unsigned max_threads) {
  auto report = [&](const std::string& m) {
    if (err && errlen) std::snprintf(err, errlen, "%s", m.c_str());
    return 1;
  };
  const unsigned long long nthreads = (unsigned long long)block.x * block.y * block.z;
  if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z)
    return report("cudacpu: invalid launch configuration: a grid or block dimension is 0");
  if (nthreads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64)
    return report("cudacpu: invalid launch configuration: block (" + std::to_string(block.x) + "," +
                  std::to_string(block.y) + "," + std::to_string(block.z) + ") exceeds the CUDA limits");
  if (max_threads && nthreads > max_threads)
    return report("cudacpu: invalid launch configuration: block of " + std::to_string(nthreads) +
                  " threads, more than the kernel's __launch_bounds__ (" +
                  std::to_string(max_threads) + ")");
  if (grid.x > 2147483647u || grid.y > 65535u || grid.z > 65535u)
    return report("cudacpu: invalid launch configuration: grid (" + std::to_string(grid.x) + "," +
                  std::to_string(grid.y) + "," + std::to_string(grid.z) + ") exceeds the CUDA limits");
  const Options o = Options::from_env();
  const unsigned long long nblocks = (unsigned long long)grid.x * grid.y * grid.z;
  // Block k of the schedule is block order[k] of the grid (order empty: forward).
  std::vector<unsigned long long> order;
  if (o.schedule == 1) {
    order.resize(nblocks);
    for (unsigned long long k = 0; k < nblocks; ++k) order[k] = nblocks - 1 - k;
  } else if (o.schedule == 2) {
    order.resize(nblocks);
    for (unsigned long long k = 0; k < nblocks; ++k) order[k] = k;
    std::mt19937_64 block_rng(o.seed);
    std::shuffle(order.begin(), order.end(), block_rng);
  }
  std::atomic<unsigned long long> next{0};
  std::mutex mu;
  std::string first_err;
  auto worker = [&](unsigned wid) {
#if defined(CUDACPU_FTZ) && defined(__SSE__)
    // -ftz=true: float results and operands below the normal range become zero (MXCSR FTZ
    // and DAZ), as on a GPU.
    const unsigned saved_csr = _mm_getcsr();
    _mm_setcsr(saved_csr | 0x8040u);
#endif
    Block b;
    b.fn = fn;
    b.arg = arg;
    tl_block = &b;
    gridDim = grid;
    blockDim = block;
    std::mt19937 rng(o.seed + wid);
    for (;;) {
      const unsigned long long n = next.fetch_add(1);
      if (n >= nblocks) break;
      const unsigned long long k = order.empty() ? n : order[n];
      blockIdx = uint3{(unsigned)(k % grid.x), (unsigned)((k / grid.x) % grid.y),
                       (unsigned)(k / ((unsigned long long)grid.x * grid.y))};
      run_block(b, block, blockIdx, o, rng);
      if (b.failed) {
        std::lock_guard<std::mutex> g(mu);
        if (first_err.empty()) first_err = b.err;
        next.store(nblocks);
        break;
      }
    }
    tl_block = nullptr;
#if defined(CUDACPU_FTZ) && defined(__SSE__)
    _mm_setcsr(saved_csr);
#endif
  };
  const unsigned nw = (unsigned)std::min<unsigned long long>(o.workers, nblocks);
  if (nw <= 1) {
    worker(0);
  } else {
    std::vector<std::thread> ts;
    for (unsigned i = 0; i < nw; ++i) ts.emplace_back(worker, i);
    for (auto& t : ts) t.join();
  }
  if (!first_err.empty()) return report(first_err);
  return 0;
}

// ------------------------------------------------------------------ device-side intrinsics
inline Fiber& self() {
  if (!tl_fiber) {
    std::fprintf(stderr, "cudacpu: device intrinsic called outside a kernel launch\n");
    std::abort();
  }
  return *tl_fiber;
}
inline unsigned lane_id() {
  const uint3& t = threadIdx;
  return (t.x + blockDim.x * (t.y + blockDim.y * t.z)) % 32;
}

template <typename T>
inline T collective(WOp op, unsigned mask, T v, int src) {
  static_assert(sizeof(T) <= 8, "warp collective on a type wider than 8 bytes");
  Fiber& f = self();
  f.op = op;
  f.mask = mask;
  f.src = src;
  f.val = 0;
  std::memcpy(&f.val, &v, sizeof(T));
  f.st = St::WaitWarp;
  yield_to_scheduler();
  T r;
  std::memcpy(&r, &f.result, sizeof(T));
  return r;
}

inline bool valid_width(int width) { return width >= 1 && width <= 32 && !(width & (width - 1)); }
inline void bad_width(int width) {
  Block& b = *tl_block;
  fail(b, tid_str(blockIdx, threadIdx) + ": shuffle width " + std::to_string(width) + " is not a power of two <= 32");
  self().st = St::Done;
  yield_to_scheduler();
}

}  // namespace cudacpu

inline void __syncthreads() {
  cudacpu::Fiber& f = cudacpu::self();
  f.st = cudacpu::St::WaitBlock;
  cudacpu::yield_to_scheduler();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  cudacpu::collective<int>(cudacpu::WOp::Sync, mask, 0, 0);
}
inline void __threadfence() {}
inline void __threadfence_block() {}
[[noreturn]] inline void __trap() {
  cudacpu::fail(*cudacpu::tl_block, cudacpu::tid_str(blockIdx, threadIdx) + ": __trap()");
  cudacpu::self().st = cudacpu::St::Done;
  cudacpu::yield_to_scheduler();
  std::abort();
}

template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  if (!cudacpu::valid_width(width)) cudacpu::bad_width(width);
  const int lane = (int)cudacpu::lane_id();
  const int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
  return cudacpu::collective<T>(cudacpu::WOp::Shfl, mask, v, src);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  if (!cudacpu::valid_width(width)) cudacpu::bad_width(width);
  const int lane = (int)cudacpu::lane_id();
  int src = lane ^ lane_mask;
  if (src >= ((lane / width) + 1) * width) src = lane;  // later groups: own value
  return cudacpu::collective<T>(cudacpu::WOp::Shfl, mask, v, src);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  if (!cudacpu::valid_width(width)) cudacpu::bad_width(width);
  const int lane = (int)cudacpu::lane_id();
  const int src = (lane & (width - 1)) + (int)delta >= width ? lane : lane + (int)delta;
  return cudacpu::collective<T>(cudacpu::WOp::Shfl, mask, v, src);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  if (!cudacpu::valid_width(width)) cudacpu::bad_width(width);
  const int lane = (int)cudacpu::lane_id();
  const int src = (lane & (width - 1)) < (int)delta ? lane : lane - (int)delta;
  return cudacpu::collective<T>(cudacpu::WOp::Shfl, mask, v, src);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  return (unsigned)cudacpu::collective<uint64_t>(cudacpu::WOp::Ballot, mask, pred != 0, 0);
}
inline int __any_sync(unsigned mask, int pred) {
  return (int)cudacpu::collective<uint64_t>(cudacpu::WOp::Any, mask, pred != 0, 0);
}
inline int __all_sync(unsigned mask, int pred) {
  return (int)cudacpu::collective<uint64_t>(cudacpu::WOp::All, mask, pred != 0, 0);
}
inline unsigned __activemask() { return 0xffffffffu; }

// ------------------------------------------------------------------ host-side launch glue
namespace cudacpu {

template <typename T>
constexpr char kind_of() {
  if constexpr (std::is_pointer_v<T>) return 'p';
  else if constexpr (std::is_same_v<T, bool>) return 'b';
  else if constexpr (std::is_floating_point_v<T>) return 'f';
  else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) return 'i';
  else if constexpr (std::is_integral_v<T>) return 'u';
  else {
    static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                  "kernel parameter of a type the executor does not model");
    return 'f';
  }
}
template <typename T>
constexpr int pointee_size() {
  if constexpr (std::is_pointer_v<T> && !std::is_void_v<std::remove_pointer_t<T>>)
    return (int)sizeof(std::remove_pointer_t<T>);
  else return 0;
}
template <typename T>
constexpr char pointee_kind() {
  if constexpr (std::is_pointer_v<T> && !std::is_void_v<std::remove_pointer_t<T>>)
    return kind_of<std::remove_cv_t<std::remove_pointer_t<T>>>();
  else return 'v';
}

template <typename T>
constexpr int pointee_const() {
  if constexpr (std::is_pointer_v<T>) return std::is_const_v<std::remove_pointer_t<T>> ? 1 : 0;
  else return 0;
}

// Parameter signature: one "kind size pointee_kind pointee_size pointee_const" entry per
// parameter (kind: p pointer, b bool, f float, i signed, u unsigned integer).
template <typename... P>
int signature(void (*)(P...), char* out, size_t n) {
  std::string s;
  ((s += std::string(1, kind_of<P>()) + " " + std::to_string(sizeof(P)) + " " +
         std::string(1, pointee_kind<P>()) + " " + std::to_string(pointee_size<P>()) + " " +
         std::to_string(pointee_const<P>()) + ";"),
   ...);
  std::snprintf(out, n, "%s", s.c_str());
  return (int)sizeof...(P);
}

template <typename K, typename Tup, size_t... I>
void call_with(K k, Tup& t, std::index_sequence<I...>) {
  k(std::get<I>(t)...);
}

template <typename... P>
int launch_kernel(void (*k)(P...), const unsigned* g, const unsigned* bl, void** args, char* err,
                  size_t errlen, unsigned max_threads) {
  std::tuple<std::decay_t<P>...> vals;
  size_t i = 0;
  std::apply([&](auto&... v) { ((std::memcpy(&v, args[i++], sizeof(v))), ...); }, vals);
  struct Ctx {
    void (*k)(P...);
    std::tuple<std::decay_t<P>...>* vals;
  } ctx{k, &vals};
  auto tramp = [](void* p) {
    Ctx* c = (Ctx*)p;
    call_with(c->k, *c->vals, std::index_sequence_for<P...>{});
  };
  return launch_grid(dim3(g[0], g[1], g[2]), dim3(bl[0], bl[1], bl[2]), tramp, &ctx, err, errlen,
                     max_threads);
}

}  // namespace cudacpu
