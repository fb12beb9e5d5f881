// Mixture of experts (kernels/src/moe.rs): `TopKRouter`'s routing rule (ir/src/routing.rs) per
// token, and the pointwise parts of `MoeExperts` around its batched GEMMs (the launcher runs
// every expert on every token as one strided batch: a gate of 0 contributes exactly 0, as in
// the CPU kernel that skips those tokens).
//
// TODO(runtime, issue 15): routed GEMMs (each expert on its own tokens, grouped), which cost
// k/experts of these dense ones.

#define PLAIT_MAX_TOPK 64
#define PLAIT_MAX_GROUPS 64
#define PLAIT_MAX_GROUP_TOP 8

// One token's routing (ir::routing::Routing) over its row of `experts` logits.
struct Router {
    const float* logits;
    i64 experts, k, groups, kept, group_top;
    int sigmoid, normalize;
    double max, sum;  // the softmax's row max and Σ exp(l − max)
};

// Expert e's score: a sigmoid, or the softmax over the row (as Routing::scores, in f64).
__device__ double router_score(const Router& r, i64 e) {
    double l = r.logits[e];
    if (r.sigmoid) return 1.0 / (1.0 + exp(-l));
    return exp(l - r.max) / r.sum;
}

__device__ Router router_row(const float* logits, i64 experts, i64 k, i64 groups, i64 kept, i64 group_top,
                             int sigmoid, int normalize) {
    Router r;
    r.logits = logits;
    r.experts = experts;
    r.k = k;
    r.groups = groups;
    r.kept = kept;
    r.group_top = group_top;
    r.sigmoid = sigmoid;
    r.normalize = normalize;
    r.max = -INFINITY;
    for (i64 e = 0; e < experts; ++e) r.max = fmax(r.max, (double)logits[e]);
    r.sum = 0.0;
    for (i64 e = 0; e < experts; ++e) r.sum += exp((double)logits[e] - r.max);
    return r;
}

__device__ bool listed(const i64* list, i64 n, i64 x) {
    for (i64 i = 0; i < n; ++i)
        if (list[i] == x) return true;
    return false;
}

// Group g's score: the sum of its `group_top` best experts' scores (DeepSeek-V3 two, V2 one),
// added best first; ties to the lower index.
__device__ double group_score(const Router& r, i64 g) {
    i64 size = r.experts / r.groups, taken[PLAIT_MAX_GROUP_TOP];
    double sum = 0.0;
    for (i64 j = 0; j < r.group_top && j < size; ++j) {
        i64 best = -1;
        for (i64 e = g * size; e < (g + 1) * size; ++e) {
            if (listed(taken, j, e)) continue;
            if (best < 0 || router_score(r, e) > router_score(r, best)) best = e;
        }
        taken[j] = best;
        sum += router_score(r, best);
    }
    return sum;
}

// The `kept` best groups into `groups_out` (best first; ties to the lower index).
__device__ void kept_groups(const Router& r, i64* groups_out) {
    for (i64 j = 0; j < r.kept; ++j) {
        i64 best = -1;
        double best_score = 0.0;
        for (i64 g = 0; g < r.groups; ++g) {
            if (listed(groups_out, j, g)) continue;
            double s = group_score(r, g);
            if (best < 0 || s > best_score) {
                best = g;
                best_score = s;
            }
        }
        groups_out[j] = best;
    }
}

// The k chosen experts into `chosen`, best first (ties to the lower index), among the kept
// groups' experts; returns the gates' denominator (their score sum, or 1 without normalizing).
__device__ double choose(const Router& r, i64* chosen) {
    i64 groups_kept[PLAIT_MAX_GROUPS];
    if (r.groups > 1) kept_groups(r, groups_kept);
    i64 size = r.experts / r.groups;
    for (i64 j = 0; j < r.k; ++j) {
        i64 best = -1;
        for (i64 e = 0; e < r.experts; ++e) {
            if (listed(chosen, j, e) || (r.groups > 1 && !listed(groups_kept, r.kept, e / size))) continue;
            if (best < 0 || router_score(r, e) > router_score(r, best)) best = e;
        }
        chosen[j] = best;
    }
    double den = 0.0;
    for (i64 j = 0; j < r.k; ++j) den += router_score(r, chosen[j]);
    return r.normalize ? den : 1.0;
}

