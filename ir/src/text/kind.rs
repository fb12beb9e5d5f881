//! Op kinds as text: the mnemonic, a quoted name for named sources, then `{key=value, ...}`.
//!
//! Printing and parsing of attributes live side by side here so the two cannot drift apart:
//! [`attrs_of`] lists what the printer writes and [`build_kind`] consumes exactly that.

use std::fmt;

use crate::expert::ExpertForm;
use crate::op::{AdamWConfig, OpKind};
use crate::rope::RopeScaling;
use crate::routing::Routing;
use crate::types::Dim;

/// One attribute value. Each key has one value type, whatever op it belongs to.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum AttrVal {
    Bool(bool),
    Float(f64),
    Int(u64),
    Dim(Dim),
    Dims(Vec<Dim>),
    Ints(Vec<u64>),
    Kind(Box<OpKind>),
}

/// The value type an attribute key takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttrTy {
    Bool,
    Float,
    Int,
    Dim,
    Dims,
    Ints,
    Kind,
}

/// The type of attribute `key`, or `None` when no op has such an attribute.
pub(crate) fn attr_type(key: &str) -> Option<AttrTy> {
    Some(match key {
        "bias" | "tanh" | "causal" | "sigmoid" | "normalize" | "sinks" | "truncate" | "nope"
        | "scales_input" => AttrTy::Bool,
        "value" | "exponent" | "factor" | "eps" | "scale" | "theta" | "p" | "lr" | "beta1"
        | "beta2" | "weight_decay" | "low_freq_factor" | "high_freq_factor" | "original_max"
        | "beta_fast" | "beta_slow" | "attention_factor" | "softcap" | "alpha" | "limit"
        | "up_offset" | "temperature_floor" | "temperature_scale" => AttrTy::Float,
        "heads" | "kv_heads" | "axis" | "start" | "end" | "seed" | "experts" | "k" | "groups"
        | "groups_kept" | "group_top" | "window" | "chunk" => AttrTy::Int,
        "len" => AttrTy::Dim,
        "shape" => AttrTy::Dims,
        "perm" | "sizes" | "wrt" => AttrTy::Ints,
        "of" => AttrTy::Kind,
        _ => return None,
    })
}

/// Whether the kind carries a name, printed as a quoted string after the mnemonic.
pub(crate) fn is_named_source(mnemonic: &str) -> bool {
    matches!(mnemonic, "input" | "param" | "buffer" | "state")
}

/// The source name of `kind`, if it is a named source.
pub(crate) fn source_name(kind: &OpKind) -> Option<&str> {
    match kind {
        OpKind::Input { name }
        | OpKind::Param { name }
        | OpKind::Buffer { name }
        | OpKind::State { name } => Some(name),
        _ => None,
    }
}

/// The attributes of a rotary embedding's scaling, none for plain frequencies; the parser's
/// [`Attrs::rope_scaling`] tells the kinds apart by these keys.
fn rope_scaling_attrs(scaling: &RopeScaling) -> Vec<(&'static str, AttrVal)> {
    use AttrVal::{Bool, Float};
    match *scaling {
        RopeScaling::None => vec![],
        RopeScaling::Nope => vec![("nope", Bool(true))],
        RopeScaling::Temperature { floor, scale } => vec![
            ("temperature_floor", Float(floor)),
            ("temperature_scale", Float(scale)),
        ],
        RopeScaling::Linear { factor } => vec![("factor", Float(factor))],
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max,
        } => vec![
            ("factor", Float(factor)),
            ("low_freq_factor", Float(low_freq_factor)),
            ("high_freq_factor", Float(high_freq_factor)),
            ("original_max", Float(original_max)),
        ],
        RopeScaling::Yarn {
            factor,
            beta_fast,
            beta_slow,
            original_max,
            attention_factor,
            truncate,
        } => {
            let mut attrs = vec![
                ("factor", Float(factor)),
                ("beta_fast", Float(beta_fast)),
                ("beta_slow", Float(beta_slow)),
                ("original_max", Float(original_max)),
                ("attention_factor", Float(attention_factor)),
            ];
            // Printed only where it is not transformers' default, as older texts read.
            attrs.extend((!truncate).then_some(("truncate", Bool(false))));
            attrs
        }
    }
}

fn ints<T: Copy + Into<u64>>(xs: &[T]) -> AttrVal {
    AttrVal::Ints(xs.iter().map(|&x| x.into()).collect())
}

fn usizes(xs: &[usize]) -> AttrVal {
    // usize is at most 64 bits on every target Rust supports.
    AttrVal::Ints(xs.iter().map(|&x| x as u64).collect())
}

