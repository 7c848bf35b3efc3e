//! Prints the running kernel's answer to each feature probe and the verdict the agent and
//! `linkerd check --node` give; exits 1 unless every feature is present. A dependency-free
//! static binary for a bare guest: `cargo run -p linkerd-cni-sys --example
//! probe`.

use linkerd_cni_sys::probe::Findings;

fn main() {
    let start = std::time::Instant::now();
    let findings = Findings::probe();
    let took = start.elapsed();
    for (feature, answer) in &findings.answers {
        println!("{}: {answer:?}", feature.name);
    }
    println!("probes took {took:?}");
    match findings.verdict() {
        Ok(line) => println!("{line}"),
        Err(line) => {
            println!("{line}");
            std::process::exit(1);
        }
    }
}
