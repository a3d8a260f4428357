//! Rule soundness: every rule of every default ruleset, checked on random instantiations by
//! the library's checker (`eqfuse::check_rule`, which also checks rules loaded with `--rules`),
//! and the checker itself shown to catch unsound, type-changing and weakened rules.

use eqfuse::{check_rule, default_rules, load_rules_dir, parse_ruleset, Rule};

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
