//! `FusionPlan` and `Kernel`: what the extractor chooses and everything downstream consumes.
//!
//! A plan is a list of kernels in execution order. Each kernel is an instance of one template,
//! names the tensors it reads from and writes to device memory, and carries its body: a small
//! `TensorLang` expression whose `Var` leaves are the tensors it reads. Everything in the body
//! that is not a read stays in registers or shared memory.
//! Invariant: a plan is self-contained; evaluating its kernels in order on the CPU reference
//! gives the program's outputs (checked by tests for every example), and codegen never changes it.

use egg::{Id, RecExpr};
use serde::Serialize;

use crate::lang::TensorLang;
use crate::types::TensorType;

/// The kernel templates of `kernels/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Template {
    /// Any fused pointwise body over broadcast inputs; several outputs.
    Elementwise,
    /// Reductions along the last axis with pointwise prologue and epilogue; several outputs.
    RowReduce,
    /// Reductions over a leading axis with pointwise prologue.
    ColReduce,
    /// A matrix product with a fused pointwise (or narrow row-softmax) epilogue.
    Gemm,
    /// Flash-style attention.
    Attention,
}

impl Template {
    pub const ALL: [Template; 5] =
        [Template::Elementwise, Template::RowReduce, Template::ColReduce, Template::Gemm, Template::Attention];

    pub fn name(self) -> &'static str {
        match self {
            Template::Elementwise => "elementwise",
            Template::RowReduce => "rowreduce",
            Template::ColReduce => "colreduce",
            Template::Gemm => "gemm",
            Template::Attention => "attention",
        }
    }
}

/// How a gemm kernel runs: one cuBLASLt call (its epilogues only) or the generated tensor
/// product template with any fused epilogue. The cost model picks the faster by the profile's
/// per-implementation rates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmImpl {
    Cublaslt,
    Generated,
}

impl GemmImpl {
    pub fn name(self) -> &'static str {
        match self {
            GemmImpl::Cublaslt => "cublaslt",
            GemmImpl::Generated => "generated",
        }
    }
}

/// A tensor in device memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TensorRef {
    pub name: String,
    #[serde(flatten)]
    pub ty: TensorType,
}

/// One kernel of a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub id: usize,
    pub template: Template,
    /// The iteration space: the shape of the largest value the kernel computes.
    pub domain: Vec<usize>,
    /// The operators fused into this kernel, in body order (contract field `ops`).
    pub ops: Vec<String>,
    /// Tensors read from device memory (each once).
    pub reads: Vec<TensorRef>,
    /// Tensors written to device memory.
    pub writes: Vec<TensorRef>,
    /// The computation; `Var` leaves name the tensors in `reads`.
    pub body: RecExpr<TensorLang>,
    /// For each entry of `writes`, the body node it stores.
    pub stores: Vec<Id>,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub flops: u64,
    pub predicted_us: f64,
    /// Fusions the planner considered near this kernel and rejected, with the reason.
    pub rejected: Vec<String>,
    /// For a gemm kernel, the implementation the cost model chose.
    pub implementation: Option<GemmImpl>,
}

/// Totals over a plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    pub kernels: usize,
    pub bytes: u64,
    pub flops: u64,
    pub predicted_us: f64,
}

/// How the search went.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SearchReport {
    pub iterations: usize,
    pub enodes: usize,
    pub eclasses: usize,
    pub stop_reason: String,
    pub saturate_ms: f64,
    pub extract_ms: f64,
    pub extractor: String,
    /// Relative distance of the chosen plan's predicted time above a proven lower bound (0 when
    /// the plan is optimal for the cost model); `null` when no bound was computed.
    pub gap: Option<f64>,
    /// The proven lower bound itself, in microseconds, when one was computed (unrounded, so that
    /// tests can check the plan never beats it).
    pub lower_bound_us: Option<f64>,
    /// Strict numerics (`--strict`): only exact rules were used, and code generation keeps the
    /// unfused plan's floating-point operations, their order and their roundings, so fused
    /// results are bit-identical to the unfused plan's on the GPU.
    pub strict: bool,
    /// `stop_reason` with the limit that stopped saturation, named and numbered (a per-stage
    /// cap says so): `node-limit: stage `algebra` reached its per-stage cap of 1030 e-nodes ...`.
    pub stop_detail: String,
    /// The planning command's time limit in seconds (`--time-limit`): saturation, extraction,
    /// the fusion search and the ILP together.
    pub time_limit_s: f64,
    /// The steps the time limit cut short, in order (empty when it cut nothing): the plan is
    /// then the best complete plan found before the limit, at worst the unfused one.
    pub time_limit_cut: Vec<String>,
}

/// The extractor's output.
#[derive(Clone, Debug, PartialEq)]
pub struct FusionPlan {
    /// The program's source name.
    pub program: String,
    /// The device profile's name.
    pub device: String,
    pub kernels: Vec<Kernel>,
    /// The program's inputs, as read by the kernels.
    pub inputs: Vec<TensorRef>,
    /// For each program output, in order, the tensor holding it.
    pub outputs: Vec<(String, String)>,
    pub total: Totals,
    /// The program as written, one kernel per primitive op (composites expanded).
    pub unfused: Totals,
    pub search: SearchReport,
    /// Peak device memory by liveness over the kernels, and the tensors saved between kernels.
    pub memory: crate::memory::MemoryReport,
}

impl FusionPlan {
    /// Predicted speedup of this plan over the unfused one.
    pub fn speedup(&self) -> f64 {
        if self.total.predicted_us > 0.0 {
            self.unfused.predicted_us / self.total.predicted_us
        } else {
            1.0
        }
    }

    /// The memory report of kernels run in order over these inputs and outputs; `packed` lists
    /// the tensors stored 1 bit per element.
    pub fn memory_of(
        kernels: &[Kernel],
        inputs: &[TensorRef],
        outputs: &[(String, String)],
        packed: &std::collections::BTreeSet<String>,
    ) -> crate::memory::MemoryReport {
        use std::collections::BTreeMap;
        let mut types: BTreeMap<&str, &TensorType> = inputs.iter().map(|i| (i.name.as_str(), &i.ty)).collect();
        for k in kernels {
            types.extend(k.writes.iter().map(|w| (w.name.as_str(), &w.ty)));
        }
        let io: Vec<crate::memory::KernelIo> = kernels
            .iter()
            .map(|k| crate::memory::KernelIo {
                reads: k.reads.iter().map(|r| r.name.as_str()).collect(),
                writes: k.writes.iter().map(|w| w.name.as_str()).collect(),
            })
            .collect();
        let ins: Vec<(&str, &TensorType)> = inputs.iter().map(|i| (i.name.as_str(), &i.ty)).collect();
        let outs: Vec<&str> = outputs.iter().map(|(_, t)| t.as_str()).collect();
        crate::memory::liveness(&io, &ins, &outs, &|n| types.get(n).map(|t| (*t).clone()), &|n| packed.contains(n))
    }

    /// Whether a tensor of the plan is stored 1 bit per element (a saved bool mask).
    pub fn is_packed(&self, name: &str) -> bool {
        self.memory.saved.iter().any(|s| s.packed && s.name == name)
    }

    /// Recomputes `total` from the kernels.
    pub fn sum_totals(kernels: &[Kernel]) -> Totals {
        Totals {
            kernels: kernels.len(),
            bytes: kernels.iter().map(|k| k.bytes_read + k.bytes_written).sum(),
            flops: kernels.iter().map(|k| k.flops).sum(),
            predicted_us: kernels.iter().map(|k| k.predicted_us).sum(),
        }
    }
}
