//! Whole-model checks: backward of tiny GPT-2 and Llama graphs against finite differences of
//! the loss, and one AdamW training step against a hand-computed update.

mod common;

use common::{TOL, fd, output, rel_err};
use ir::autodiff::{backward, training_graph};
use ir::interp::{Env, evaluate};
use ir::testing::{Rng, TinyConfig, random_batch, random_weights, tiny_gpt2, tiny_llama};
use ir::{AdamWConfig, Binding, Graph, OpKind, Tensor, Weights};

const BIND: Binding = Binding { batch: 2, seq: 4 };

/// Checks every parameter's gradient from `backward` against central differences of the loss.
fn check_model(name: &str, forward: &Graph, seed: u64) -> f64 {
    let mut rng = Rng::new(seed);
    let weights = random_weights(forward, &mut rng, 0.4);
    let inputs = random_batch(&mut rng, BIND, 11);
    let loss = output(forward, "loss");
    let grads = backward(forward, loss).expect("backward builds");
    let env = Env {
        weights: &weights,
        inputs: &inputs,
        binding: BIND,
    };
    let eval = evaluate(&grads.graph, &env).expect("backward evaluates");
    let loss_of = |w: &Weights| {
        let env = Env {
            weights: w,
            inputs: &inputs,
            binding: BIND,
        };
        evaluate(forward, &env)
            .expect("forward evaluates")
            .value(loss)
            .data[0]
    };
    // The backward graph recomputes exactly the forward loss.
    assert_eq!(eval.value(loss).data[0], loss_of(&weights));
    let mut worst: f64 = 0.0;
    assert!(!grads.params.is_empty());
    for p in &grads.params {
        let g = p
            .grad
            .unwrap_or_else(|| panic!("{name}: {} has no gradient", p.name));
        let analytic = &eval.value(g).data;
        let numeric = fd(&weights, &p.name, &loss_of);
        let e = rel_err(analytic, &numeric);
        assert!(e <= TOL, "{name}: {} relative error {e:e}", p.name);
        worst = worst.max(e);
    }
    eprintln!(
        "FD model {name}: {} parameters, worst relative error {worst:.3e}",
        grads.params.len()
    );
    worst
}

#[test]
fn gpt2_gradients_match_finite_differences() {
    let cfg = TinyConfig {
        dropout: 0.1,
        ..TinyConfig::gpt2()
    };
    let g = tiny_gpt2(&cfg).expect("builds");
    assert!(g.histogram().iter().any(|(op, _)| op == "dropout"));
    check_model("gpt2", &g, 100);
}

#[test]
fn llama_gradients_match_finite_differences() {
    let g = tiny_llama(&TinyConfig::llama()).expect("builds");
    check_model("llama", &g, 200);
}

#[test]
fn llama_moe_gradients_match_finite_differences() {
    let cfg = TinyConfig {
        moe: Some((4, 2)),
        ..TinyConfig::llama()
    };
    let g = tiny_llama(&cfg).expect("builds");
    check_model("llama-moe", &g, 300);
}

#[test]
fn backward_ops_carry_the_forward_layer_tags() {
    let g = tiny_llama(&TinyConfig::llama()).expect("builds");
    let grads = backward(&g, output(&g, "loss")).expect("backward builds");
    let b = &grads.graph;
    let grad_hist = |layer| {
        let mut h: Vec<String> = b
            .layer_ops(layer)
            .into_iter()
            .filter_map(|o| match &b.op(o).kind {
                OpKind::Grad { of, .. } => Some(of.mnemonic().to_string()),
                _ => None,
            })
            .collect();
        h.sort();
        h
    };
    let (l0, l1) = (grad_hist(0), grad_hist(1));
    assert!(l0.contains(&"attention".to_string()) && l0.contains(&"rotary".to_string()));
    assert_eq!(l0, l1, "repeated blocks differentiate identically");
    // The backward pass only appends: the forward ops keep their ids and order.
    assert_eq!(&b.order()[..g.num_ops()], g.order());
}

#[test]
fn tied_embedding_gradients_are_summed() {
    let g = tiny_gpt2(&TinyConfig::gpt2()).expect("builds");
    let grads = backward(&g, output(&g, "loss")).expect("backward builds");
    let wte = grads.params.iter().find(|p| p.name == "wte").expect("wte");
    let gv = wte.grad.expect("wte gradient");
    assert_eq!(grads.graph.op(grads.graph.def_op(gv)).kind, OpKind::Add);
}

