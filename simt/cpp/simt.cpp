// plait's SIMT emulator: runs the device kernels of kernels/cuda on the host (see simt.hpp)
// behind one C entry point, `plait_simt_launch`, whose arguments follow cuLaunchKernel's
// (an array of pointers to the argument values).

#include "simt.hpp"

#include <ucontext.h>

#include <cstdio>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.cuh"
#include SIMT_KERNELS  // every kernels/cuda/*.cu, listed by build.rs

namespace simt {
thread_local dim3 thread_idx, block_idx, block_dim, grid_dim;

namespace {

// One argument type's letter in a kernel signature (the Rust side sends the same letters).
template <class T> constexpr char letter();
template <> constexpr char letter<float*>() { return 'p'; }
template <> constexpr char letter<const float*>() { return 'c'; }
template <> constexpr char letter<long long>() { return 'l'; }
template <> constexpr char letter<int>() { return 'i'; }
template <> constexpr char letter<double>() { return 'd'; }
template <> constexpr char letter<Broadcast>() { return 'B'; }
template <> constexpr char letter<Strided>() { return 'S'; }
template <> constexpr char letter<Attention>() { return 'A'; }

template <class... A> std::string signature_of(void (*)(A...)) { return std::string{letter<A>()...}; }

template <class... A, std::size_t... I>
void call(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<A>*>(args[I])...);
}

template <class... A> std::function<void()> bind(void (*kernel)(A...), void** args) {
    return [=] { call(kernel, args, std::index_sequence_for<A...>{}); };
}

struct Entry {
    const char* name;
    std::string signature;
    std::function<std::function<void()>(void**)> bind_args;
};

#define SIMT_REGISTER(k) Entry{#k, signature_of(&k), [](void** a) { return bind(&k, a); }},
const std::vector<Entry>& registry() {
    static const std::vector<Entry> entries = {
#include SIMT_REGISTRY
    };
    return entries;
}

constexpr std::size_t kStackBytes = 64 * 1024;

// A cp.async copy not yet landed: its bytes (read at issue: the kernels' sources are not
// written while copies run) and where they go.
struct PendingCopy {
    void* dst;
    unsigned char bytes[16];
    unsigned len;
};

struct Fiber {
    ucontext_t context;
    std::vector<char> stack = std::vector<char>(kStackBytes);
    bool done = false;
    std::vector<PendingCopy> pending;
};

// A barrier of `members` threads: they arrive one by one, the last one opens it (a new
// generation), and those waiting yield to the scheduler until they see it open.
struct Barrier {
    unsigned members = 0, arrived = 0, generation = 0;
};

constexpr unsigned kWarp = 32;

// What a warp's lanes exchange at a warp-wide operation.
struct WarpSlots {
    float value[kWarp];
    double wide[kWarp];
    unsigned a[kWarp][4], b[kWarp][2];
    const void* row[kWarp];
};

struct Block {
    std::function<void()>* body;
    std::vector<Fiber> fibers;
    ucontext_t scheduler;
    std::size_t current = 0;
    Barrier block;
    std::vector<Barrier> warps;
    std::vector<WarpSlots> slots;
    // Barriers opened since the scheduler last looked: a round without one (and without a
    // thread returning) is a block that can never finish.
    unsigned long long opened = 0;
    // Decides when each asynchronous copy lands (`async_copy`).
    unsigned long long coin = 0;
};

thread_local Block* active = nullptr;

void fiber_main() {
    (*active->body)();
    active->fibers[active->current].done = true;
}

void yield() {
    Fiber& f = active->fibers[active->current];
    swapcontext(&f.context, &active->scheduler);
}

// Arrives at `b` and returns once all its members have. The last to arrive yields too, so
// that each phase starts in the scheduler's fresh (shuffled) order.
void wait_at(Barrier& b) {
    unsigned generation = b.generation;
    if (++b.arrived == b.members) {
        b.arrived = 0;
        ++b.generation;
        ++active->opened;
    }
    do yield();
    while (b.generation == generation);
}

unsigned warp_of_current() { return static_cast<unsigned>(active->current) / kWarp; }
unsigned lane_of_current() { return static_cast<unsigned>(active->current) % kWarp; }

void sync_warp() { wait_at(active->warps[warp_of_current()]); }

// Runs one block: every fiber up to its next yield, round and round (in a shuffled order),
// until all return. A barrier that can never open (some threads returned, or wait at another
// barrier, while others wait at it) is an error on a GPU (undefined behaviour or a hang):
// reported, not hidden.
bool run_block(Block& b, unsigned threads) {
    for (unsigned t = 0; t < threads; ++t) {
        Fiber& f = b.fibers[t];
        f.done = false;
        f.pending.clear();  // a thread may end with copies in flight; they land nowhere
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = f.stack.data();
        f.context.uc_stack.ss_size = f.stack.size();
        f.context.uc_link = &b.scheduler;
        makecontext(&f.context, fiber_main, 0);
    }
    b.block = Barrier{threads, 0, 0};
    unsigned warps = (threads + kWarp - 1) / kWarp;
    b.warps.assign(warps, Barrier{});
    for (unsigned w = 0; w < warps; ++w) b.warps[w].members = std::min(kWarp, threads - w * kWarp);
    b.slots.resize(warps);
    // Each round runs the threads in a different order, so a kernel that reads what another
    // thread writes in the same phase (a race on a GPU) gives a different result than its
    // tests expect instead of passing by the luck of a fixed order.
    // And in some rounds some warps stand still (a GPU schedules its warps independently):
    // the others run ahead to the next block barrier, so a warp that overwrites shared memory
    // another warp still reads, with no barrier between, shows too.
    std::vector<unsigned> order(threads);
    std::vector<char> stalled(warps, 0);
    unsigned long long lcg = 0x9E3779B97F4A7C15ull ^ (unsigned long long)block_idx.x;
    auto next = [&lcg] { return lcg = lcg * 6364136223846793005ull + 1442695040888963407ull; };
    for (;;) {
        for (unsigned t = 0; t < threads; ++t) order[t] = t;
        for (unsigned t = threads; t > 1; --t) std::swap(order[t - 1], order[(next() >> 33) % t]);
        bool stalls = false;
        for (unsigned w = 0; w < warps; ++w) {
            stalled[w] = warps > 1 && ((next() >> 40) & 1);
            stalls = stalls || stalled[w];
        }
        if (stalls && std::count(stalled.begin(), stalled.end(), 1) == (long)warps) stalled[(next() >> 33) % warps] = 0;
        unsigned finished = 0, returned = 0;
        b.opened = 0;
        for (unsigned i = 0; i < threads; ++i) {
            unsigned t = order[i];
            if (b.fibers[t].done) {
                ++finished;
                continue;
            }
            if (stalled[t / kWarp]) continue;
            b.current = t;
            thread_idx = dim3{t, 1, 1};
            swapcontext(&b.scheduler, &b.fibers[t].context);
            returned += b.fibers[t].done ? 1 : 0;
        }
        if (finished + returned == threads) return true;
        // (A round that left warps out proves nothing about the others waiting forever.)
        if (!stalls && b.opened == 0 && returned == 0) return false;
    }
}

}  // namespace

