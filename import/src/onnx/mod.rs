//! ONNX importer: reads a `.onnx` model (protobuf, optionally with external weight files),
//! folds everything that depends only on shapes for a given batch and sequence length, lowers
//! the rest to IR ops, and recognizes transformer building blocks.
//!
//! Pipeline: [`proto`] decoding → initializers via [`external`] → per node, [`fold`] when every
//! input is constant, else [`lower`] (constants derived from weights are replayed by [`build`]
//! so weights stay parameters) → [`patterns`] → dead-op removal → repeated-layer detection
//! ([`ir::blocks::detect_repeated_layers`], block name `decoder_layer`).

mod build;
mod external;
mod fold;
mod fuse;
mod lower;
mod node;
mod patterns;
pub mod proto;
mod shapes;
mod value;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use ir::{DType, Graph, OpKind, Shape, TensorType, ValueId, Weights};
use prost::Message;

use build::{Importer, Val, fixed};
use external::TensorReader;
use node::NodeRef;
use proto::{ModelProto, NodeProto};
use value::Elem;

use crate::ImportError;

/// The result of an import.
#[derive(Debug, Clone)]
pub struct Imported {
    /// Forward graph: one `input` named `input_ids` (i64 `[batch, seq]`), one output `logits`.
    pub graph: Graph,
    /// Values of every `param` and `buffer` of the graph, by name.
    pub weights: Weights,
    /// The main operator-set version the model was exported with.
    pub opset: i64,
    /// How many ONNX nodes were folded to constants and how many were lowered to IR.
    pub folded_nodes: usize,
    pub lowered_nodes: usize,
    /// How many times each recognizer fired (`attention`, `rotary`, `rmsnorm`...).
    pub recognized: BTreeMap<&'static str, usize>,
}

/// Every op type the importer accepts (folded, lowered, or both).
pub fn supported_ops() -> Vec<&'static str> {
    let mut all: Vec<&'static str> = fold::FOLDABLE
        .iter()
        .chain(lower::LOWERABLE)
        .copied()
        .chain(["Constant"])
        .collect();
    all.sort_unstable();
    all.dedup();
    all
}

/// Imports the model at `path` with shapes fixed to `batch` sequences of `seq` tokens.
pub fn import_onnx(path: &Path, batch: u64, seq: u64) -> Result<Imported, ImportError> {
    let file = path.to_path_buf();
    if batch == 0 || seq == 0 {
        return Err(ImportError::BadBinding { file, batch, seq });
    }
    let model = read_model(path)?;
    import_model(path, &model, batch, seq)
}

/// Reads and decodes the model at `path` without importing it (external data is read later,
/// by [`import_model`]).
pub fn read_model(path: &Path) -> Result<ModelProto, ImportError> {
    let file = path.to_path_buf();
    let bytes = std::fs::read(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => ImportError::FileNotFound { file: file.clone() },
        _ => ImportError::Io {
            file: file.clone(),
            source,
        },
    })?;
    ModelProto::decode(bytes.as_slice()).map_err(|source| ImportError::Decode { file, source })
}

/// The batch and sequence sizes the model's token-id input fixes, if any: `(batch, seq)`, each
/// `None` when that dimension is symbolic (a `dim_param`) or the input is not `[batch, seq]`.
pub fn declared_input_dims(model: &ModelProto) -> (Option<u64>, Option<u64>) {
    let Some(graph) = model.graph.as_ref() else {
        return (None, None);
    };
    let initializers: HashSet<&str> = graph
        .initializer
        .iter()
        .filter_map(|t| t.name.as_deref())
        .collect();
    let mut data = graph
        .input
        .iter()
        .filter(|i| !initializers.contains(i.name.as_deref().unwrap_or("")));
    let (Some(input), None) = (data.next(), data.next()) else {
        return (None, None);
    };
    let dims = input
        .r#type
        .as_ref()
        .and_then(|t| t.tensor_type.as_ref())
        .and_then(|t| t.shape.as_ref())
        .map(|s| s.dim.as_slice())
        .unwrap_or(&[]);
    let fixed = |d: &proto::Dimension| {
        d.dim_value
            .filter(|_| d.dim_param.is_none())
            .and_then(|v| u64::try_from(v).ok())
            .filter(|&v| v > 0)
    };
    match dims {
        [b, s] => (fixed(b), fixed(s)),
        _ => (None, None),
    }
}