/// The attributes the printer writes for `kind`, in print order.
pub(crate) fn attrs_of(kind: &OpKind) -> Vec<(&'static str, AttrVal)> {
    use AttrVal::{Bool, Dims, Float, Int};
    match kind {
        OpKind::Scalar { value } => vec![("value", Float(*value))],
        OpKind::Iota { len } => vec![("len", AttrVal::Dim(*len))],
        OpKind::Linear { bias } => vec![("bias", Bool(*bias))],
        OpKind::Pow { exponent } => vec![("exponent", Float(*exponent))],
        OpKind::Scale { factor } => vec![("factor", Float(*factor))],
        OpKind::Clamp { limit } => vec![("limit", Float(*limit))],
        OpKind::Gelu { tanh } => vec![("tanh", Bool(*tanh))],
        OpKind::LayerNorm { eps, bias } => {
            let mut attrs = vec![("eps", Float(*eps))];
            attrs.extend((!bias).then_some(("bias", Bool(false))));
            attrs
        }
        OpKind::RmsNorm { eps } => vec![("eps", Float(*eps))],
        OpKind::Softmax { causal } => vec![("causal", Bool(*causal))],
        OpKind::Attention {
            heads,
            kv_heads,
            scale,
            causal,
            softcap,
            sinks,
            window,
            chunk,
        } => {
            let mut attrs = vec![
                ("heads", Int(*heads)),
                ("kv_heads", Int(*kv_heads)),
                ("scale", Float(*scale)),
                ("causal", Bool(*causal)),
            ];
            attrs.extend(softcap.map(|cap| ("softcap", Float(cap))));
            attrs.extend(sinks.then_some(("sinks", Bool(true))));
            attrs.extend(window.map(|w| ("window", Int(w))));
            attrs.extend(chunk.map(|c| ("chunk", Int(c))));
            attrs
        }
        OpKind::Rotary {
            heads,
            theta,
            scaling,
        } => {
            let mut attrs = vec![("heads", Int(*heads)), ("theta", Float(*theta))];
            attrs.extend(rope_scaling_attrs(scaling));
            attrs
        }
        OpKind::Reshape { shape } | OpKind::Expand { shape } => {
            vec![("shape", Dims(shape.clone()))]
        }
        OpKind::Transpose { perm } => vec![("perm", usizes(perm))],
        OpKind::Split { axis, sizes } => {
            vec![("axis", Int(*axis as u64)), ("sizes", ints(sizes))]
        }
        OpKind::Concat { axis } => vec![("axis", Int(*axis as u64))],
        OpKind::Slice { axis, start, end } => vec![
            ("axis", Int(*axis as u64)),
            ("start", Int(*start)),
            ("end", Int(*end)),
        ],
        OpKind::Dropout { p, seed } => vec![("p", Float(*p)), ("seed", Int(*seed))],
        OpKind::TopKRouter {
            experts,
            k,
            routing,
            bias,
        } => {
            let mut attrs = vec![
                ("experts", Int(*experts)),
                ("k", Int(*k)),
                ("sigmoid", Bool(routing.sigmoid)),
                ("normalize", Bool(routing.normalize)),
                ("groups", Int(routing.groups)),
                ("groups_kept", Int(routing.groups_kept)),
            ];
            // Printed where it is not the default two, so texts written before it existed
            // read back unchanged.
            if routing.group_top != Routing::default().group_top {
                attrs.push(("group_top", Int(routing.group_top)));
            }
            attrs.extend(bias.then_some(("bias", Bool(true))));
            attrs
        }
        OpKind::MoeExperts { experts, form } => {
            // Only what differs from SwiGLU without biases, as older texts have it.
            let plain = ExpertForm::SWIGLU;
            let mut attrs = vec![("experts", Int(*experts))];
            attrs.extend(form.bias.then_some(("bias", Bool(true))));
            attrs.extend((form.alpha != plain.alpha).then_some(("alpha", Float(form.alpha))));
            attrs.extend(form.limit.map(|l| ("limit", Float(l))));
            attrs.extend((form.up_offset != 0.0).then_some(("up_offset", Float(form.up_offset))));
            attrs.extend(form.scales_input.then_some(("scales_input", Bool(true))));
            attrs
        }
        OpKind::Grad { of, wrt } => vec![("of", AttrVal::Kind(of.clone())), ("wrt", usizes(wrt))],
        OpKind::AdamW(c) => vec![
            ("lr", Float(c.lr)),
            ("beta1", Float(c.beta1)),
            ("beta2", Float(c.beta2)),
            ("eps", Float(c.eps)),
            ("weight_decay", Float(c.weight_decay)),
        ],
        OpKind::Input { .. }
        | OpKind::Param { .. }
        | OpKind::Buffer { .. }
        | OpKind::State { .. }
        | OpKind::Embedding
        | OpKind::MatMul
        | OpKind::Add
        | OpKind::Sub
        | OpKind::Mul
        | OpKind::Div
        | OpKind::Neg
        | OpKind::Exp
        | OpKind::Sqrt
        | OpKind::Rsqrt
        | OpKind::Tanh
        | OpKind::Sigmoid
        | OpKind::Silu
        | OpKind::Relu
        | OpKind::ReduceMean
        | OpKind::ReduceSum
        | OpKind::CrossEntropy => vec![],
    }
}

