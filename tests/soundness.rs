//! Rule soundness: every rule of every default ruleset, checked on random instantiations by
//! the library's checker (`eqfuse::check_rule`, which also checks rules loaded with `--rules`),
//! and the checker itself shown to catch unsound, type-changing and weakened rules.

use eqfuse::{
    check_native_rule, check_rewrite_on, check_rule, default_rules, load_rules_dir, parse_ruleset, DType, Program,
    Rule, TensorType, NATIVE_RULES,
};

#[test]
fn every_default_rule_is_sound() {
    let mut failures = vec![];
    let mut checked = 0;
    for set in default_rules().unwrap() {
        for rule in &set.rules {
            match check_rule(rule) {
                Ok(cases) => {
                    eprintln!("{:<32} {cases:?}", rule.name);
                    checked += 1;
                }
                Err(e) => failures.push(e),
            }
        }
        for rule in &set.native {
            match check_native_rule(rule) {
                Ok(cases) => {
                    eprintln!("{:<32} {cases:?} (native)", rule.name);
                    checked += 1;
                }
                Err(e) => failures.push(e),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} rules failed:\n\n{}",
        failures.len(),
        checked + failures.len(),
        failures.join("\n\n")
    );
}

fn one_rule(text: &str) -> Rule {
    parse_ruleset("bad", "bad.rules", text).unwrap().rules.remove(0)
}

#[test]
fn an_unsound_rule_is_caught() {
    let err = check_rule(&one_rule("(rewrite bad (+ ?x ?y) ?x)")).unwrap_err();
    assert!(err.contains("rule `bad` (bad.rules:1) is unsound"), "{err}");
}

#[test]
fn a_type_changing_rule_is_caught() {
    let err = check_rule(&one_rule("(rewrite bad (+ ?x 0) (reshape ?x []))")).unwrap_err();
    assert!(err.contains("type"), "{err}");
    let err = check_rule(&one_rule("(rewrite bad (* ?x ?y) (* ?y ?y))")).unwrap_err();
    assert!(err.contains("unsound"), "{err}");
}

#[test]
fn a_rule_with_no_valid_instantiation_fails() {
    let err = check_rule(&one_rule("(rewrite bad (transpose ?x 5 6) ?x)")).unwrap_err();
    assert!(err.contains("no test case"), "{err}");
}

/// Real rules with a condition dropped (or a side changed): each must fail, so that the
/// harness is known to explore integer dtypes with fractional literals, size-1 axes, weak
/// literals and shape mismatches. (`sum-mul-const` without its `float` condition is not here:
/// i32 arithmetic wraps, so a sum is linear over i32 as well.)
#[test]
fn weakened_rules_are_caught() {
    let weakened = [
        "(rewrite weak (* (* ?x ?y) ?z) (* ?x (* ?y ?z)))",
        "(rewrite weak (+ (+ ?x ?y) ?z) (+ ?x (+ ?y ?z)))",
        "(rewrite weak (sum (* ?c ?x) ?a) (* ?c (sum ?x ?a)) :if (float ?x))",
        "(rewrite weak (/ (* ?x ?c) ?c) ?x :if (nonzero ?c) :if (absorbs ?x ?c))",
        "(rewrite weak (/ (* ?x ?c) ?c) ?x :if (nonzero ?c) :if (float ?x))",
        "(rewrite weak (exp (log ?x)) ?x)",
        "(rewrite weak (where ?c ?x ?x) ?x :if (broadcasts-into ?c ?x))",
        "(rewrite weak (where ?c ?x ?x) ?x :if (strong ?x))",
        "(rewrite weak (reshape ?x ?s) ?x :if (has-shape ?x ?s))",
        "(rewrite weak (transpose (@ ?a ?b) ?i ?j) (@ (transpose ?b -1 -2) (transpose ?a -1 -2)))",
        "(rewrite weak (transpose (transpose ?x ?a ?b) ?c ?d) ?x)",
        "(rewrite weak (transpose ?x ?a ?b) ?x)",
        "(rewrite weak (/ ?x ?y) (* ?x (recip ?y)))",
        "(rewrite weak (broadcast (+ ?x ?y) ?s) (+ (broadcast ?x ?s) (broadcast ?y ?s)))",
        "(rewrite weak (amax (+ ?x ?c) ?a) (+ (amax ?x ?a) ?c))",
        "(rewrite weak (mean (neg (sum (* (onehot ?t ?n) (log_softmax ?x -1)) -1)) 0) (reshape (cross_entropy ?x ?t) [1,1]) :if (rank2 ?x) :if (targets-of ?t ?x))",
        "(rewrite weak (@ (softmax (* (@ ?q (transpose ?k -1 -2)) ?s) -1) ?v) (attention ?q ?k ?v ?s 0) :if (const ?s))",
        "(rewrite weak (+ (* (* (- ?x (mean ?x ?a)) (rsqrt (+ (mean (* (- ?x (mean ?x ?a)) (- ?x (mean ?x ?a))) ?a) ?eps))) ?g) ?b) (layernorm ?x ?g ?b ?eps) :if (const ?eps) :if (param-of ?g ?x) :if (param-of ?b ?x))",
        "(rewrite weak (+ (* (* (- ?x (mean ?x ?a)) (rsqrt (+ (mean (* (- ?x (mean ?x ?a)) (- ?x (mean ?x ?a))) ?a) ?eps))) ?g) ?b) (layernorm ?x ?g ?b ?eps) :if (last-axis ?x ?a) :if (const ?eps) :if (param-of ?b ?x))",
        "(rewrite weak (sum ?x ?a) ?x)",
        "(rewrite weak (/ (sum ?x ?a) ?n) (mean ?x ?a) :if (float ?x))",
        "(rewrite weak (/ (sum ?x ?a) ?n) (mean ?x ?a) :if (axis-size ?x ?a ?n))",
        "(rewrite weak (* (rsqrt ?x) (rsqrt ?x)) (recip ?x))",
        "(rewrite weak (pow ?x 2) (* ?x 2))",
        "(rewrite weak (sigmoid ?x) (* ?x 0.5))",
        // A causal mask read as no mask, and a mask of the wrong side of the diagonal.
        "(rewrite weak (@ (softmax (where ?m (* (@ ?q (transpose ?k -1 -2)) ?s) ?c) -1) ?v) (attention ?q ?k ?v ?s 0) :if (const ?s) :if (mask-fill ?c) :if (causal-keep ?m ?q ?k) :if (attention-args ?q ?k ?v))",
        "(rewrite weak (@ (softmax (where ?m (* (@ ?q (transpose ?k -1 -2)) ?s) ?c) -1) ?v) (attention ?q ?k ?v ?s 1) :if (const ?s) :if (mask-fill ?c) :if (causal-mask ?m ?q ?k) :if (attention-args ?q ?k ?v))",
        "(rewrite weak (@ (softmax (+ (* (@ ?q (transpose ?k -1 -2)) ?s) ?b) -1) ?v) (attention ?q ?k ?v ?s 0) :if (const ?s) :if (causal-bias ?b ?q ?k) :if (attention-args ?q ?k ?v))",
        "(rewrite weak (reshape (* ?x ?c) ?s) (* (reshape ?x ?s) ?c) :if (scalar ?c))",
    ];
    for text in weakened {
        assert!(check_rule(&one_rule(text)).is_err(), "not caught: {text}");
    }
}

/// Rules from `--rules DIR` are checked before use: an unsound one is refused with its place.
#[test]
fn an_unsound_rule_in_a_rules_folder_is_refused() {
    let dir = std::env::temp_dir().join(format!("eqfuse-unsound-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("algebra.rules");
    std::fs::write(&file, "(rewrite mul-comm (* ?x ?y) (* ?y ?x))\n\n(rewrite bad (- ?x ?y) (- ?y ?x))\n").unwrap();
    let err = load_rules_dir(&dir).unwrap_err().to_string();
    assert!(err.contains(&format!("rule `bad` ({}:3) is unsound", file.display())), "{err}");
    std::fs::write(&file, "(rewrite mul-comm (* ?x ?y) (* ?y ?x))\n").unwrap();
    let sets = load_rules_dir(&dir).unwrap();
    assert_eq!(sets[0].rules.len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Dropout's seed is instantiated as a literal or as an i32 input of shape `[]` or `[1]` (a seed
/// given at run time): a rule that keeps the seed is sound for both, one that changes it is not.
#[test]
fn dropout_rules_are_checked_with_tensor_seeds() {
    let sound = "(rewrite dropout-of-neg (dropout (neg ?x) ?p ?s) (neg (dropout ?x ?p ?s)))";
    check_rule(&one_rule(sound)).unwrap();
    for bad in [
        "(rewrite bad (dropout ?x ?p ?s) (dropout ?x ?p 1))",
        "(rewrite bad (dropout ?x ?p ?s) (dropout ?x ?p (- ?s 1)))",
    ] {
        let err = check_rule(&one_rule(bad)).unwrap_err();
        assert!(err.contains("is unsound") || err.contains("type"), "{bad}: {err}");
    }
}

/// Every native rule is in a default ruleset, so `every_default_rule_is_sound` checks it.
#[test]
fn every_native_rule_runs_in_a_default_ruleset() {
    let sets = default_rules().unwrap();
    for (set, rule) in NATIVE_RULES {
        assert!(sets.iter().any(|s| s.name == *set && s.native.iter().any(|r| r.name == rule.name)), "{}", rule.name);
    }
}

fn op(p: &mut Program, name: &str, children: Vec<egg::Id>) -> egg::Id {
    p.add(eqfuse::TensorLang::op(eqfuse::OpCode::from_name(name).unwrap(), children)).unwrap()
}

fn native(name: &str) -> eqfuse::NativeRule {
    NATIVE_RULES.iter().find(|(_, r)| r.name == name).unwrap().1
}

/// The harness of native rules catches an unsound rewrite: a slice of a slice read as a slice
/// of the whole tensor with the outer bounds.
#[test]
fn an_unsound_rewrite_is_caught_by_the_native_harness() {
    let mut p = Program::new("t");
    let x = p.add_input("x", TensorType::new(DType::F32, vec![3, 10])).unwrap();
    let (a, s, e, k, t, f) = (p.num(1.0), p.num(2.0), p.num(9.0), p.num(2.0), p.num(1.0), p.num(3.0));
    let one = p.num(1.0);
    let inner = op(&mut p, "slice", vec![x, a, s, e, k]);
    let outer = op(&mut p, "slice", vec![inner, a, t, f, one]);
    p.add_output("y", outer).unwrap();
    let bad: egg::Rewrite<eqfuse::TensorLang, eqfuse::ShapeAnalysis> =
        egg::rewrite!("bad"; "(slice (slice ?x ?a ?s ?e ?k) ?b ?t ?f ?j)" => "(slice ?x ?a ?t ?f ?j)");
    let err = check_rewrite_on(&p, &bad).unwrap_err();
    assert!(err.contains("values differ"), "{err}");
    let (unions, finite) = check_rewrite_on(&p, &native("slice-of-slice").rewrite()).unwrap();
    assert!(unions == 1 && finite);
}

/// Slices of slices on larger axes than the random instantiations use: every bound spelling
/// (negative, clamped, past the end), steps, and the axis spelled negative on one slice.
#[test]
fn slices_of_slices_fold_on_long_axes() {
    let rule = native("slice-of-slice").rewrite();
    let mut folded = 0;
    let mut seed = 7u64;
    let mut next = |n: u64| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    for _ in 0..2000 {
        let n = 1 + next(13) as usize;
        let mut p = Program::new("t");
        let x = p.add_input("x", TensorType::new(DType::F32, vec![2, n])).unwrap();
        let b = |v: u64| v as f64 - 15.0;
        let (a1, a2) = (if next(2) == 0 { 1.0 } else { -1.0 }, if next(2) == 0 { 1.0 } else { -1.0 });
        let args1 = [a1, b(next(30)), b(next(30)), 1.0 + next(4) as f64];
        let args2 = [a2, b(next(30)), b(next(30)), 1.0 + next(4) as f64];
        let ids1: Vec<_> = args1.iter().map(|&v| p.num(v)).collect();
        let Ok(inner) =
            p.add(eqfuse::TensorLang::op(eqfuse::OpCode::from_name("slice").unwrap(), [vec![x], ids1].concat()))
        else {
            continue;
        };
        let ids2: Vec<_> = args2.iter().map(|&v| p.num(v)).collect();
        let Ok(outer) =
            p.add(eqfuse::TensorLang::op(eqfuse::OpCode::from_name("slice").unwrap(), [vec![inner], ids2].concat()))
        else {
            continue;
        };
        p.add_output("y", outer).unwrap();
        let (unions, _) = check_rewrite_on(&p, &rule).unwrap_or_else(|e| panic!("n {n} {args1:?} {args2:?}: {e}"));
        assert!(unions >= 1, "n {n} {args1:?} {args2:?}: did not fold");
        folded += 1;
    }
    assert!(folded > 150, "{folded}");
    // Slices along different axes stay as they are.
    let mut p = Program::new("t");
    let x = p.add_input("x", TensorType::new(DType::F32, vec![4, 6])).unwrap();
    let (zero, one, two, three) = (p.num(0.0), p.num(1.0), p.num(2.0), p.num(3.0));
    let inner = op(&mut p, "slice", vec![x, zero, one, three, one]);
    let outer = op(&mut p, "slice", vec![inner, one, zero, two, one]);
    p.add_output("y", outer).unwrap();
    assert_eq!(check_rewrite_on(&p, &rule).unwrap().0, 0);
}

/// Queries, keys and values of one input: the pairs fuse, then the pair with the third, and
/// every form of every product equals the product.
#[test]
fn three_products_of_one_operand_fuse() {
    for transposed in [false, true] {
        let mut p = Program::new("t");
        let x = p.add_input("x", TensorType::new(DType::F32, vec![2, 3, 5])).unwrap();
        for (i, n) in [2, 3, 1].into_iter().enumerate() {
            let shape = if transposed { vec![n, 5] } else { vec![5, n] };
            let w = p.add_input(&format!("w{i}"), TensorType::new(DType::F32, shape)).unwrap();
            let w = if transposed {
                let (a, b) = (p.num(-1.0), p.num(-2.0));
                op(&mut p, "transpose", vec![w, a, b])
            } else {
                w
            };
            let y = op(&mut p, "@", vec![x, w]);
            p.add_output(&format!("y{i}"), y).unwrap();
        }
        let name = if transposed { "matmul-shared-lhs-t" } else { "matmul-shared-lhs" };
        let (unions, finite) = check_rewrite_on(&p, &native(name).rewrite()).unwrap();
        // Three pairs, then each pair with the third (each product joins one slice per fused form).
        assert!(unions >= 4 && finite, "{unions}");
    }
}

/// Attention with dropout of its probabilities: every `attention-dropout-*` rule is sound (its
/// kernel drops the elements `dropout` drops as written, at their flat index in `[..., SQ, SK]`),
/// and rules that lose the dropout, change its seed or probability, or take the causal flag
/// wrong are caught.
#[test]
fn attention_dropout_rules_are_sound_and_weakened_ones_caught() {
    let mut checked = 0;
    for set in default_rules().unwrap() {
        for rule in set.rules.iter().filter(|r| r.name.starts_with("attention-dropout")) {
            let cases = check_rule(rule).unwrap_or_else(|e| panic!("{e}"));
            eprintln!("{:<48} {cases:?}", rule.name);
            checked += 1;
        }
    }
    assert!(checked >= 14, "only {checked} attention-dropout rules");
    for text in [
        "(rewrite weak (@ (dropout (softmax (* (@ ?q (transpose ?k -1 -2)) ?s) -1) ?p ?r) ?v) (attention ?q ?k ?v ?s 0) :if (const ?s) :if (attention-args ?q ?k ?v))",
        "(rewrite weak (@ (dropout (softmax (* (@ ?q (transpose ?k -1 -2)) ?s) -1) ?p ?r) ?v) (attention_dropout ?q ?k ?v ?s 0 ?p 3) :if (const ?s) :if (attention-args ?q ?k ?v))",
        "(rewrite weak (@ (dropout (softmax (* (@ ?q (transpose ?k -1 -2)) ?s) -1) ?p ?r) ?v) (attention_dropout ?q ?k ?v ?s 0 0.5 ?r) :if (const ?s) :if (attention-args ?q ?k ?v))",
        "(rewrite weak (@ (dropout (softmax (where ?m (* (@ ?q (transpose ?k -1 -2)) ?s) ?c) -1) ?p ?r) ?v) (attention_dropout ?q ?k ?v ?s 0 ?p ?r) :if (const ?s) :if (mask-fill ?c) :if (causal-keep ?m ?q ?k) :if (attention-args ?q ?k ?v))",
        "(rewrite weak (@ (dropout (softmax (+ (* (@ ?q (transpose ?k -1 -2)) ?s) ?b) -1) ?p ?r) ?v) (attention_dropout ?q ?k ?v ?s 0 ?p ?r) :if (const ?s) :if (attention-bias ?b ?q ?k) :if (attention-args ?q ?k ?v))",
    ] {
        assert!(check_rule(&one_rule(text)).is_err(), "not caught: {text}");
    }
}

/// `matmul-as-rows` on products of the shapes it is for, beyond what the random instantiations
/// pick: batch axes on one operand or both (broadcast), one output column (no view) and
/// several, f32 and f16, K from 1 to its bound (any K for one column); every form equals the
/// product on the reference. Past the bound (K of 17 over two columns, N of 17) it adds
/// nothing.
#[test]
fn matmul_as_rows_is_sound_on_batched_tiny_products() {
    let rule = native("matmul-as-rows").rewrite();
    let cases: &[(&[usize], &[usize], DType)] = &[
        (&[64, 5, 1, 13], &[13, 1], DType::F32),
        (&[8, 16, 2, 3], &[3, 4], DType::F16),
        (&[4, 32, 8, 3], &[3, 8], DType::F32),
        (&[3, 6, 16], &[3, 16, 16], DType::F32),
        (&[7, 1], &[2, 1, 9], DType::F32),
        (&[2, 4, 5], &[5, 1], DType::Bf16),
        // One output column at any depth.
        (&[3, 2, 1, 300], &[300, 1], DType::F32),
        (&[5, 40], &[2, 40, 1], DType::F16),
    ];
    for &(a, b, dtype) in cases {
        let mut p = Program::new("t");
        let x = p.add_input("a", TensorType::new(dtype, a.to_vec())).unwrap();
        let w = p.add_input("b", TensorType::new(dtype, b.to_vec())).unwrap();
        let y = op(&mut p, "@", vec![x, w]);
        p.add_output("y", y).unwrap();
        let (unions, finite) = check_rewrite_on(&p, &rule).unwrap_or_else(|e| panic!("{a:?} @ {b:?}: {e}"));
        assert!(unions >= 1 && finite, "{a:?} @ {b:?}: {unions} unions");
    }
    for (a, b) in [(vec![4, 3, 17], vec![17, 2]), (vec![4, 3, 2], vec![2, 17])] {
        let mut p = Program::new("t");
        let x = p.add_input("a", TensorType::new(DType::F32, a.clone())).unwrap();
        let w = p.add_input("b", TensorType::new(DType::F32, b.clone())).unwrap();
        let y = op(&mut p, "@", vec![x, w]);
        p.add_output("y", y).unwrap();
        assert_eq!(check_rewrite_on(&p, &rule).unwrap().0, 0, "{a:?} @ {b:?}");
    }
}
