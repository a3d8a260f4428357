fn main() {
    let n: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    print!("{}", eqfuse::residual_stack_eqf(n, 4096, 1024));
}