// gates[t, e] = score / denominator for the chosen experts of token t, 0 elsewhere.
extern "C" __global__ void topk_route(float* gates, const float* logits, i64 tokens, i64 experts, i64 k,
                                      i64 groups, i64 kept, i64 group_top, int sigmoid, int normalize) {
    for (i64 t = global_thread(); t < tokens; t += grid_threads()) {
        Router r = router_row(logits + t * experts, experts, k, groups, kept, group_top, sigmoid, normalize);
        i64 chosen[PLAIT_MAX_TOPK];
        double den = choose(r, chosen);
        float* row = gates + t * experts;
        for (i64 e = 0; e < experts; ++e) row[e] = 0.0f;
        for (i64 j = 0; j < k; ++j) row[chosen[j]] = (float)(router_score(r, chosen[j]) / den);
    }
}

// The logits' gradient from the gates' (Routing::logits_grad): through the chosen scores only.
extern "C" __global__ void topk_route_backward(float* dlogits, const float* logits, const float* g, i64 tokens,
                                               i64 experts, i64 k, i64 groups, i64 kept, i64 group_top,
                                               int sigmoid, int normalize) {
    for (i64 t = global_thread(); t < tokens; t += grid_threads()) {
        Router r = router_row(logits + t * experts, experts, k, groups, kept, group_top, sigmoid, normalize);
        i64 chosen[PLAIT_MAX_TOPK];
        double den = choose(r, chosen);
        const float* gr = g + t * experts;
        double pulled = 0.0;
        if (normalize)
            for (i64 j = 0; j < k; ++j) pulled += (double)gr[chosen[j]] * router_score(r, chosen[j]) / den;
        // d score_e: (g_e − pulled) / den where chosen, else 0; the softmax's Σ ds·s over the
        // experts in index order.
        double dot = 0.0;
        for (i64 e = 0; e < experts; ++e)
            if (listed(chosen, k, e)) dot += ((double)gr[e] - pulled) / den * router_score(r, e);
        float* out = dlogits + t * experts;
        for (i64 e = 0; e < experts; ++e) {
            double ds = listed(chosen, k, e) ? ((double)gr[e] - pulled) / den : 0.0;
            double s = router_score(r, e);
            out[e] = (float)(sigmoid ? ds * s * (1.0 - s) : s * (ds - dot));
        }
    }
}

// The experts' gated unit act(g)·(u + offset), act(g) = g·σ(α·g), of the gate g = a and the up
// projection u = b, both clamped where limit > 0 (g ≤ limit, |u| ≤ limit: gpt-oss's); α = 1, no
// limit and offset 0 is SwiGLU, silu(a) ⊙ b. In f64 and rounded once, as the CPU kernel.
__device__ void expert_clamped(double& g, double& u, double limit) {
    if (limit > 0.0) {
        g = fmin(g, limit);
        u = fmax(fmin(u, limit), -limit);
    }
}

extern "C" __global__ void expert_unit(float* hidden, const float* a, const float* b, i64 n, double alpha,
                                       double limit, double offset) {
    for (i64 i = global_thread(); i < n; i += grid_threads()) {
        double g = a[i], u = b[i];
        expert_clamped(g, u, limit);
        hidden[i] = (float)(g * sigmoid64(alpha * g) * (u + offset));
    }
}