/// Imports an already-decoded model; `path` names it in errors and locates external data.
pub fn import_model(
    path: &Path,
    model: &ModelProto,
    batch: u64,
    seq: u64,
) -> Result<Imported, ImportError> {
    let file = path.to_path_buf();
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| ImportError::NoGraph { file: file.clone() })?;
    let opset = model
        .opset_import
        .iter()
        .find(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")))
        .and_then(|o| o.version)
        .unwrap_or(0);
    let name = model_name(path, graph.name.as_deref());
    let mut imp = Importer::new(path, opset, &graph.node, &name);

    let mut reader = TensorReader::new(path);
    for t in &graph.initializer {
        let c = reader.read(t)?;
        let name = t.name.clone().unwrap_or_default();
        if c.elem.is_float() && c.rank() >= 1 {
            imp.trainable.insert(name.clone());
            imp.weight_dep.insert(name.clone());
        }
        imp.consts.insert(name, c);
    }
    bind_input(&mut imp, graph, batch, seq)?;

    // Readers of every value; graph outputs count as a reader so fusions never swallow them.
    let mut consumers: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, n) in graph.node.iter().enumerate() {
        for v in &n.input {
            consumers.entry(v.as_str()).or_default().push(i);
        }
    }
    for o in &graph.output {
        consumers
            .entry(o.name.as_deref().unwrap_or(""))
            .or_default()
            .push(usize::MAX);
    }
    let (mut folded, mut lowered) = (0, 0);
    let mut fused: HashSet<usize> = HashSet::new();
    for i in 0..graph.node.len() {
        if fused.contains(&i) {
            lowered += 1;
            continue;
        }
        if let Some(f) = fuse_erf_gelu(&mut imp, i, &consumers)? {
            fused.extend(f);
            lowered += 1;
            continue;
        }
        if visit(&mut imp, i)? {
            folded += 1;
        } else {
            lowered += 1;
        }
    }

    let out = graph
        .output
        .iter()
        .find(|o| o.name.as_deref() == Some("logits"))
        .or_else(|| graph.output.first())
        .and_then(|o| o.name.clone())
        .ok_or_else(|| ImportError::BadGraphIo {
            file: file.clone(),
            what: "output",
            name: String::new(),
            reason: "the graph has no output".into(),
        })?;
    let stand_in = NodeProto {
        name: Some(format!("graph output '{out}'")),
        op_type: Some("Output".into()),
        ..NodeProto::default()
    };
    let at = NodeRef {
        file: path,
        node: &stand_in,
        index: graph.node.len(),
    };
    let logits = imp.materialize(&at, &out)?;
    if !imp.graph.ty(logits).dtype.is_float() {
        return Err(ImportError::BadGraphIo {
            file,
            what: "output",
            name: out,
            reason: "logits must be floating point".into(),
        });
    }
    imp.graph.add_output("logits", logits);
    add_next_token_loss(&mut imp.graph, logits, &file)?;

    let recognized = patterns::recognize(&mut imp.graph, &imp.known);
    imp.graph.remove_dead_ops();

    let mut graph = imp.graph;
    // ONNX carries no layer structure: recover it (tags layer k's ops, names the block as the
    // config builder does). A model without repeats stays untagged.
    ir::blocks::detect_repeated_layers(&mut graph, crate::build::BLOCK_NAME);
    let live: HashSet<String> = graph
        .order()
        .iter()
        .filter_map(|&o| match &graph.op(o).kind {
            OpKind::Param { name } | OpKind::Buffer { name } => Some(name.clone()),
            _ => None,
        })
        .collect();
    let mut weights = imp.weights;
    weights.retain(|k, _| live.contains(k));
    graph.name = name;
    Ok(Imported {
        graph,
        weights,
        opset,
        folded_nodes: folded,
        lowered_nodes: lowered,
        recognized,
    })
}

