//! Rendering for `kernels/colreduce.cu`: the prologue and accumulation over one leading axis,
//! and the stores of the reduced values.
//! Invariant: a column reduction's result is only stored (through a pointwise epilogue: a cast,
//! a unary operator, a binary one with a constant, evaluated as it is stored), never used
//! otherwise by the same kernel.

use super::*;

impl Emitter<'_> {
    pub(super) fn colreduce(&self) -> Result<Rendered> {
        let a = self.l.axis.unwrap_or(0);
        let reds: Vec<usize> = (0..self.l.nodes.len()).filter(|&i| matches!(self.node(i).op, Op::Reduce(..))).collect();
        let after = self.after_reductions(&reds);
        for (i, n) in self.l.nodes.iter().enumerate() {
            let epilogue = match n.op {
                Op::Cast(..) | Op::Unary(..) => true,
                Op::Binary(_, a, b) => [a, b].iter().all(|&c| after[c] || matches!(self.node(c).op, Op::Const(_))),
                _ => false,
            };
            if after[i] && !epilogue && !reds.contains(&i) {
                return Err(err(
                    self.k,
                    format!("the result of a column reduction is used in the same kernel (node {i})"),
                ));
            }
        }
        let outer: usize = self.l.domain[..a].iter().product();
        let n = self.dim(a);
        let inner: usize = self.l.domain[a + 1..].iter().product();
        let tx = pow2_at_least(inner.div_ceil(self.vec)).min(32);
        // (A thread accumulates 8 rows or more: their loads are in flight together.)
        let ty = (256 / tx).min(pow2_at_least(n.div_ceil(8)));
        let tile = tx * self.vec;
        let tiles = outer * inner.div_ceil(tile);
        let max_chunks = n.div_ceil(ty * 8).max(1);
        let chunks = 1024usize.div_ceil(tiles.max(1)).clamp(1, max_chunks);
        let chunk_n = n.div_ceil(chunks);
        let chunks = n.div_ceil(chunk_n);
        // Narrow tiles over a short axis make blocks of a few threads: several tiles then share
        // a block (z slices, 64 at most), as long as a thousand blocks remain.
        let mut tz = if chunks == 1 { (256 / (tx * ty)).clamp(1, 64) } else { 1 };
        while tz > 1 && tiles.div_ceil(tz) < 1024 {
            tz /= 2;
        }
        let nacc = reds.len().max(1);
        let ws_bytes = (tiles * chunks * nacc * tile * 4).max(4) as u64;
        let count_bytes = (tiles * 4).max(4) as u64;

        let mut d = self.common_defines(&self.name(), &[("float", "eq_ws"), ("unsigned int", "eq_count")]);
        for (k, v) in [
            ("EQ_OUTER", outer),
            ("EQ_N", n),
            ("EQ_INNER", inner),
            ("EQ_VEC", self.vec),
            ("EQ_TX", tx),
            ("EQ_TY", ty),
            ("EQ_TZ", tz),
            ("EQ_CHUNKS", chunks),
            ("EQ_CHUNK_N", chunk_n),
            ("EQ_NACC", nacc),
        ] {
            let _ = writeln!(d, "#define {k} {v}");
        }
        let mut body = String::new();
        let mut t = Text::default();
        t.line(0, "__device__ __forceinline__ void eq_acc_init(float (&acc)[EQ_NACC][EQ_VEC]) {");
        for (k, &i) in reds.iter().enumerate() {
            t.line(1, format!("for (int v = 0; v < EQ_VEC; ++v) acc[{k}][v] = {};", reduce_init(self.reduce_of(i))));
        }
        t.line(0, "}");
        t.line(0, "__device__ __forceinline__ float eq_combine(int k, float a, float b) {");
        for (k, &i) in reds.iter().enumerate() {
            t.line(1, format!("if (k == {k}) return {};", reduce_combine(self.reduce_of(i), "a", "b", self.strict)));
        }
        t.line(1, "return a;");
        t.line(0, "}");
        body.push_str(&t.s);
        body.push_str(&self.col_accum(&reds, &after));
        body.push_str(&self.col_store(&reds, &after, n));
        let shape = Shape {
            grid: [tiles.div_ceil(tz) as u32, chunks as u32, 1],
            block: [tx as u32, ty as u32, tz as u32],
            workspace: vec![("eq_ws".into(), ws_bytes, false), ("eq_count".into(), count_bytes, true)],
            smem_bytes: 0,
            wave: false,
            cluster: 0,
        };
        Ok(Rendered { defines: d, body, shape, params: Params { vec: self.vec, row_threads: 1, nacc }, sm90a: None })
    }

    /// Which nodes are reductions or computed from one: a pointwise epilogue of the reduced
    /// values (a cast, a unary operator, a binary one with a constant), evaluated where they
    /// are stored.
    fn after_reductions(&self, reds: &[usize]) -> Vec<bool> {
        let mut after = vec![false; self.l.nodes.len()];
        for (i, n) in self.l.nodes.iter().enumerate() {
            after[i] = reds.contains(&i) || children(&n.op).iter().any(|&c| after[c]);
        }
        after
    }

    fn col_accum(&self, reds: &[usize], after: &[bool]) -> String {
        let mut scope = self.scope(true);
        for &i in reds {
            scope.refs[i] = Some(String::new());
        }
        let inputs: Vec<usize> = reds.iter().map(|&i| children(&self.node(i).op)[0]).collect();
        let stores: Vec<&Store> = self.l.stores.iter().filter(|s| !after[s.node]).collect();
        let mut roots = inputs.clone();
        roots.extend(stores.iter().map(|s| s.node));
        self.lane_function(
            "__device__ __forceinline__ void eq_accum(EQ_PARAMS, eq_idx o, eq_idx n, eq_idx i0, float (&acc)[EQ_NACC][EQ_VEC]) {",
            0,
            &mut scope,
            &roots,
            |e, scope, need| {
                let (decls, mut lines, after) =
                    e.store_lines(&stores, |st| e.operand(st.node, value_type(e.node(st.node).dtype), scope), None, need);
                for (k, (&red, &x)) in reds.iter().zip(&inputs).enumerate() {
                    let val = e.operand(x, "float", scope);
                    lines.push(format!("acc[{k}][v] = {};", reduce_combine(e.reduce_of(red), &format!("acc[{k}][v]"), &val, e.strict)));
                }
                (decls, lines, after)
            },
        )
    }

    fn col_store(&self, reds: &[usize], after: &[bool], n: usize) -> String {
        let mut scope = self.scope(true);
        for (k, &i) in reds.iter().enumerate() {
            let v = match self.reduce_of(i) {
                Reduce::Mean => format!("(acc[{k}][v] / {})", literal(n as f64, "float")),
                _ => format!("acc[{k}][v]"),
            };
            scope.refs[i] = Some(self.rounded(i, v));
        }
        let stores: Vec<&Store> = self.l.stores.iter().filter(|s| after[s.node]).collect();
        let epilogue: Vec<usize> = stores.iter().map(|s| s.node).filter(|n| !reds.contains(n)).collect();
        let axis = self.l.axis;
        self.lane_function(
            "__device__ __forceinline__ void eq_col_store(EQ_PARAMS, eq_idx o, eq_idx i0, const float (&acc)[EQ_NACC][EQ_VEC]) {",
            0,
            &mut scope,
            &epilogue,
            |e, scope, need| {
                e.store_lines(&stores, |st| e.operand(st.node, value_type(e.node(st.node).dtype), scope), axis, need)
            },
        )
    }
}
