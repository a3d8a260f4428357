//! Prints a generated stack program: `cargo run --example gen_stack -- N` gives N residual
//! blocks (layernorm + elementwise MLP tail); `-- N transformer [backward]` gives N pre-norm
//! transformer blocks (batch 2, sequence 512), with `backward` their joint forward and backward.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = match args.first().map(|a| a.parse()) {
        Some(Ok(n)) if n > 0 => n,
        _ => {
            eprintln!("usage: gen_stack N [transformer [backward]]");
            std::process::exit(1);
        }
    };
    match args.get(1).map(String::as_str) {
        None => print!("{}", eqfuse::residual_stack_eqf(n, 4096, 1024)),
        Some("transformer") => {
            print!("{}", eqfuse::transformer_stack_eqf(n, 2, 512, args.get(2).is_some_and(|a| a == "backward")))
        }
        Some(other) => {
            eprintln!("gen_stack: unknown kind `{other}` (expected `transformer`)");
            std::process::exit(1);
        }
    }
}