/// The graph's name, unless it is empty or `torch.onnx`'s generic `main_graph`; then the file
/// stem, or the directory's name for a file called `model.onnx` (`gpt2_tiny/model.onnx` →
/// `gpt2_tiny`).
fn model_name(path: &Path, graph_name: Option<&str>) -> String {
    if let Some(n) = graph_name.filter(|n| !n.is_empty() && *n != "main_graph") {
        return n.to_string();
    }
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
    let dir = path
        .parent()
        .and_then(|p| p.file_name())
        .map(|s| s.to_string_lossy().into_owned());
    match (stem, dir) {
        (Some(stem), Some(dir)) if stem == "model" => dir,
        (Some(stem), _) => stem,
        (None, _) => "model".into(),
    }
}

/// Binds the model's single data input (token ids) to an IR `input_ids` of shape `[batch, seq]`.
fn bind_input(
    imp: &mut Importer<'_>,
    graph: &proto::GraphProto,
    batch: u64,
    seq: u64,
) -> Result<(), ImportError> {
    let inputs: Vec<&proto::ValueInfoProto> = graph
        .input
        .iter()
        .filter(|i| !imp.consts.contains_key(i.name.as_deref().unwrap_or("")))
        .collect();
    let bad = |name: &str, reason: String| ImportError::BadGraphIo {
        file: imp.file.to_path_buf(),
        what: "input",
        name: name.into(),
        reason,
    };
    let [input] = inputs.as_slice() else {
        let names: Vec<&str> = inputs.iter().filter_map(|i| i.name.as_deref()).collect();
        return Err(bad(
            &names.join("', '"),
            format!(
                "plait imports models with exactly one input (token ids), this one has {}",
                names.len()
            ),
        ));
    };
    let name = input.name.clone().unwrap_or_default();
    let tensor = input.r#type.as_ref().and_then(|t| t.tensor_type.as_ref());
    let elem = tensor.and_then(|t| t.elem_type).and_then(Elem::from_onnx);
    if elem != Some(Elem::Int) {
        return Err(bad(&name, "token ids must be an integer tensor".into()));
    }
    // Dimensions that are fixed in the file must agree with the requested batch and seq.
    let dims = tensor
        .and_then(|t| t.shape.as_ref())
        .map(|s| s.dim.as_slice())
        .unwrap_or(&[]);
    if dims.len() != 2 {
        return Err(bad(
            &name,
            format!(
                "token ids must be [batch, seq], the file declares rank {}",
                dims.len()
            ),
        ));
    }
    for (d, want, what) in dims
        .iter()
        .zip([batch, seq])
        .zip(["batch", "seq"])
        .map(|((d, w), n)| (d, w, n))
    {
        if let Some(v) = d.dim_value.filter(|_| d.dim_param.is_none())
            && u64::try_from(v).ok() != Some(want)
        {
            return Err(bad(
                &name,
                format!("the file fixes {what} to {v}, but {want} was requested"),
            ));
        }
    }
    let ty = TensorType::new(DType::I64, fixed(&[batch as usize, seq as usize]));
    let v = imp.graph.push_source(
        OpKind::Input {
            name: "input_ids".into(),
        },
        ty,
        None,
    );
    imp.ir.insert(name, v);
    Ok(())
}

/// Lowers an erf-GELU whose `Erf` is node `i` to one IR op; returns the nodes it replaced.
fn fuse_erf_gelu(
    imp: &mut Importer<'_>,
    i: usize,
    consumers: &HashMap<&str, Vec<usize>>,
) -> Result<Option<Vec<usize>>, ImportError> {
    let Some(n) = imp.node(i) else {
        return Ok(None);
    };
    let on_data = n.input(0).is_some_and(|u| imp.ir.contains_key(u));
    if n.op() != "Erf" || !on_data {
        return Ok(None);
    }
    let Some(f) = fuse::erf_gelu(imp, i, consumers) else {
        return Ok(None);
    };
    let x = imp.materialize(&n, &f.x)?;
    let y = imp
        .graph
        .push_op(OpKind::Gelu { tanh: false }, vec![x], None)
        .map_err(|source| ImportError::Build {
            file: imp.file.to_path_buf(),
            node: n.name(),
            op_type: n.op().to_string(),
            source,
        })?;
    if let Some(&y) = y.first() {
        imp.ir.insert(f.output, y);
    }
    Ok(Some(f.nodes))
}

