//! eqfuse: an e-graph superoptimizer that discovers kernel-fusion plans for tensor programs.
//!
//! A program (`.eqf` text or JSON) becomes a typed [`Program`]; it goes into an
//! [`egg::EGraph`] over [`TensorLang`] with [`ShapeAnalysis`]; staged rulesets add equal forms;
//! the extractor picks a [`FusionPlan`] by memory traffic; the CPU [`reference`] checks it all.
//! See `ARCHITECTURE.md` for the code map and invariants.

mod analysis;
mod codegen;
mod cost;
mod dag;
mod error;
mod expand;
mod extract;
mod fuse;
mod infer;
mod lang;
mod nvrtc;
mod optimize;
mod plan;
mod profile;
mod program;
mod render;
mod scalar;
mod types;

pub use analysis::{ClassData, ShapeAnalysis, Sign, TensorGraph};
pub use codegen::{
    codegen_kernel, codegen_plan, manifest_json, write_codegen_dir, ArgRole, KernelArg, KernelSource, Launch,
    TEMPLATE_FILES,
};
pub use cost::{analyse, KernelCost};
pub use dag::{Dag, DagNode, Role};
pub use error::{Diagnostic, Error, Result};
pub use expand::expand_composites;
pub use extract::{build_plan, dag_of, extract, local_selection, ExtractOptions, Extracted, Selection};
pub use fuse::{Fusion, Group};
pub use infer::{broadcast_shapes, infer, norm_axis, Fact, Inferred};
pub use lang::{Binary, Composite, Dims, Kind, Num, OpCode, OpInfo, Reduce, TensorLang, Unary, OPS};
pub use nvrtc::{
    available as nvrtc_available, cache_dir, compile as nvrtc_compile, compile_cached as nvrtc_compile_cached,
    Compiled, DEFAULT_ARCH,
};
pub use optimize::{egraph_of, optimize, unfused_totals, OptimizeOptions, Optimized, StageSummary};
pub use plan::{FusionPlan, Kernel, SearchReport, Template, TensorRef, Totals};
pub use profile::{DeviceProfile, TemplateRates};
pub use program::{Input, Output, Program};
pub use render::{human_bytes, plan_json, render, Format};
pub use types::{DType, TensorType};

/// Pointwise semantics on f64, shared by every CPU evaluator.
pub mod scalars {
    pub use crate::scalar::{binary, gelu, gelu_tanh, sigmoid, unary};
}
