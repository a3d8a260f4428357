//! eqfuse: an e-graph superoptimizer that discovers kernel-fusion plans for tensor programs.
//!
//! A program (`.eqf` text or JSON) becomes a typed [`Program`]; it goes into an
//! [`egg::EGraph`] over [`TensorLang`] with [`ShapeAnalysis`]; staged rulesets add equal forms;
//! the extractor picks a [`FusionPlan`] by memory traffic; the CPU [`reference`] checks it all.
//! See `ARCHITECTURE.md` for the code map and invariants.

mod analysis;
mod error;
mod infer;
mod json;
mod lang;
mod parse;
mod program;
mod scalar;
mod types;

pub use analysis::{ClassData, ShapeAnalysis, Sign, TensorGraph};
pub use error::{Diagnostic, Error, Result};
pub use infer::{broadcast_shapes, infer, norm_axis, Fact, Inferred};
pub use json::{program_from_json, program_to_json};
pub use lang::{Binary, Composite, Dims, Kind, Num, OpCode, OpInfo, Reduce, TensorLang, Unary, OPS};
pub use parse::{load_program, parse_dim_override, parse_program};
pub use program::{Input, Output, Program};
pub use types::{DType, TensorType};

/// Pointwise semantics on f64, shared by every CPU evaluator.
pub mod scalars {
    pub use crate::scalar::{binary, gelu, gelu_tanh, sigmoid, unary};
}