/// Writes a list as `[a,b,c]`, the same style as shapes.
fn list<T: fmt::Display>(f: &mut fmt::Formatter<'_>, xs: &[T]) -> fmt::Result {
    f.write_str("[")?;
    for (i, x) in xs.iter().enumerate() {
        if i > 0 {
            f.write_str(",")?;
        }
        write!(f, "{x}")?;
    }
    f.write_str("]")
}

impl fmt::Display for AttrVal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttrVal::Bool(b) => write!(f, "{b}"),
            // Debug prints the shortest text that parses back to the same f64.
            AttrVal::Float(x) => write!(f, "{x:?}"),
            AttrVal::Int(n) => write!(f, "{n}"),
            AttrVal::Dim(d) => write!(f, "{d}"),
            AttrVal::Dims(ds) => list(f, ds),
            AttrVal::Ints(ns) => list(f, ns),
            AttrVal::Kind(k) => write!(f, "{}", KindText(k)),
        }
    }
}

/// Displays an op kind in text form: `linear{bias=true}`, `param "wte"`, `silu`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KindText<'a>(pub(crate) &'a OpKind);

impl fmt::Display for KindText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.mnemonic())?;
        if let Some(name) = source_name(self.0) {
            write!(f, " {}", Quoted(name))?;
        }
        let attrs = attrs_of(self.0);
        if !attrs.is_empty() {
            f.write_str("{")?;
            for (i, (key, val)) in attrs.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{key}={val}")?;
            }
            f.write_str("}")?;
        }
        Ok(())
    }
}

/// Displays a string literal with the escapes the lexer understands.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Quoted<'a>(pub(crate) &'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"")?;
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\t' => f.write_str("\\t")?,
                '\r' => f.write_str("\\r")?,
                c if c.is_control() => write!(f, "\\u{{{:x}}}", u32::from(c))?,
                c => write!(f, "{c}")?,
            }
        }
        f.write_str("\"")
    }
}

/// Attributes parsed from `{...}`, consumed by [`build_kind`].
#[derive(Debug, Default)]
pub(crate) struct Attrs {
    items: Vec<(String, AttrVal)>,
}

impl Attrs {
    pub(crate) fn new(items: Vec<(String, AttrVal)>) -> Attrs {
        Attrs { items }
    }

    fn has(&self, key: &str) -> bool {
        self.items.iter().any(|(k, _)| k == key)
    }

    /// A rotary embedding's scaling, told apart by the keys present (none: no scaling).
    fn rope_scaling(&mut self, op: &str) -> Result<RopeScaling, String> {
        if self.has("nope") {
            return match self.bool(op, "nope")? {
                true => Ok(RopeScaling::Nope),
                false => Err("attribute `nope` is true where present: a rotary that turns is written without it".into()),
            };
        }
        if self.has("temperature_floor") {
            return Ok(RopeScaling::Temperature {
                floor: self.float(op, "temperature_floor")?,
                scale: self.float(op, "temperature_scale")?,
            });
        }
        if self.has("beta_fast") {
            return Ok(RopeScaling::Yarn {
                factor: self.float(op, "factor")?,
                beta_fast: self.float(op, "beta_fast")?,
                beta_slow: self.float(op, "beta_slow")?,
                original_max: self.float(op, "original_max")?,
                attention_factor: self.float(op, "attention_factor")?,
                truncate: !self.has("truncate") || self.bool(op, "truncate")?,
            });
        }
        if self.has("low_freq_factor") {
            return Ok(RopeScaling::Llama3 {
                factor: self.float(op, "factor")?,
                low_freq_factor: self.float(op, "low_freq_factor")?,
                high_freq_factor: self.float(op, "high_freq_factor")?,
                original_max: self.float(op, "original_max")?,
            });
        }
        if self.has("factor") {
            return Ok(RopeScaling::Linear {
                factor: self.float(op, "factor")?,
            });
        }
        Ok(RopeScaling::None)
    }