// Its gradient: db = dh · act(g) where u is inside the limits, da = dh · act'(g) · (u + offset)
// where g is (a clamped value passes nothing; at the limit, all: torch.clamp's rule).
extern "C" __global__ void expert_unit_backward(float* da, float* db, const float* dh, const float* a,
                                                const float* b, i64 n, double alpha, double limit,
                                                double offset) {
    for (i64 i = global_thread(); i < n; i += grid_threads()) {
        double g = a[i], u = b[i], d = dh[i];
        expert_clamped(g, u, limit);
        double s = sigmoid64(alpha * g);
        bool gate_open = !(limit > 0.0) || (double)a[i] <= limit;
        bool up_open = !(limit > 0.0) || fabs((double)b[i]) <= limit;
        db[i] = up_open ? (float)(d * g * s) : 0.0f;
        da[i] = gate_open ? (float)(d * (u + offset) * (s * (1.0 + alpha * g * (1.0 - s)))) : 0.0f;
    }
}

// a[e, t, c] += bias[e, c]: each expert's bias on its projection of every token (gpt-oss).
extern "C" __global__ void expert_bias_add(float* a, const float* bias, i64 experts, i64 tokens, i64 f) {
    for (i64 i = global_thread(); i < experts * tokens * f; i += grid_threads()) {
        i64 e = i / (tokens * f), c = i % f;
        a[i] += bias[e * f + c];
    }
}

// dbias[e, c] = Σ_t da[e, t, c], tokens in order, in f64.
extern "C" __global__ void expert_bias_grad(float* dbias, const float* da, i64 experts, i64 tokens, i64 f) {
    for (i64 i = global_thread(); i < experts * f; i += grid_threads()) {
        i64 e = i / f, c = i % f;
        double s = 0.0;
        for (i64 t = 0; t < tokens; ++t) s += (double)da[(e * tokens + t) * f + c];
        dbias[i] = (float)s;
    }
}

// y[t, c] = Σ_e gates[t, e] · out[e, t, c], experts in order, in f32 as the CPU kernel adds.
extern "C" __global__ void moe_combine(float* y, const float* out, const float* gates, i64 tokens, i64 experts,
                                       i64 h) {
    for (i64 i = global_thread(); i < tokens * h; i += grid_threads()) {
        i64 t = i / h;
        float acc = 0.0f;
        for (i64 e = 0; e < experts; ++e) {
            float gate = gates[t * experts + e];
            if (gate != 0.0f) acc += gate * out[e * tokens * h + i];
        }
        y[i] = acc;
    }
}

// dgates[t, e] = dy[t] · out[e, t] (f64 dot), defined for every expert as the CPU kernel's.
extern "C" __global__ void moe_gate_grad(float* dgates, const float* dy, const float* out, i64 tokens,
                                         i64 experts, i64 h) {
    for (i64 i = global_thread(); i < tokens * experts; i += grid_threads()) {
        i64 t = i / experts, e = i % experts;
        double s = 0.0;
        for (i64 c = 0; c < h; ++c) s += (double)dy[t * h + c] * out[(e * tokens + t) * h + c];
        dgates[i] = (float)s;
    }
}

// dout[e, t, c] = gates[t, e] · dy[t, c] (also each expert's gated input, gates[t, e] · x[t, c]).
extern "C" __global__ void moe_gate_scale(float* dout, const float* dy, const float* gates, i64 tokens,
                                          i64 experts, i64 h) {
    for (i64 i = global_thread(); i < experts * tokens * h; i += grid_threads()) {
        i64 e = i / (tokens * h), th = i % (tokens * h);
        dout[i] = gates[(th / h) * experts + e] * dy[th];
    }
}

// dx[i] = Σ_e (from_w1[e, i] + from_w3[e, i]), experts in order, in f32; from_w3 may be null
// (the experts' outputs summed unweighted: Llama 4's, whose gates scaled their inputs).
extern "C" __global__ void moe_expert_sum(float* dx, const float* from_w1, const float* from_w3, i64 experts,
                                          i64 n) {
    for (i64 i = global_thread(); i < n; i += grid_threads()) {
        float acc = 0.0f;
        for (i64 e = 0; e < experts; ++e) {
            acc += from_w1[e * n + i];
            if (from_w3) acc += from_w3[e * n + i];
        }
        dx[i] = acc;
    }
}
