//! Fuzzing both front ends: `parse_program` and `program_from_json` must answer every input with
//! a program or an error, never a panic (DESIGN.md §1: user input never panics the program).
//!
//! Inputs are mutations of the example programs and test cases (character flips, token deletions,
//! duplications, swaps and insertions, line shuffles), token soup, randomly generated programs,
//! and mutations of the JSON graphs of valid programs, textual and structural. The generator is a
//! fixed-seed xorshift, so a failure reproduces; each panic is reported with its input.

mod fuzzing;

use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use eqfuse::{parse_program, program_from_json, program_to_json};
use fuzzing::*;
use serde_json::Value;

/// Runs `f`, returning the panic message if it panicked.
fn panics(f: impl FnOnce()) -> Option<String> {
    panic::catch_unwind(AssertUnwindSafe(f)).err().map(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

struct Tally {
    tested: usize,
    /// Inputs that gave a program: a fuzzer whose inputs all fail early tests little.
    accepted: usize,
    failures: Vec<String>,
}

impl Tally {
    fn eqf(&mut self, text: &str, overrides: &[(String, usize)]) {
        self.tested += 1;
        let mut ok = false;
        if let Some(m) = panics(|| ok = parse_program("fuzz.eqf", text, overrides).is_ok()) {
            self.failures.push(format!("parse_program panicked: {m}\ninput: {text:?} with {overrides:?}"));
        }
        self.accepted += usize::from(ok);
    }
    fn json(&mut self, text: &str) {
        self.tested += 1;
        let mut ok = false;
        if let Some(m) = panics(|| ok = program_from_json("fuzz.json", text).is_ok()) {
            self.failures.push(format!("program_from_json panicked: {m}\ninput: {text}"));
        }
        self.accepted += usize::from(ok);
    }
}

#[test]
fn front_ends_never_panic() {
    // Silence the default hook (each caught panic would print a backtrace); keep the messages.
    let messages = Arc::new(Mutex::new(0usize));
    let seen = messages.clone();
    let previous = panic::take_hook();
    panic::set_hook(Box::new(move |_| *seen.lock().unwrap() += 1));

    let start = std::time::Instant::now();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let pool = token_pool();
    let texts = corpus();
    let mut t = Tally { tested: 0, accepted: 0, failures: vec![] };
    for _ in 0..9000 {
        let base = rng.pick(&texts).clone();
        let mutated = match rng.below(3) {
            0 => mutate_chars(&mut rng, &base),
            1 => mutate_tokens(&mut rng, &base, &pool),
            _ => mutate_lines(&mut rng, &base),
        };
        t.eqf(&mutated, &random_overrides(&mut rng));
    }
    for _ in 0..2000 {
        t.eqf(&token_soup(&mut rng, &pool), &[]);
    }
    for _ in 0..4000 {
        t.eqf(&random_program(&mut rng), &random_overrides(&mut rng));
    }
    let graphs: Vec<Value> =
        texts.iter().filter_map(|s| parse_program("c.eqf", s, &[]).ok()).map(|p| program_to_json(&p)).collect();
    assert!(graphs.len() >= 20, "the corpus has valid programs to mutate");
    for _ in 0..4000 {
        let mut g = rng.pick(&graphs).clone();
        if rng.chance(50) {
            for _ in 0..=rng.below(2) {
                mutate_graph(&mut rng, &mut g, &pool);
            }
            t.json(&g.to_string());
        } else {
            let text = g.to_string();
            let mutated =
                if rng.chance(50) { mutate_chars(&mut rng, &text) } else { mutate_tokens(&mut rng, &text, &pool) };
            t.json(&mutated);
        }
    }

    panic::set_hook(previous);
    println!(
        "fuzzed {} inputs in {:.1?}: {} accepted, {} panics",
        t.tested,
        start.elapsed(),
        t.accepted,
        t.failures.len()
    );
    assert!(t.accepted * 20 > t.tested, "too few fuzz inputs are valid programs to reach the type checker");
    let shown: Vec<&String> = t.failures.iter().take(5).collect();
    assert!(t.failures.is_empty(), "{} of {} inputs panicked, e.g.:\n{shown:#?}", t.failures.len(), t.tested);
    assert_eq!(*messages.lock().unwrap(), 0);
}
