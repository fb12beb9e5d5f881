//! Mixture of experts on the device (`moe.cu`): `TopKRouter` as the router's GEMM and a
//! routing kernel per token; `MoeExperts` as strided-batched GEMMs over all experts at once
//! (every expert on every token, `x` shared by the batch with stride 0) around the experts'
//! gated unit (SwiGLU, or gpt-oss's clamped one with biases) and the gated combination. The CPU kernel runs each expert on its routed tokens only; a gate of 0
//! contributes exactly 0 here, so the results agree, at experts/k times the GEMM work (the
//! routed, grouped form is issue 15's next step for MoE).

use ir::routing::Routing;
use ir::{ExpertForm, OpKind};

use super::{Buf, launch_pointwise as launch, matmul, pointwise_grid, size};
use crate::RuntimeError;
use crate::backend::device::{Device, DeviceBackend, Gemm, KernelArg};

/// The largest top-k and kept-group count the routing kernels hold per token (`moe.cu`).
const MAX_TOPK: u64 = 64;
const MAX_GROUPS: u64 = 64;
/// `moe.cu`'s `PLAIT_MAX_GROUP_TOP`: the most experts a group's score sums.
const MAX_GROUP_TOP: u64 = 8;

/// The router's logits `x · w (+ b)`: a linear map, biased where the router is (gpt-oss).
fn router_linear<D: Device>(xs: &[&Buf<D>]) -> OpKind {
    OpKind::Linear {
        bias: xs.len() == 3,
    }
}

/// The router's sizes when the device handles them: tokens and experts.
fn router_dims<D: Device>(
    xs: &[&Buf<D>],
    experts: u64,
    k: u64,
    routing: &Routing,
) -> Option<(usize, usize)> {
    let (&[x, w, ref bias @ ..], Ok(e)) = (xs, usize::try_from(experts)) else {
        return None;
    };
    let fits = routing.check(experts, k).is_ok()
        && k <= MAX_TOPK
        && routing.groups_kept <= MAX_GROUPS
        && routing.group_top <= MAX_GROUP_TOP;
    let bias_fits = match bias {
        [] => true,
        [b] => b.shape == [e],
        _ => false,
    };
    let h = *x.shape.last()?;
    (fits && bias_fits && w.shape == [h, e]).then(|| (x.len / h.max(1), e))
}

/// The routing kernels' arguments after their buffers.
fn routing_args<'a, M>(
    tokens: usize,
    experts: usize,
    k: u64,
    r: &Routing,
) -> [KernelArg<'a, M>; 8] {
    let as_i64 = |v: u64| KernelArg::I64(i64::try_from(v).unwrap_or(i64::MAX));
    [
        size(tokens),
        size(experts),
        as_i64(k),
        as_i64(r.groups),
        as_i64(r.groups_kept),
        as_i64(r.group_top),
        KernelArg::I32(i32::from(r.sigmoid)),
        KernelArg::I32(i32::from(r.normalize)),
    ]
}

/// Gates `[.., E]`: the chosen experts' weights from the logits `x · w`.
pub(super) fn router_forward<D: Device>(
    b: &DeviceBackend<D>,
    (experts, k, routing): (u64, u64, &Routing),
    xs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let Some((tokens, e)) = router_dims::<D>(xs, experts, k, routing) else {
        return Ok(None);
    };
    let Some(logits) = matmul::forward(b, &router_linear::<D>(xs), xs)? else {
        return Ok(None);
    };
    let mut gates = b.alloc(&logits.shape)?;
    let block = b.device.block_size();
    let mut args = vec![KernelArg::Out(&mut gates.mem), KernelArg::In(&logits.mem)];
    args.extend(routing_args(tokens, e, k, routing));
    b.device.launch(
        "topk_route",
        pointwise_grid(block, tokens),
        block,
        &mut args,
    )?;
    b.device.release(logits.mem);
    Ok(Some(gates))
}