    fn take(&mut self, op: &str, key: &str) -> Result<AttrVal, String> {
        let i = self
            .items
            .iter()
            .position(|(k, _)| k == key)
            .ok_or_else(|| format!("{op} is missing attribute `{key}`"))?;
        Ok(self.items.remove(i).1)
    }

    fn bool(&mut self, op: &str, key: &str) -> Result<bool, String> {
        match self.take(op, key)? {
            AttrVal::Bool(b) => Ok(b),
            v => Err(format!("attribute `{key}` must be true or false, got {v}")),
        }
    }

    fn float(&mut self, op: &str, key: &str) -> Result<f64, String> {
        match self.take(op, key)? {
            AttrVal::Float(x) => Ok(x),
            v => Err(format!("attribute `{key}` must be a number, got {v}")),
        }
    }

    fn int(&mut self, op: &str, key: &str) -> Result<u64, String> {
        match self.take(op, key)? {
            AttrVal::Int(n) => Ok(n),
            v => Err(format!("attribute `{key}` must be an integer, got {v}")),
        }
    }

    fn usize(&mut self, op: &str, key: &str) -> Result<usize, String> {
        let n = self.int(op, key)?;
        usize::try_from(n).map_err(|_| format!("attribute `{key}` = {n} is too large"))
    }

    fn dim(&mut self, op: &str, key: &str) -> Result<Dim, String> {
        match self.take(op, key)? {
            AttrVal::Dim(d) => Ok(d),
            v => Err(format!("attribute `{key}` must be a dimension, got {v}")),
        }
    }

    fn dims(&mut self, op: &str, key: &str) -> Result<Vec<Dim>, String> {
        match self.take(op, key)? {
            AttrVal::Dims(d) => Ok(d),
            v => Err(format!(
                "attribute `{key}` must be a list of dimensions, got {v}"
            )),
        }
    }

    fn ints(&mut self, op: &str, key: &str) -> Result<Vec<u64>, String> {
        match self.take(op, key)? {
            AttrVal::Ints(n) => Ok(n),
            v => Err(format!(
                "attribute `{key}` must be a list of integers, got {v}"
            )),
        }
    }

    fn usizes(&mut self, op: &str, key: &str) -> Result<Vec<usize>, String> {
        self.ints(op, key)?
            .into_iter()
            .map(|n| usize::try_from(n).map_err(|_| format!("`{key}` entry {n} is too large")))
            .collect()
    }

    fn kind(&mut self, op: &str, key: &str) -> Result<OpKind, String> {
        match self.take(op, key)? {
            AttrVal::Kind(k) => Ok(*k),
            v => Err(format!("attribute `{key}` must be an op kind, got {v}")),
        }
    }

    /// Fails if attributes are left over: they exist, but not on this op.
    fn finish(self, op: &str) -> Result<(), String> {
        match self.items.first() {
            Some((key, _)) => Err(format!("{op} has no attribute `{key}`")),
            None => Ok(()),
        }
    }
}

