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
mod program;
mod rules;
mod saturate;
mod scalar;
mod types;

pub use analysis::{ClassData, ShapeAnalysis, Sign, TensorGraph};
pub use conditions::{condition, NamedCondition, CONDITIONS};
pub use error::{Diagnostic, Error, Result};
pub use infer::{broadcast_shapes, infer, norm_axis, Fact, Inferred};
pub use lang::{Binary, Composite, Dims, Kind, Num, OpCode, OpInfo, Reduce, TensorLang, Unary, OPS};
pub use program::{Input, Output, Program};
pub use rules::{default_rules, load_rules_dir, parse_ruleset, Rule, RuleSet, STAGE_ORDER};
pub use saturate::{egraph_of, saturate, Budgets, Saturation, StageReport, StopReason};
pub use types::{DType, TensorType};

/// Pointwise semantics on f64, shared by every CPU evaluator.
pub mod scalars {
    pub use crate::scalar::{binary, gelu, gelu_tanh, sigmoid, unary};
}
