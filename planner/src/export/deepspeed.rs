//! DeepSpeed: the `ds_config.json` of the plan (DeepSpeed's configuration JSON, as its docs
//! name the keys: `train_batch_size`, `train_micro_batch_size_per_gpu`,
//! `gradient_accumulation_steps`, `zero_optimization`, `bf16`/`fp16`,
//! `activation_checkpointing`). DeepSpeed reads the data-parallel degree from the world size
//! over the model-parallel degrees, so the batch arithmetic must close:
//! `train_batch_size = micro-batch × accumulation × dp`.

use serde_json::{Value, json};

use crate::engine::{DEEPSPEED_MAX_LIVE_PARAMETERS, DEEPSPEED_REDUCE_BUCKET_SIZE, Engine};
use crate::error::PlanError;
use crate::plan::Plan;
use crate::precision::Precision;
use crate::strategy::Recompute;

/// The DeepSpeed release whose configuration keys these are.
pub const VERSION: &str = "0.16";

fn refuse(feature: impl Into<String>, limit: &str) -> PlanError {
    PlanError::Unexportable {
        engine: "DeepSpeed",
        feature: feature.into(),
        limit: limit.into(),
    }
}

/// The configuration, or why DeepSpeed cannot run the plan.
pub fn config(plan: &Plan) -> Result<Value, PlanError> {
    let s = &plan.strategy;
    Engine::Deepspeed
        .runs(s)
        .map_err(|why| refuse(why, "see `plait compile --target deepspeed`"))?;
    let per_step = s.micro_batch * u64::from(s.dp);
    let accumulation = s.global_batch / per_step;
    let mut c = json!({
        "train_batch_size": s.global_batch,
        "train_micro_batch_size_per_gpu": s.micro_batch,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": 1.0,
        "steps_per_print": 1,
        "zero_optimization": {
            "stage": s.zero,
            "overlap_comm": s.zero == 3,
            "contiguous_gradients": true,
            "reduce_bucket_size": DEEPSPEED_REDUCE_BUCKET_SIZE as u64,
        },
    });
    if s.zero == 3 {
        c["zero_optimization"]["stage3_max_live_parameters"] =
            json!(DEEPSPEED_MAX_LIVE_PARAMETERS as u64);
        c["zero_optimization"]["stage3_prefetch_bucket_size"] =
            json!(DEEPSPEED_REDUCE_BUCKET_SIZE as u64);
    }
    match s.precision {
        Precision::Bf16 => {
            c["bf16"] = json!({ "enabled": true });
            // DeepSpeed's bf16 optimizer accumulates gradients in fp32 unless told otherwise
            // (DeepSpeed PR #4713); the plan holds them in bf16 (`Precision::grad_bytes`).
            c["data_types"] = json!({ "grad_accum_dtype": "bf16" });
        }
        Precision::Fp16 => c["fp16"] = json!({ "enabled": true }),
        Precision::Fp32 => {}
        Precision::Fp8 | Precision::Fp8Tensorwise => {
            return Err(refuse("FP8", "no Transformer Engine FP8 in its config"));
        }
    }
    if s.recompute == Recompute::Full {
        c["activation_checkpointing"] = json!({
            "partition_activations": false,
            "contiguous_memory_optimization": false,
            "number_checkpoints": plan.model.layers,
        });
    }
    Ok(c)
}

/// The launch: DeepSpeed's runner over the user's training script, with the configuration.
pub fn launch(plan: &Plan, config: &Value) -> String {
    let per_node = u64::from(plan.cluster.gpus_per_node).min(plan.gpus).max(1);
    format!(
        "# plait plan for {} on {} x {} ({}): DeepSpeed ZeRO-{}, {} pipeline stage(s) (a \
         PipelineModule of that many stages when more than one).\n\
         # Save the configuration below as ds_config.json and start your training script with\n\
         #   deepspeed --num_nodes {} --num_gpus {per_node} train.py --deepspeed --deepspeed_config ds_config.json\n{}\n",
        super::comment(&plan.model.name),
        plan.gpus,
        super::comment(&plan.cluster.gpu.name),
        super::comment(&plan.cluster.name),
        plan.strategy.zero,
        plan.strategy.pp,
        plan.gpus.div_ceil(per_node),
        serde_json::to_string_pretty(config).unwrap_or_default()
    )
}