/// Builds the op kind named `mnemonic` from its source name (for named sources) and attributes.
pub(crate) fn build_kind(
    mnemonic: &str,
    name: Option<String>,
    mut a: Attrs,
) -> Result<OpKind, String> {
    let m = mnemonic;
    let named = |name: Option<String>| name.ok_or_else(|| format!("{m} needs a quoted name"));
    if name.is_some() && !is_named_source(m) {
        return Err(format!("{m} does not take a name"));
    }
    let kind = match m {
        "input" => OpKind::Input { name: named(name)? },
        "param" => OpKind::Param { name: named(name)? },
        "buffer" => OpKind::Buffer { name: named(name)? },
        "state" => OpKind::State { name: named(name)? },
        "scalar" => OpKind::Scalar {
            value: a.float(m, "value")?,
        },
        "iota" => OpKind::Iota {
            len: a.dim(m, "len")?,
        },
        "embedding" => OpKind::Embedding,
        "matmul" => OpKind::MatMul,
        "linear" => OpKind::Linear {
            bias: a.bool(m, "bias")?,
        },
        "add" => OpKind::Add,
        "sub" => OpKind::Sub,
        "mul" => OpKind::Mul,
        "div" => OpKind::Div,
        "neg" => OpKind::Neg,
        "exp" => OpKind::Exp,
        "sqrt" => OpKind::Sqrt,
        "rsqrt" => OpKind::Rsqrt,
        "tanh" => OpKind::Tanh,
        "sigmoid" => OpKind::Sigmoid,
        "pow" => OpKind::Pow {
            exponent: a.float(m, "exponent")?,
        },
        "scale" => OpKind::Scale {
            factor: a.float(m, "factor")?,
        },
        "gelu" => OpKind::Gelu {
            tanh: a.bool(m, "tanh")?,
        },
        "silu" => OpKind::Silu,
        "relu" => OpKind::Relu,
        "clamp" => OpKind::Clamp {
            limit: a.float(m, "limit")?,
        },
        "reduce_mean" => OpKind::ReduceMean,
        "reduce_sum" => OpKind::ReduceSum,
        "layernorm" => OpKind::LayerNorm {
            eps: a.float(m, "eps")?,
            bias: if a.has("bias") {
                a.bool(m, "bias")?
            } else {
                true
            },
        },
        "rmsnorm" => OpKind::RmsNorm {
            eps: a.float(m, "eps")?,
        },
        "softmax" => OpKind::Softmax {
            causal: a.bool(m, "causal")?,
        },
        "attention" => OpKind::Attention {
            heads: a.int(m, "heads")?,
            kv_heads: a.int(m, "kv_heads")?,
            scale: a.float(m, "scale")?,
            causal: a.bool(m, "causal")?,
            softcap: if a.has("softcap") {
                Some(a.float(m, "softcap")?)
            } else {
                None
            },
            sinks: a.has("sinks") && a.bool(m, "sinks")?,
            window: if a.has("window") {
                Some(a.int(m, "window")?)
            } else {
                None
            },
            chunk: if a.has("chunk") {
                Some(a.int(m, "chunk")?)
            } else {
                None
            },
        },
        "rotary" => OpKind::Rotary {
            heads: a.int(m, "heads")?,
            theta: a.float(m, "theta")?,
            scaling: a.rope_scaling(m)?,
        },
        "reshape" => OpKind::Reshape {
            shape: a.dims(m, "shape")?,
        },
        "expand" => OpKind::Expand {
            shape: a.dims(m, "shape")?,
        },
        "transpose" => OpKind::Transpose {
            perm: a.usizes(m, "perm")?,
        },
        "split" => OpKind::Split {
            axis: a.usize(m, "axis")?,
            sizes: a.ints(m, "sizes")?,
        },
        "concat" => OpKind::Concat {
            axis: a.usize(m, "axis")?,
        },
        "slice" => OpKind::Slice {
            axis: a.usize(m, "axis")?,
            start: a.int(m, "start")?,
            end: a.int(m, "end")?,
        },
        "dropout" => OpKind::Dropout {
            p: a.float(m, "p")?,
            seed: a.int(m, "seed")?,
        },
        "cross_entropy" => OpKind::CrossEntropy,
        "topk_router" => OpKind::TopKRouter {
            experts: a.int(m, "experts")?,
            k: a.int(m, "k")?,
            routing: Routing {
                sigmoid: a.bool(m, "sigmoid")?,
                normalize: a.bool(m, "normalize")?,
                groups: a.int(m, "groups")?,
                groups_kept: a.int(m, "groups_kept")?,
                group_top: if a.has("group_top") {
                    a.int(m, "group_top")?
                } else {
                    Routing::default().group_top
                },
            },
            bias: a.has("bias") && a.bool(m, "bias")?,
        },
        "moe_experts" => OpKind::MoeExperts {
            experts: a.int(m, "experts")?,
            form: ExpertForm {
                bias: a.has("bias") && a.bool(m, "bias")?,
                alpha: if a.has("alpha") {
                    a.float(m, "alpha")?
                } else {
                    1.0
                },
                limit: if a.has("limit") {
                    Some(a.float(m, "limit")?)
                } else {
                    None
                },
                up_offset: if a.has("up_offset") {
                    a.float(m, "up_offset")?
                } else {
                    0.0
                },
                scales_input: a.has("scales_input") && a.bool(m, "scales_input")?,
            },
        },
        "grad" => OpKind::Grad {
            of: Box::new(a.kind(m, "of")?),
            wrt: a.usizes(m, "wrt")?,
        },
        "adamw" => OpKind::AdamW(AdamWConfig {
            lr: a.float(m, "lr")?,
            beta1: a.float(m, "beta1")?,
            beta2: a.float(m, "beta2")?,
            eps: a.float(m, "eps")?,
            weight_decay: a.float(m, "weight_decay")?,
        }),
        _ => return Err(format!("unknown op `{m}`")),
    };
    a.finish(m)?;
    Ok(kind)
}
