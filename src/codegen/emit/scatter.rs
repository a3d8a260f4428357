//! Rendering for `kernels/scatter.cu`: the elementwise body over a `scatter_add`'s values, each
//! value added by an atomic at its index, and the template's phase sizes.
//! Invariant: the kernel writes the scatter_add's result and nothing else (`lower.rs`).

use super::*;
use crate::codegen::lower::Scatter;

/// Vectors of `EQ_VEC` elements of the iteration space per thread in one claimed chunk of the
/// adding phase.
const ADD_STEPS: usize = 4;

/// Groups of four output elements per thread in one claimed chunk of the zeroing or converting
/// phase.
const FILL_STEPS: usize = 16;

/// Threads of a block.
const THREADS: usize = 256;

/// Whether a scatter_add into `dtype` sums in an f32 accumulator (16-bit outputs: each element
/// rounded once, when the accumulator is converted); f32 and i32 outputs are summed in place.
pub fn accumulates(dtype: DType) -> bool {
    matches!(dtype, DType::Bf16 | DType::F16)
}

impl Emitter<'_> {
    pub(super) fn scatter(&self, sc: &Scatter) -> Result<Rendered> {
        let w = &self.k.writes[sc.write];
        let dtype = w.ty.dtype;
        if self.strict && dtype.is_float() {
            return Err(err(
                self.k,
                "under --strict, scatter_add of float values (f32 atomics, summed in the order they land) is not \
                 supported yet",
            ));
        }
        let acc = accumulates(dtype);
        let target = if acc { "eq_acc".to_string() } else { self.param(None, Some(sc.write)) };
        let vt = value_type(dtype);
        let n = sc.extent;
        let stride = sc.stride;
        // The lanes of a vector share their index and add to consecutive output elements where
        // the last axis is one of the output's own.
        let rows = sc.rows && self.vec > 1 && sc.strides.last() == Some(&1);
        let mut scope = self.scope(true);
        let header = "template <int V>\n__device__ __forceinline__ void eq_body(EQ_PARAMS, eq_idx i0) {";
        let f = self.lane_function(header, 0, &mut scope, &[sc.value, sc.index], |e, scope, need| {
            let off = e.offset(&sc.strides, need);
            let x = e.operand(sc.value, vt, scope);
            let j = e.operand(sc.index, "int", scope);
            if rows {
                let decls = vec![format!("{vt} sa[V];"), "int sj = 0;".to_string()];
                let lines = vec![format!("sa[v] = {x};"), format!("sj = {j};")];
                let after = vec![format!("eq_scatter_addv<V>({target}, {off}, sj, {n}LL, {stride}, sa);")];
                return (decls, lines, after);
            }
            let s = sc.strides.last().copied().unwrap_or(0);
            let at = if s == 0 { off } else { format!("{off} + {}", lane_term(s)) };
            (vec![], vec![format!("eq_scatter_add({target}, {at}, {j}, {n}LL, {stride}, ({vt})({x}));")], vec![])
        });
        let numel: usize = self.l.domain.iter().product();
        let out_numel = w.ty.numel();
        let add_chunk = THREADS * ADD_STEPS;
        let add_chunks = (numel / self.vec).div_ceil(add_chunk);
        let fill_chunk = THREADS * FILL_STEPS;
        let fill_chunks = out_numel.div_ceil(4).div_ceil(fill_chunk);
        let blocks = add_chunks.max(fill_chunks).clamp(1, MAX_ELEMENTWISE_BLOCKS);
        let mut workspace_params = vec![("unsigned int", "eq_count")];
        let mut workspace = vec![("eq_count".to_string(), COUNTERS * 4, true)];
        if acc {
            workspace_params.push(("float", "eq_acc"));
            workspace.push(("eq_acc".to_string(), (out_numel as u64 * 4).max(16), true));
        }
        let mut d = self.common_defines(&self.name(), &workspace_params);
        for (k, v) in [
            ("EQ_NUMEL", numel.to_string()),
            ("EQ_VEC", self.vec.to_string()),
            ("EQ_THREADS", THREADS.to_string()),
            ("EQ_ADD_STEPS", ADD_STEPS.to_string()),
            ("EQ_ADD_CHUNKS", add_chunks.to_string()),
            ("EQ_OUT_NUMEL", out_numel.to_string()),
            ("EQ_OUT", self.param(None, Some(sc.write))),
            ("EQ_OUT_T", storage_type(dtype).to_string()),
            ("EQ_ACC", (acc as u8).to_string()),
            ("EQ_FILL_STEPS", FILL_STEPS.to_string()),
            ("EQ_FILL_CHUNKS", fill_chunks.to_string()),
        ] {
            let _ = writeln!(d, "#define {k} {v}");
        }
        let shape = Shape {
            grid: [blocks as u32, 1, 1],
            block: [THREADS as u32, 1, 1],
            workspace,
            smem_bytes: 0,
            wave: true,
            cluster: 0,
        };
        Ok(Rendered {
            defines: d,
            body: f,
            shape,
            params: Params { vec: self.vec, row_threads: 1, nacc: 1 },
            sm90a: None,
        })
    }
}

/// Words of the template's counters (`eq_count`): claimed and done chunks of three phases, and
/// the blocks that left, in a 32-byte buffer.
const COUNTERS: u64 = 8;