#[test]
fn one_adamw_step_matches_a_hand_computed_update() {
    let g = tiny_gpt2(&TinyConfig::gpt2()).expect("builds");
    let cfg = AdamWConfig {
        lr: 0.01,
        beta1: 0.8,
        beta2: 0.95,
        eps: 1e-6,
        weight_decay: 0.1,
    };
    let train = training_graph(&g, cfg).expect("training graph builds");
    let mut rng = Rng::new(7);
    let weights = random_weights(&g, &mut rng, 0.4);
    let mut inputs = random_batch(&mut rng, BIND, 11);
    let step = 3.0;
    inputs.insert("step".into(), Tensor::scalar(step));
    for (name, w) in &weights {
        let m = rng.tensor(&w.shape, 0.01);
        let mut v = rng.tensor(&w.shape, 0.01);
        v.data.iter_mut().for_each(|x| *x = x.abs());
        inputs.insert(format!("m.{name}"), m);
        inputs.insert(format!("v.{name}"), v);
    }
    let env = Env {
        weights: &weights,
        inputs: &inputs,
        binding: BIND,
    };
    let out = evaluate(&train, &env).expect("training step evaluates");

    // The gradient itself comes from the backward graph (checked against FD elsewhere).
    let loss = output(&g, "loss");
    let grads = backward(&g, loss).expect("backward builds");
    let geval = evaluate(&grads.graph, &env).expect("backward evaluates");
    assert_eq!(out.output("loss"), Some(geval.value(loss)));

    let name = "h.1.attn.c_attn.weight";
    let p = grads.params.iter().find(|p| p.name == name).expect("param");
    let grad = &geval.value(p.grad.expect("grad")).data;
    let (w, m, v) = (
        &weights[name].data,
        &inputs[&format!("m.{name}")].data,
        &inputs[&format!("v.{name}")].data,
    );
    let (new_p, new_m, new_v) = (
        out.output(&format!("param.{name}")).expect("param out"),
        out.output(&format!("m.{name}")).expect("m out"),
        out.output(&format!("v.{name}")).expect("v out"),
    );
    for i in 0..w.len() {
        let m1 = 0.8 * m[i] + 0.2 * grad[i];
        let v1 = 0.95 * v[i] + 0.05 * grad[i] * grad[i];
        let m_hat = m1 / (1.0 - 0.8f64.powi(3));
        let v_hat = v1 / (1.0 - 0.95f64.powi(3));
        let p1 = w[i] - 0.01 * 0.1 * w[i] - 0.01 * m_hat / (v_hat.sqrt() + 1e-6);
        assert!((new_m.data[i] - m1).abs() < 1e-15);
        assert!((new_v.data[i] - v1).abs() < 1e-15);
        assert!(
            (new_p.data[i] - p1).abs() < 1e-12,
            "{} vs {p1}",
            new_p.data[i]
        );
    }
    // Every parameter has its three outputs, and nothing else is output but the loss.
    assert_eq!(train.outputs.len(), 1 + 3 * weights.len());
}

#[test]
fn training_graph_requires_a_loss_output_and_fresh_names() {
    let mut g = tiny_gpt2(&TinyConfig::gpt2()).expect("builds");
    let cfg = AdamWConfig::default();
    let clash = {
        let mut c = g.clone();
        c.push_source(
            OpKind::Input {
                name: "step".into(),
            },
            ir::TensorType::new(ir::DType::I64, ir::Shape::scalar()),
            None,
        );
        c
    };
    assert!(matches!(
        training_graph(&clash, cfg),
        Err(ir::autodiff::AutodiffError::NameClash { .. })
    ));
    g.outputs.retain(|(n, _)| n != "loss");
    assert!(matches!(
        training_graph(&g, cfg),
        Err(ir::autodiff::AutodiffError::NoLossOutput { .. })
    ));
    let logits = output(&g, "logits");
    assert!(matches!(
        backward(&g, logits),
        Err(ir::autodiff::AutodiffError::NotScalar { .. })
    ));
}

#[test]
fn a_parameter_off_the_loss_path_passes_through() {
    let mut g = tiny_gpt2(&TinyConfig::gpt2()).expect("builds");
    let unused = g.push_source(
        OpKind::Param {
            name: "unused".into(),
        },
        ir::TensorType::new(ir::DType::F32, ir::Shape::fixed(&[2])),
        None,
    );
    let train = training_graph(&g, AdamWConfig::default()).expect("builds");
    assert_eq!(train.output("param.unused"), Some(unused));
}
