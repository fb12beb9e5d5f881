//! The program's layout against the sharding extraction the plan records: where the e-graph's
//! optimum is Megatron-LM's layout (GPT-3 175B's block at every tensor-parallel degree, with
//! and without sequence parallelism) the lowered layer runs every op as the extraction chose;
//! a plan whose extraction was changed at one op is reported at that op.

#![allow(clippy::unwrap_used)] // test helpers panic on purpose

mod common;

use common::Case;
use planner::ModelInfo;
use planner::sharding::Layout;

fn with_extraction(model: &str, seq: u64, c: Case) -> (planner::plan::Plan, ir::Graph) {
    let (mut plan, graph) = common::plan(model, seq, c);
    let info = ModelInfo::new(&graph).unwrap();
    let bp = planner::sharding_costs::block_plan(&info, &plan.cluster, &plan.strategy).unwrap();
    plan.block_plan = Some(bp);
    (plan, graph)
}

#[test]
fn gpt3_layers_lower_exactly_as_extracted() {
    for tp in [2, 4, 8] {
        for sp in [false, true] {
            let c = Case {
                sp,
                precision: planner::Precision::Bf16,
                ..Case::new(tp, 1, 1)
            };
            let (plan, graph) = with_extraction("gpt3-175b", 2048, c);
            let mismatch = codegen::lower::extraction_mismatch(&plan, &graph).unwrap();
            assert_eq!(mismatch, None, "tp {tp} sp {sp}");
        }
    }
}

#[test]
fn a_changed_extraction_is_reported_at_its_op() {
    let c = Case {
        precision: planner::Precision::Bf16,
        ..Case::new(4, 1, 1)
    };
    let (mut plan, graph) = with_extraction("gpt3-175b", 2048, c);
    let bp = plan.block_plan.as_mut().unwrap();
    let attention = bp
        .ops
        .iter_mut()
        .find(|o| o.mnemonic == "attention")
        .unwrap();
    let position = attention.position;
    attention.output = Some(Layout::Replicated);
    let why = codegen::lower::extraction_mismatch(&plan, &graph)
        .unwrap()
        .unwrap();
    // The changed layout does not lower (its attention is not a head split the layer's types
    // allow), so the rules lower the layer, and the first op where they differ is named.
    let at = format!("attention at position {position}");
    assert!(
        why.starts_with(&format!("the extraction does not lower ({at}"))
            && why.contains(&format!("the rules differ: {at}: the result")),
        "{why}"
    );
}

#[test]
fn a_plan_without_an_extraction_is_its_own_layout() {
    let (plan, graph) = common::plan("gpt3-175b", 2048, Case::new(2, 1, 1));
    assert!(plan.block_plan.is_none());
    assert_eq!(
        codegen::lower::extraction_mismatch(&plan, &graph).unwrap(),
        None
    );
}