/// Folds or lowers node `i`; returns whether it was folded.
fn visit(imp: &mut Importer<'_>, i: usize) -> Result<bool, ImportError> {
    let Some(n) = imp.node(i) else {
        return Ok(false);
    };
    let op = n.op();
    let known_domain = matches!(n.domain(), "" | "ai.onnx");
    let supported = known_domain
        && (op == "Constant" || fold::FOLDABLE.contains(&op) || lower::LOWERABLE.contains(&op));
    if !supported {
        return Err(ImportError::UnsupportedOp {
            file: imp.file.to_path_buf(),
            node: n.name(),
            op_type: op.to_string(),
            domain: n.domain().to_string(),
            supported: supported_ops().join(", "),
        });
    }
    if op == "Constant" {
        let c = constant_attr(imp, &n)?;
        imp.store(&n, vec![Val::Const(c)], false);
        return Ok(true);
    }
    let mut all_const = true;
    let mut weight_dep = false;
    for name in &n.node.input {
        if name.is_empty() {
            continue;
        }
        if imp.consts.contains_key(name) {
            weight_dep |= imp.weight_dep.contains(name);
        } else if imp.ir.contains_key(name) {
            all_const = false;
        } else {
            return Err(ImportError::UndefinedValue {
                file: imp.file.to_path_buf(),
                node: n.name(),
                op_type: op.to_string(),
                value: name.clone(),
            });
        }
    }
    if all_const {
        let ins: Vec<Option<&value::Const>> = n
            .node
            .input
            .iter()
            .map(|s| imp.consts.get(s).filter(|_| !s.is_empty()))
            .collect();
        if let Some(outs) = fold::fold(&n, &ins)? {
            imp.store(&n, outs.into_iter().map(Val::Const).collect(), weight_dep);
            return Ok(true);
        }
    }
    imp.lower_node(i)?;
    Ok(false)
}

/// The value of a `Constant` node (its one value attribute).
fn constant_attr(imp: &Importer<'_>, n: &NodeRef<'_>) -> Result<value::Const, ImportError> {
    use value::Const;
    if let Some(t) = n.attr_t("value") {
        return TensorReader::new(imp.file).read(t);
    }
    let f32 = Elem::Float(DType::F32);
    if let Some(x) = n.attr_f("value_float") {
        return Ok(Const::scalar(f32, x));
    }
    if let Some(x) = n.attr_i("value_int") {
        return Ok(Const::scalar(Elem::Int, x as f64));
    }
    if let Some(xs) = n.attr_floats("value_floats") {
        return Ok(Const::new(
            f32,
            vec![xs.len()],
            xs.iter().map(|&x| f64::from(x)).collect(),
        ));
    }
    if let Some(xs) = n.attr_ints("value_ints") {
        return Ok(Const::new(
            Elem::Int,
            vec![xs.len()],
            xs.iter().map(|&x| x as f64).collect(),
        ));
    }
    Err(n.bad("a Constant without a value (sparse and string constants are not supported)"))
}

/// The training objective of a causal language model, which an inference export lacks: input
/// `targets` (the next token at every position) and output `loss`, the mean cross-entropy of
/// `logits` against them, as the config builder defines it and Hugging Face computes it from
/// `labels`. Logits that are not `[batch, seq, vocab]` get no loss (the graph still imports
/// for inspection and planning; training it needs one).
fn add_next_token_loss(graph: &mut Graph, logits: ValueId, file: &Path) -> Result<(), ImportError> {
    let ty = graph.ty(logits).clone();
    if ty.shape.rank() != 3 || graph.output("loss").is_some() {
        return Ok(());
    }
    let tokens = Shape::of(&ty.shape.dims()[..2]);
    let targets = graph.push_source(
        OpKind::Input {
            name: "targets".into(),
        },
        TensorType::new(DType::I64, tokens),
        None,
    );
    let loss = graph
        .push_op(OpKind::CrossEntropy, vec![logits, targets], None)
        .map_err(|e| ImportError::BadGraphIo {
            file: file.to_path_buf(),
            what: "output",
            name: "logits".into(),
            reason: format!("cannot attach the next-token loss: {e}"),
        })?;
    graph.add_output("loss", loss[0]);
    Ok(())
}