/// `[dx, dw]` (and the bias's) through the chosen scores, then the router's linear map.
pub(super) fn router_backward<D: Device>(
    b: &DeviceBackend<D>,
    (experts, k, routing): (u64, u64, &Routing),
    xs: &[&Buf<D>],
    g: &Buf<D>,
    wanted: &[bool],
) -> Result<Option<Vec<Option<Buf<D>>>>, RuntimeError> {
    let Some((tokens, e)) = router_dims::<D>(xs, experts, k, routing) else {
        return Ok(None);
    };
    let Some(logits) = matmul::forward(b, &router_linear::<D>(xs), xs)? else {
        return Ok(None);
    };
    if g.shape != logits.shape {
        b.device.release(logits.mem);
        return Ok(None);
    }
    let mut dlogits = b.alloc(&logits.shape)?;
    let block = b.device.block_size();
    let mut args = vec![
        KernelArg::Out(&mut dlogits.mem),
        KernelArg::In(&logits.mem),
        KernelArg::In(&g.mem),
    ];
    args.extend(routing_args(tokens, e, k, routing));
    b.device.launch(
        "topk_route_backward",
        pointwise_grid(block, tokens),
        block,
        &mut args,
    )?;
    b.device.release(logits.mem);
    let grads = matmul::backward(b, &router_linear::<D>(xs), xs, &dlogits, wanted, [false; 2]);
    b.device.release(dlogits.mem);
    grads
}

/// `MoeExperts`' sizes: tokens, experts, hidden width, expert width.
#[derive(Clone, Copy)]
struct Dims {
    t: usize,
    e: usize,
    h: usize,
    f: usize,
}

fn experts_dims<'a, D: Device>(
    experts: u64,
    form: ExpertForm,
    xs: &[&'a Buf<D>],
) -> Option<(Dims, Operands<'a, D>)> {
    let (&[x, gates, w1, w3, w2], biases) = xs.split_at_checked(5)? else {
        return None;
    };
    let (b1, b3) = match *biases {
        [] if !form.bias => (None, None),
        [b1, b3] if form.bias => (Some(b1), Some(b3)),
        _ => return None,
    };
    let e = usize::try_from(experts).ok()?;
    let h = *x.shape.last()?;
    let t = x.len / h.max(1);
    let f = *w1.shape.get(2)?;
    let mut gate_shape = x.shape.clone();
    *gate_shape.last_mut()? = e;
    let ok = gates.shape == gate_shape
        && w1.shape == [e, h, f]
        && w3.shape == [e, h, f]
        && w2.shape == [e, f, h]
        && [b1, b3].iter().flatten().all(|b| b.shape == [e, f])
        && t * h * f * e > 0;
    ok.then_some((
        Dims { t, e, h, f },
        Operands {
            x,
            gates,
            w1,
            w3,
            w2,
            b1,
            b3,
            form,
        },
    ))
}

/// Every expert's `c[e] = op(a[e]) · op(b[e])`: `[t, k] · [k, n]` products batched over
/// the experts with the given strides (0: one matrix shared by all).
fn batched(
    b: &DeviceBackend<impl Device>,
    (m, k, n): (usize, usize, usize),
    (trans_a, trans_b): (bool, bool),
    (stride_a, stride_b): (usize, usize),
    experts: usize,
) -> Gemm {
    Gemm {
        batch: experts,
        trans_a,
        trans_b,
        stride_a,
        stride_b,
        stride_c: m * n,
        precision: b.gemm_precision,
        ..Gemm::plain(m, k, n)
    }
}

/// The experts' activations on every token: `a = x w1ₑ (+ b1ₑ)`, `b = x w3ₑ (+ b3ₑ)`,
/// `hidden = unit(a, b)` and `out = hidden w2ₑ`, each `[E, t, ·]`.
struct Pass<D: Device> {
    a: Buf<D>,
    b: Buf<D>,
    hidden: Buf<D>,
    out: Buf<D>,
}

/// `MoeExperts`' operands, in order, and its form.
struct Operands<'a, D: Device> {
    x: &'a Buf<D>,
    gates: &'a Buf<D>,
    w1: &'a Buf<D>,
    w3: &'a Buf<D>,
    w2: &'a Buf<D>,
    b1: Option<&'a Buf<D>>,
    b3: Option<&'a Buf<D>>,
    form: ExpertForm,
}

/// The gated unit's attributes as `expert_unit` takes them (limit 0: none).
fn unit_args<'a, M>(form: &ExpertForm) -> [KernelArg<'a, M>; 3] {
    [
        KernelArg::F64(form.alpha),
        KernelArg::F64(form.limit.unwrap_or(0.0)),
        KernelArg::F64(form.up_offset),
    ]
}

