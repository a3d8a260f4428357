//! A gemm kernel as cuBLASLt calls: the pure description codegen builds (serialisable into the
//! launch manifest) and the runtime (`cublas`) executes. Column-major terms throughout: the
//! row-major product `D[M, N] = A[M, K] @ B[K, N]` is handed over as `D^T = B^T A^T`.

use serde::Serialize;

use crate::ir::types::DType;

/// The epilogues of cuBLASLt that eqfuse uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LtEpilogue {
    Default,
    Bias,
    Relu,
    ReluBias,
    /// cuBLASLt's GELU is the tanh form (`gelu_tanh`), not the erf form of `gelu`.
    Gelu,
    GeluBias,
}

/// One column-major operand of the call: a tensor by name, its op flag and layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LtOperand {
    pub tensor: String,
    pub transpose: bool,
    /// The stored (column-major) matrix: rows, columns, leading dimension.
    pub rows: u64,
    pub cols: u64,
    pub ld: i64,
    /// Elements between consecutive batch matrices (0: shared by every batch).
    pub batch_stride: i64,
    /// The element of the tensor the first matrix starts at (a slice's start, read in place;
    /// absent when 0). [`LtCall::offsets`] includes it.
    #[serde(skip_serializing_if = "is_zero")]
    pub offset: i64,
}

fn is_zero(x: &i64) -> bool {
    *x == 0
}

/// A gemm kernel as one cuBLASLt call (column-major terms: `d[m, n] = op(a) op(b)`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LtCall {
    pub dtype: DType,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
    pub a: LtOperand,
    pub b: LtOperand,
    /// The output, contiguous: column-major `[m, n]` with leading dimension `m`.
    pub d: String,
    pub epilogue: LtEpilogue,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bias: Option<String>,
    /// The product's constant factor (`d = epilogue(alpha op(a) op(b) + bias)`).
    #[serde(skip_serializing_if = "is_one")]
    pub alpha: f32,
    /// Batch axes no single stride spans (a view's heads inside its rows, say), outermost first:
    /// the call runs once per index of them, each operand moved by its strides (elements of
    /// `a`, `b`, `d`). Empty: one call.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub outer: Vec<LtLoop>,
}

fn is_one(x: &f32) -> bool {
    *x == 1.0
}

/// One batch axis the call loops over: its size and each operand's stride along it, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LtLoop {
    pub count: u64,
    pub a: i64,
    pub b: i64,
    pub d: i64,
}

impl LtCall {
    /// The `cublasLtMatmul` calls one launch makes.
    pub fn calls(&self) -> u64 {
        self.outer.iter().map(|l| l.count).product()
    }

    /// The element offsets of `a`, `b` and `d` of each call, in launch order (from the
    /// operands' own offsets).
    pub fn offsets(&self) -> Vec<[i64; 3]> {
        let mut out = vec![[self.a.offset, self.b.offset, 0]];
        for l in &self.outer {
            out = out
                .iter()
                .flat_map(|o| (0..l.count as i64).map(move |i| [o[0] + i * l.a, o[1] + i * l.b, o[2] + i * l.d]))
                .collect();
        }
        out
    }
}
