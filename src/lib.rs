//! eqfuse: an e-graph superoptimizer that discovers kernel-fusion plans for tensor programs.
//!
//! A program (`.eqf` text or JSON) becomes a typed [`Program`]; it goes into an
//! [`egg::EGraph`] over [`TensorLang`] with [`ShapeAnalysis`]; staged rulesets add equal forms;
//! the extractor picks a [`FusionPlan`] by memory traffic; the CPU [`reference`] checks it all.
//! See `ARCHITECTURE.md` for the code map and invariants.

mod analysis;
mod conditions;
mod error;
mod infer;
mod lang;
mod npy;
mod program;
mod reference;
mod rng;
mod rules;
mod run_cpu;
mod saturate;
mod scalar;
mod tensor;
mod types;

pub use analysis::{ClassData, ShapeAnalysis, Sign, TensorGraph};
pub use conditions::{condition, NamedCondition, CONDITIONS};
pub use error::{Diagnostic, Error, Result};
pub use infer::{broadcast_shapes, infer, norm_axis, Fact, Inferred};
pub use lang::{Binary, Composite, Dims, Kind, Num, OpCode, OpInfo, Reduce, TensorLang, Unary, OPS};
pub use npy::{read_npy, write_npy};
pub use program::{Input, Output, Program};
pub use reference::{eval, eval_all};
pub use rng::{dropout_keep, dropout_scale, dropout_threshold, random_input, random_inputs};
pub use rules::{default_rules, load_rules_dir, parse_ruleset, Rule, RuleSet, STAGE_ORDER};
pub use run_cpu::{run_cpu, CpuRunOptions, CpuRunReport, InputReport, InputSource, OutputReport};
pub use saturate::{saturate, saturate_egraph, Budgets, Saturation, StageReport, StopReason, MIN_STAGE_ROOM};
pub use tensor::{tolerance, Comparison, Summary, Tensor};
pub use types::{DType, TensorType};

/// The counter-based generator that dropout and seeded inputs use (the CUDA side reproduces it).
pub mod random {
    pub use crate::rng::*;
}

/// Pointwise semantics on f64, shared by every CPU evaluator.
pub mod scalars {
    pub use crate::scalar::{binary, gelu, gelu_tanh, sigmoid, unary};
}
