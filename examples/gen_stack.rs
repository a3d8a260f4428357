//! Prints a generated program: `cargo run --example gen_stack -- N` gives N residual blocks
//! (layernorm + elementwise MLP tail); `-- N transformer [backward]` gives N pre-norm transformer
//! blocks (batch 2, sequence 512), with `backward` their joint forward and backward; `-- N gpt2`
//! a GPT-2-like training step of N blocks (batch 8, sequence 1024); `-- N chain [f,g,...]` a
//! chain of N bindings with skip connections (4096x1024, the functions cycled through).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = match args.first().map(|a| a.parse()) {
        Some(Ok(n)) if n > 0 => n,
        _ => {
            eprintln!("usage: gen_stack N [transformer [backward] | gpt2 | chain [f,g,...]]");
            std::process::exit(1);
        }
    };
    match args.get(1).map(String::as_str) {
        None => print!("{}", eqfuse::residual_stack_eqf(n, 4096, 1024)),
        Some("transformer") => {
            print!("{}", eqfuse::transformer_stack_eqf(n, 2, 512, args.get(2).is_some_and(|a| a == "backward")))
        }
        Some("gpt2") => print!("{}", eqfuse::gpt2_train_eqf(n, 8, 1024)),
        Some("chain") => {
            let functions: Vec<&str> = args.get(2).map_or(vec![], |f| f.split(',').collect());
            print!("{}", eqfuse::skip_chain_eqf(n, 4096, 1024, &functions))
        }
        Some(other) => {
            eprintln!("gen_stack: unknown kind `{other}` (expected `transformer`, `gpt2` or `chain`)");
            std::process::exit(1);
        }
    }
}