void sync_threads() { wait_at(active->block); }

namespace {
// `v` of the lane `lane_mask` away in the calling warp, exchanged through the warp's `slots`.
template <class T> T exchange(T (&slots)[kWarp], T v, int lane_mask) {
    unsigned lane = lane_of_current();
    slots[lane] = v;
    sync_warp();
    T other = slots[(lane ^ static_cast<unsigned>(lane_mask)) % kWarp];
    sync_warp();  // every lane has read before a next exchange overwrites the slots
    return other;
}
}  // namespace

float shfl_xor(float v, int lane_mask) { return exchange(active->slots[warp_of_current()].value, v, lane_mask); }

double shfl_xor(double v, int lane_mask) { return exchange(active->slots[warp_of_current()].wide, v, lane_mask); }

namespace {
// The bf16 in the lower (`high` false) or upper half of a word, as f32.
float bf16_half(unsigned word, bool high) {
    unsigned bits = high ? (word & 0xffff0000u) : (word << 16);
    float x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
}

// A[row][k] of the warp's 16×16 A fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16").
float fragment_a(const WarpSlots& s, unsigned row, unsigned k) {
    unsigned lane = 4 * (row % 8) + (k % 8) / 2;
    unsigned reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    return bf16_half(s.a[lane][reg], k % 2 == 1);
}

// B[k][n] of the warp's 16×8 B fragments.
float fragment_b(const WarpSlots& s, unsigned k, unsigned n) {
    unsigned lane = 4 * n + (k % 8) / 2;
    return bf16_half(s.b[lane][k >= 8 ? 1 : 0], k % 2 == 1);
}
}  // namespace