/// `a[e, t, ·] += bias[e, ·]` where the expert has a bias.
fn add_bias<D: Device>(
    be: &DeviceBackend<D>,
    d: Dims,
    a: &mut Buf<D>,
    bias: Option<&Buf<D>>,
) -> Result<(), RuntimeError> {
    let Some(bias) = bias else {
        return Ok(());
    };
    launch(
        be,
        "expert_bias_add",
        d.e * d.t * d.f,
        &mut [
            KernelArg::Out(&mut a.mem),
            KernelArg::In(&bias.mem),
            size(d.e),
            size(d.t),
            size(d.f),
        ],
    )
}

/// `dbias[e, ·] = Σ_t da[e, t, ·]`.
fn bias_grad<D: Device>(
    be: &DeviceBackend<D>,
    d: Dims,
    da: &Buf<D>,
) -> Result<Buf<D>, RuntimeError> {
    let mut db = be.alloc(&[d.e, d.f])?;
    launch(
        be,
        "expert_bias_grad",
        d.e * d.f,
        &mut [
            KernelArg::Out(&mut db.mem),
            KernelArg::In(&da.mem),
            size(d.e),
            size(d.t),
            size(d.f),
        ],
    )?;
    Ok(db)
}

/// Each expert's own input `[E, t, h]`, gates[t, e]·x[t], where the form scales the input
/// (Llama 4); none where every expert reads x.
fn scaled_inputs<D: Device>(
    be: &DeviceBackend<D>,
    d: Dims,
    o: &Operands<'_, D>,
) -> Result<Option<Buf<D>>, RuntimeError> {
    if !o.form.scales_input {
        return Ok(None);
    }
    let mut xs = be.alloc(&[d.e, d.t, d.h])?;
    launch(
        be,
        "moe_gate_scale",
        d.e * d.t * d.h,
        &mut [
            KernelArg::Out(&mut xs.mem),
            KernelArg::In(&o.x.mem),
            KernelArg::In(&o.gates.mem),
            size(d.t),
            size(d.e),
            size(d.h),
        ],
    )?;
    Ok(Some(xs))
}

/// The experts' input: `xs` per expert where given, else x for all (stride 0).
fn experts_input<'a, D: Device>(
    d: Dims,
    o: &Operands<'a, D>,
    xs: Option<&'a Buf<D>>,
) -> (&'a D::Mem, usize) {
    match xs {
        Some(xs) => (&xs.mem, d.t * d.h),
        None => (&o.x.mem, 0),
    }
}

fn expert_pass<D: Device>(
    be: &DeviceBackend<D>,
    d: Dims,
    o: &Operands<'_, D>,
    xs: Option<&Buf<D>>,
) -> Result<Pass<D>, RuntimeError> {
    let (w1, w3, w2) = (o.w1, o.w3, o.w2);
    let (t, e, h, f) = (d.t, d.e, d.h, d.f);
    let (x, x_stride) = experts_input(d, o, xs);
    let up = batched(be, (t, h, f), (false, false), (x_stride, h * f), e);
    let mut a = be.alloc(&[e, t, f])?;
    be.device.gemm(&up, x, &w1.mem, &mut a.mem)?;
    add_bias(be, d, &mut a, o.b1)?;
    let mut bm = be.alloc(&[e, t, f])?;
    be.device.gemm(&up, x, &w3.mem, &mut bm.mem)?;
    add_bias(be, d, &mut bm, o.b3)?;
    let mut hidden = be.alloc(&[e, t, f])?;
    let mut args = vec![
        KernelArg::Out(&mut hidden.mem),
        KernelArg::In(&a.mem),
        KernelArg::In(&bm.mem),
        size(e * t * f),
    ];
    args.extend(unit_args(&o.form));
    launch(be, "expert_unit", e * t * f, &mut args)?;
    let down = batched(be, (t, f, h), (false, false), (t * f, f * h), e);
    let mut out = be.alloc(&[e, t, h])?;
    be.device.gemm(&down, &hidden.mem, &w2.mem, &mut out.mem)?;
    Ok(Pass {
        a,
        b: bm,
        hidden,
        out,
    })
}

