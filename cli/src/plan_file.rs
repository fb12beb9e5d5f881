//! Reading a plan.json for the commands that lower it (`codegen`, `run`).

use std::path::Path;

use anyhow::Context;
use planner::plan::Plan;

/// The plan at `path`, carrying its model's graph: plans written before `model.ir` was recorded
/// get it from `model.reference` (the zoo name or file path as given to `compile`), loaded
/// at the plan's micro-batch and sequence.
pub fn read(path: &Path) -> anyhow::Result<Plan> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {file}"))?;
    let mut plan = Plan::from_json(&text, &file)?;
    if plan.model.ir.is_none() {
        let m = import::load_model(
            &plan.model.reference,
            plan.strategy.micro_batch,
            Some(plan.strategy.seq),
        )
        .with_context(|| {
            format!(
                "{file} does not carry its model's graph (model.ir), and its model `{}` \
                 (model.reference) cannot be loaded from here; compile the model again",
                plan.model.reference
            )
        })?;
        plan.model.ir = Some(ir::text::print(&m.graph));
    }
    check_strategy(&plan, &file)?;
    Ok(plan)
}

/// The plan's strategy against its model and GPU count, as `compile` and `report` check it: a
/// plan edited by hand (a zero micro-batch, ZeRO-9, tp 3 of 8 GPUs) is refused here, naming the
/// field, before it is lowered, run or exported.
fn check_strategy(plan: &Plan, file: &str) -> anyhow::Result<()> {
    let text = plan.model.ir.as_deref().unwrap_or_default();
    let graph = ir::text::parse(text)
        .with_context(|| format!("{file}: its model's graph (model.ir) does not parse"))?;
    let info = planner::ModelInfo::new(&graph).with_context(|| format!("{file}: model.ir"))?;
    plan.strategy
        .validate(&info, plan.gpus)
        .with_context(|| format!("{file}: its strategy (the `strategy` fields) is not valid"))?;
    plan.check_chunks(info.layers)
        .with_context(|| format!("{file}: its pipeline split (the `chunks` field) is not valid"))?;
    check_fits(plan, &info, file)
}

/// The plan's strategy priced again: one that no longer fits its GPUs (its ZeRO stage or
/// micro-batch edited by hand, or a cost model that changed since `compile`) is refused
/// before it is lowered, run or exported (export wrote a launch that runs out of memory).
fn check_fits(plan: &Plan, info: &planner::ModelInfo<'_>, file: &str) -> anyhow::Result<()> {
    let e = planner::estimate::estimate_priced(
        info,
        &plan.cluster,
        plan.gpus,
        &plan.strategy,
        plan.tp_pricing(),
    )
    .with_context(|| format!("{file}: its strategy cannot be priced"))?;
    let p = &e.predicted;
    if p.fits {
        return Ok(());
    }
    let gib = |b: f64| b / (1u64 << 30) as f64;
    anyhow::bail!(
        "{file}: its strategy does not fit the {}: the current cost model predicts a peak of \
         {:.2} GiB of {:.2} GiB per GPU (the plan says {:.2} GiB); the plan was edited or made \
         by another plait: run `plait compile` again (or `plait estimate` with its strategy to \
         see where the memory goes)",
        plan.cluster.gpu.name,
        gib(p.peak_memory_bytes),
        gib(p.memory_capacity_bytes),
        gib(plan.predicted.peak_memory_bytes)
    )
}
