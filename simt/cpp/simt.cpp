// plait's SIMT emulator: runs the device kernels of kernels/cuda on the host (see simt.hpp)
// behind one C entry point, `plait_simt_launch`, whose arguments follow cuLaunchKernel's
// (an array of pointers to the argument values).

#include "simt.hpp"

#include <ucontext.h>

#include <cstdio>
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

struct Fiber {
    ucontext_t context;
    std::vector<char> stack = std::vector<char>(kStackBytes);
    bool done = false;
};

struct Block {
    std::function<void()>* body;
    std::vector<Fiber> fibers;
    ucontext_t scheduler;
    std::size_t current = 0;
};

thread_local Block* active = nullptr;

void fiber_main() {
    (*active->body)();
    active->fibers[active->current].done = true;
}

// Runs one block: every fiber up to its next barrier, round and round (in a shuffled order),
// until all return.
// A barrier that some threads skip (they returned while others wait) is an error on a GPU
// (undefined behaviour): reported, not hidden.
bool run_block(Block& b, unsigned threads) {
    for (unsigned t = 0; t < threads; ++t) {
        Fiber& f = b.fibers[t];
        f.done = false;
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = f.stack.data();
        f.context.uc_stack.ss_size = f.stack.size();
        f.context.uc_link = &b.scheduler;
        makecontext(&f.context, fiber_main, 0);
    }
    // Each phase (barrier to barrier) runs the threads in a different order, so a kernel that
    // reads what another thread writes in the same phase (a race on a GPU) gives a different
    // result than its tests expect instead of passing by the luck of a fixed order.
    std::vector<unsigned> order(threads);
    unsigned long long lcg = 0x9E3779B97F4A7C15ull ^ (unsigned long long)block_idx.x;
    for (;;) {
        for (unsigned t = 0; t < threads; ++t) order[t] = t;
        for (unsigned t = threads; t > 1; --t) {
            lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
            std::swap(order[t - 1], order[(lcg >> 33) % t]);
        }
        unsigned finished = 0;
        for (unsigned i = 0; i < threads; ++i) {
            unsigned t = order[i];
            if (b.fibers[t].done) {
                ++finished;
                continue;
            }
            b.current = t;
            thread_idx = dim3{t, 1, 1};
            swapcontext(&b.scheduler, &b.fibers[t].context);
            finished += b.fibers[t].done ? 1 : 0;
        }
        if (finished == threads) return true;
        if (finished != 0) return false;
    }
}

}  // namespace

void sync_threads() {
    Fiber& f = active->fibers[active->current];
    swapcontext(&f.context, &active->scheduler);
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
                          " returned while others wait at __syncthreads()");
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