/// `Σₑ gatesₑ · unit(x w1ₑ + b1ₑ, x w3ₑ + b3ₑ) w2ₑ`, or `Σₑ unit(gatesₑx w1ₑ, gatesₑx w3ₑ) w2ₑ`
/// where the form scales the input.
pub(super) fn experts_forward<D: Device>(
    b: &DeviceBackend<D>,
    (experts, form): (u64, ExpertForm),
    xs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let Some((d, o)) = experts_dims(experts, form, xs) else {
        return Ok(None);
    };
    let inputs = scaled_inputs(b, d, &o)?;
    let pass = expert_pass(b, d, &o, inputs.as_ref())?;
    let mut y = b.alloc(&o.x.shape)?;
    if form.scales_input {
        expert_total(b, d, &mut y, &pass.out, None)?;
    } else {
        combine(b, d, &mut y, &pass.out, o.gates)?;
    }
    for m in [pass.a, pass.b, pass.hidden, pass.out]
        .into_iter()
        .chain(inputs)
    {
        b.device.release(m.mem);
    }
    Ok(Some(y))
}

/// `y[t] = Σₑ gates[t, e] · per_expert[e, t]`.
fn combine<D: Device>(
    b: &DeviceBackend<D>,
    d: Dims,
    y: &mut Buf<D>,
    per_expert: &Buf<D>,
    gates: &Buf<D>,
) -> Result<(), RuntimeError> {
    launch(
        b,
        "moe_combine",
        d.t * d.h,
        &mut [
            KernelArg::Out(&mut y.mem),
            KernelArg::In(&per_expert.mem),
            KernelArg::In(&gates.mem),
            size(d.t),
            size(d.e),
            size(d.h),
        ],
    )
}

/// `y[t] = Σₑ (a[e, t] + b[e, t])`, b where given.
fn expert_total<D: Device>(
    be: &DeviceBackend<D>,
    d: Dims,
    y: &mut Buf<D>,
    a: &Buf<D>,
    b: Option<&Buf<D>>,
) -> Result<(), RuntimeError> {
    launch(
        be,
        "moe_expert_sum",
        d.t * d.h,
        &mut [
            KernelArg::Out(&mut y.mem),
            KernelArg::In(&a.mem),
            b.map_or(KernelArg::Null, |b| KernelArg::In(&b.mem)),
            size(d.e),
            size(d.t * d.h),
        ],
    )
}

/// `dgates[t, e] = dy[t] · per_expert[e, t]`.
fn gate_grad<D: Device>(
    b: &DeviceBackend<D>,
    d: Dims,
    dgates: &mut Buf<D>,
    dy: &Buf<D>,
    per_expert: &Buf<D>,
) -> Result<(), RuntimeError> {
    launch(
        b,
        "moe_gate_grad",
        d.t * d.e,
        &mut [
            KernelArg::Out(&mut dgates.mem),
            KernelArg::In(&dy.mem),
            KernelArg::In(&per_expert.mem),
            size(d.t),
            size(d.e),
            size(d.h),
        ],
    )
}

