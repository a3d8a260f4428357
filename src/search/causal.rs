//! The causal mask's conditions over e-classes: an e-graph is an [`IndexGraph`], so the index
//! expressions of [`crate::ir::index`] describe its classes (any node of a class that
//! provably computes an index function describes it).

use egg::Id;

pub use crate::ir::index::{additive_mask, is_fill, predicate, scores_keep, uniform, Affine, IndexGraph};
use crate::ir::lang::TensorLang;
use crate::ir::types::TensorType;
use crate::search::analysis::TensorGraph;

impl IndexGraph for TensorGraph {
    fn nodes(&self, id: Id) -> &[TensorLang] {
        &self[id].nodes
    }
    fn ty(&self, id: Id) -> Option<&TensorType> {
        self[id].data.ty()
    }
    fn konst(&self, id: Id) -> Option<f64> {
        self[id].data.konst()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::types::DType;
    use crate::ir::types::TensorType;
    use crate::search::analysis::ShapeAnalysis;
    use egg::RecExpr;

    fn class(expr: &str) -> (TensorGraph, Id) {
        let f = |s: &[usize]| TensorType::new(DType::F32, s.to_vec());
        let mut g = TensorGraph::new(ShapeAnalysis::new([("x".to_string(), f(&[2, 5, 5]))]));
        let id = g.add_expr(&expr.parse::<RecExpr<TensorLang>>().unwrap());
        g.rebuild();
        (g, id)
    }

    const ROW: &str = "(reshape (iota 5) [5,1])";
    const COL: &str = "(iota 5)";

    fn keep() -> Affine {
        Affine::causal_keep(&[2, 5, 5]).unwrap()
    }

    fn pred(e: &str) -> Option<Affine> {
        let (g, id) = class(e);
        predicate(&g, id).and_then(|p| p.align(&[2, 5, 5]))
    }

    #[test]
    fn spellings_of_the_causal_keep_mask() {
        for e in [
            format!("(>= {ROW} {COL})"),
            format!("(<= {COL} {ROW})"),
            format!("(> (+ {ROW} 1) {COL})"),
            format!("(< {COL} (+ 1 {ROW}))"),
            format!("(not (> {COL} {ROW}))"),
            format!("(>= (- {ROW} {COL}) 0)"),
            format!("(>= (cast {ROW} f32) (cast {COL} f32))"),
            format!("(>= (* 2 {ROW}) (* {COL} 2))"),
            format!("(>= (transpose (reshape (iota 5) [1,5]) 0 1) (broadcast {COL} [5,5]))"),
            format!("(broadcast (>= {ROW} {COL}) [2,5,5])"),
        ] {
            assert_eq!(pred(&e), Some(keep()), "{e}");
        }
        for e in [format!("(> {COL} {ROW})"), format!("(< {ROW} {COL})"), format!("(not (>= {ROW} {COL}))")] {
            assert_eq!(pred(&e), Some(keep().complement()), "{e}");
        }
    }

    #[test]
    fn other_masks_are_not_causal() {
        for e in [
            format!("(> {ROW} {COL})"),
            format!("(>= {COL} {ROW})"),
            format!("(>= (+ {ROW} 1) {COL})"),
            format!("(>= (* 2 {ROW}) {COL})"),
            format!("(>= {ROW} (reshape (iota 5) [5,1]))"),
        ] {
            assert_ne!(pred(&e), Some(keep()), "{e}");
            assert_ne!(pred(&e), Some(keep().complement()), "{e}");
        }
        // Not index expressions: an input, an equality, a bf16 cast (inexact beyond 256).
        for e in
            [format!("(>= x {COL})"), format!("(== {ROW} {COL})"), format!("(>= (cast {ROW} bf16) (cast {COL} bf16))")]
        {
            assert_eq!(pred(&e), None, "{e}");
        }
    }

    #[test]
    fn additive_masks() {
        let am = |e: &str| {
            let (g, id) = class(e);
            additive_mask(&g, id).and_then(|p| p.align(&[2, 5, 5]))
        };
        assert_eq!(am(&format!("(where (>= {ROW} {COL}) 0 -1e30)")), Some(keep()));
        assert_eq!(am(&format!("(where (> {COL} {ROW}) -1e9 0)")), Some(keep()));
        assert_eq!(am(&format!("(cast (where (> {COL} {ROW}) -1e9 0) bf16)")), Some(keep()));
        assert_eq!(am(&format!("(* (cast (> {COL} {ROW}) f32) -10000)")), Some(keep()));
        assert_eq!(am(&format!("(where (> {COL} {ROW}) -100 0)")), None);
        assert_eq!(am(&format!("(where (> {COL} {ROW}) 0 -1e9)")), Some(keep().complement()));
    }
}