void mma_m16n8k16_bf16(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    WarpSlots& s = active->slots[warp_of_current()];
    unsigned lane = lane_of_current();
    for (int r = 0; r < 4; ++r) s.a[lane][r] = a[r];
    s.b[lane][0] = b0;
    s.b[lane][1] = b1;
    sync_warp();
    // This lane's accumulators: c0, c1 = (group, 2t, 2t + 1), c2, c3 = (group + 8, ...).
    unsigned group = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
        unsigned row = group + (e >= 2 ? 8 : 0), col = 2 * t + (e % 2);
        float sum = 0.0f;
        for (unsigned k = 0; k < 16; ++k) sum += fragment_a(s, row, k) * fragment_b(s, k, col);
        d[e] += sum;
    }
    sync_warp();  // every lane has read the fragments before a next product overwrites them
}

void async_copy(void* dst, const void* src, unsigned len, unsigned src_len) {
    PendingCopy c{dst, {}, len};
    std::memcpy(c.bytes, src, std::min(src_len, len));  // zero past src_len
    // Half the copies land at once, half only at the thread's next wait: a kernel that reads
    // a tile before waiting for it, or overwrites one another thread still reads, sees it.
    active->coin = active->coin * 6364136223846793005ull + 1442695040888963407ull;
    if ((active->coin >> 40) & 1)
        std::memcpy(dst, c.bytes, len);
    else
        active->fibers[active->current].pending.push_back(c);
}

void async_wait() {
    auto& pending = active->fibers[active->current].pending;
    for (const PendingCopy& c : pending) std::memcpy(c.dst, c.bytes, c.len);
    pending.clear();
}

void ldmatrix_x4(unsigned* r, const void* row, bool trans) {
    WarpSlots& s = active->slots[warp_of_current()];
    unsigned lane = lane_of_current();
    s.row[lane] = row;
    sync_warp();
    auto half = [&](unsigned matrix, unsigned i, unsigned j) {  // element (i, j) of a matrix
        std::uint16_t h;
        std::memcpy(&h, static_cast<const char*>(s.row[8 * matrix + i]) + 2 * j, sizeof h);
        return static_cast<unsigned>(h);
    };
    unsigned i = lane / 4, j = 2 * (lane % 4);
    for (unsigned m = 0; m < 4; ++m)
        r[m] = trans ? half(m, j, i) | (half(m, j + 1, i) << 16) : half(m, i, j) | (half(m, i, j + 1) << 16);
    sync_warp();  // every lane has read the rows before a next load overwrites them
}

}  // namespace simt

extern "C" int plait_simt_launch(const char* name, const char* signature, unsigned grid, unsigned block,
                                 void** args, char* error, std::size_t error_len) {
    using namespace simt;
    auto fail = [&](const std::string& message) {
        std::snprintf(error, error_len, "%s", message.c_str());
        return 1;
    };
    const Entry* entry = nullptr;
    for (const Entry& e : registry())
        if (std::strcmp(e.name, name) == 0) entry = &e;
    if (!entry) return fail(std::string("no kernel named ") + name);
    if (entry->signature != signature)
        return fail(std::string("kernel ") + name + " takes (" + entry->signature + "), launched with (" +
                    signature + ")");
    if (block == 0 || block > PLAIT_MAX_BLOCK || (block & (block - 1)) != 0)
        return fail("block size " + std::to_string(block) + " is not a power of two up to " +
                    std::to_string(PLAIT_MAX_BLOCK));
    std::function<void()> body = entry->bind_args(args);
    Block b;
    b.body = &body;
    b.fibers.resize(block);
    Block* outer = active;
    active = &b;
    block_dim = dim3{block, 1, 1};
    grid_dim = dim3{grid, 1, 1};
    int status = 0;
    for (unsigned g = 0; g < grid && status == 0; ++g) {
        block_idx = dim3{g, 1, 1};
        if (!run_block(b, block))
            status = fail(std::string("kernel ") + name + ": some threads of block " + std::to_string(g) +
                          " wait at a barrier (__syncthreads() or a warp-wide operation) that others "
                          "returned before or never reach");
    }
    active = outer;
    return status;
}

extern "C" int plait_simt_kernel_signature(const char* name, char* out, std::size_t out_len) {
    for (const simt::Entry& e : simt::registry())
        if (std::strcmp(e.name, name) == 0) {
            std::snprintf(out, out_len, "%s", e.signature.c_str());
            return 0;
        }
    return 1;
}