/// Gradients of `(x, gates, w1, w3, w2)` and the biases', as the CPU kernel defines them (the
/// gate gradient for every expert, chosen or not).
pub(super) fn experts_backward<D: Device>(
    b: &DeviceBackend<D>,
    (experts, form): (u64, ExpertForm),
    xs: &[&Buf<D>],
    g: &Buf<D>,
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    let Some((d, o)) = experts_dims(experts, form, xs) else {
        return Ok(None);
    };
    if g.shape != o.x.shape {
        return Ok(None);
    }
    let (t, e, h, f) = (d.t, d.e, d.h, d.f);
    let inputs = scaled_inputs(b, d, &o)?;
    let pass = expert_pass(b, d, &o, inputs.as_ref())?;
    let mut dgates = b.alloc(&o.gates.shape)?;
    if !form.scales_input {
        gate_grad(b, d, &mut dgates, g, &pass.out)?;
    }
    b.device.release(pass.out.mem);
    // Each expert's output gradient: gates[t, e]·dy[t], or dy itself (stride 0) where the
    // gate scaled the input instead.
    let dout = if form.scales_input {
        None
    } else {
        let mut dout = b.alloc(&[e, t, h])?;
        launch(
            b,
            "moe_gate_scale",
            e * t * h,
            &mut [
                KernelArg::Out(&mut dout.mem),
                KernelArg::In(&g.mem),
                KernelArg::In(&o.gates.mem),
                size(t),
                size(e),
                size(h),
            ],
        )?;
        Some(dout)
    };
    let (dout_mem, dout_stride) = dout.as_ref().map_or((&g.mem, 0), |m| (&m.mem, t * h));
    let mut dw2 = b.alloc(&o.w2.shape)?;
    let hidden_t = batched(b, (f, t, h), (true, false), (t * f, dout_stride), e);
    b.device
        .gemm(&hidden_t, &pass.hidden.mem, dout_mem, &mut dw2.mem)?;
    b.device.release(pass.hidden.mem);
    let mut dhidden = b.alloc(&[e, t, f])?;
    let through_w2 = batched(b, (t, h, f), (false, true), (dout_stride, f * h), e);
    b.device
        .gemm(&through_w2, dout_mem, &o.w2.mem, &mut dhidden.mem)?;
    if let Some(dout) = dout {
        b.device.release(dout.mem);
    }
    let (mut da, mut db) = (b.alloc(&[e, t, f])?, b.alloc(&[e, t, f])?);
    let mut args = vec![
        KernelArg::Out(&mut da.mem),
        KernelArg::Out(&mut db.mem),
        KernelArg::In(&dhidden.mem),
        KernelArg::In(&pass.a.mem),
        KernelArg::In(&pass.b.mem),
        size(e * t * f),
    ];
    args.extend(unit_args(&o.form));
    launch(b, "expert_unit_backward", e * t * f, &mut args)?;
    for m in [dhidden, pass.a, pass.b] {
        b.device.release(m.mem);
    }
    let grads = input_side_grads(b, d, (&o, inputs.as_ref()), (&da, &db), &mut dgates);
    if let Some(xs) = inputs {
        b.device.release(xs.mem);
    }
    let biases = if form.bias {
        Some((bias_grad(b, d, &da), bias_grad(b, d, &db)))
    } else {
        None
    };
    b.device.release(da.mem);
    b.device.release(db.mem);
    let [dx, dw1, dw3] = grads?;
    let mut all = vec![dx, dgates, dw1, dw3, dw2];
    if let Some((db1, db3)) = biases {
        all.extend([db1?, db3?]);
    }
    Ok(Some(all))
}

/// `[dx, dw1, dw3]` from the gradients `da`, `db` of the two up projections of the experts'
/// input (`xs` where each expert has its own, [`scaled_inputs`]). Where the gate scaled the
/// input, its gradient dxs gives dx = Σₑ gateₑ·dxsₑ and, into `dgates`, x·dxsₑ.
fn input_side_grads<D: Device>(
    b: &DeviceBackend<D>,
    d: Dims,
    (o, xs): (&Operands<'_, D>, Option<&Buf<D>>),
    (da, db): (&Buf<D>, &Buf<D>),
    dgates: &mut Buf<D>,
) -> Result<[Buf<D>; 3], RuntimeError> {
    let (t, e, h, f) = (d.t, d.e, d.h, d.f);
    let (w1, w3) = (o.w1, o.w3);
    let (x, x_stride) = experts_input(d, o, xs);
    let x_t = batched(b, (h, t, f), (true, false), (x_stride, t * f), e);
    let (mut dw1, mut dw3) = (b.alloc(&w1.shape)?, b.alloc(&w3.shape)?);
    b.device.gemm(&x_t, x, &da.mem, &mut dw1.mem)?;
    b.device.gemm(&x_t, x, &db.mem, &mut dw3.mem)?;
    let through_w = batched(b, (t, f, h), (false, true), (t * f, h * f), e);
    let mut dx = b.alloc(&o.x.shape)?;
    let mut from_w1 = b.alloc(&[e, t, h])?;
    b.device
        .gemm(&through_w, &da.mem, &w1.mem, &mut from_w1.mem)?;
    if o.form.scales_input {
        // dxs = da w1ₑᵀ + db w3ₑᵀ, in place.
        let onto = Gemm {
            accumulate: true,
            ..through_w
        };
        b.device.gemm(&onto, &db.mem, &w3.mem, &mut from_w1.mem)?;
        combine(b, d, &mut dx, &from_w1, o.gates)?;
        gate_grad(b, d, dgates, o.x, &from_w1)?;
    } else {
        let mut from_w3 = b.alloc(&[e, t, h])?;
        b.device
            .gemm(&through_w, &db.mem, &w3.mem, &mut from_w3.mem)?;
        expert_total(b, d, &mut dx, &from_w1, Some(&from_w3))?;
        b.device.release(from_w3.mem);
    }
    b.device.release(from_w1.mem);
    Ok([dx, dw1, dw3])
}
