//! eqfuse: an e-graph superoptimizer that discovers kernel-fusion plans for tensor programs.
//!
//! A program (`.eqf` text or JSON) becomes a typed [`Program`]; it goes into an
//! [`egg::EGraph`] over [`TensorLang`] with [`ShapeAnalysis`]; staged rulesets add equal forms;
//! the extractor picks a [`FusionPlan`] by memory traffic; the CPU reference ([`eval`]) checks it all.
//! See `ARCHITECTURE.md` for the code map and invariants.

mod analysis;
mod conditions;
mod cost;
mod dag;
mod error;
mod expand;
mod explain;
mod extract;
mod fuse;
mod gen_program;
mod generate;
mod ilp;
mod infer;
mod json;
mod lang;
mod npy;
mod optimize;
mod parse;
mod plan;
mod plancheck;
mod profile;
mod program;
mod reference;
mod render;
mod rng;
mod rules;
mod run_cpu;
mod saturate;
mod scalar;
mod tensor;
mod types;

pub use analysis::{ClassData, ShapeAnalysis, Sign, TensorGraph};
pub use conditions::{condition, NamedCondition, CONDITIONS};
pub use cost::{analyse, KernelCost};
pub use dag::{Dag, DagNode, Role};
pub use error::{Diagnostic, Error, Result};
pub use expand::expand_composites;
pub use explain::explain;
pub use extract::{build_plan, dag_of, extract, fused_cost, local_selection, ExtractOptions, Extracted, Selection};
pub use fuse::{Fusion, Group};
pub use gen_program::{random_recipe, recipes, Recipe, Step};
pub use generate::residual_stack_eqf;
pub use ilp::{relaxed_cost, solve as solve_ilp, IlpResult, ILP_MAX_NODES};
pub use infer::{broadcast_shapes, infer, norm_axis, Fact, Inferred};
pub use json::{program_from_json, program_to_json};
pub use lang::{Binary, Composite, Dims, Kind, Num, OpCode, OpInfo, Reduce, TensorLang, Unary, OPS};
pub use npy::{read_npy, write_npy};
pub use optimize::{
    egraph_of, optimize, plan_saturated, saturate_program, unfused_totals, OptimizeOptions, Optimized, Saturated,
    StageSummary,
};
pub use parse::{load_program, parse_dim_override, parse_program};
pub use plan::{FusionPlan, Kernel, SearchReport, Template, TensorRef, Totals};
pub use plancheck::{check_plan, eval_plan, eval_plan_with, kernel_program};
pub use profile::{DeviceProfile, TemplateRates};
pub use program::{Input, Output, Program};
pub use reference::{eval, eval_all, eval_with, Precision};
pub use render::{human_bytes, plan_json, render, Format};
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

/// The README's examples run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// Pointwise semantics on f64, shared by every CPU evaluator.
pub mod scalars {
    pub use crate::scalar::{binary, gelu, gelu_tanh, sigmoid, unary};
}
