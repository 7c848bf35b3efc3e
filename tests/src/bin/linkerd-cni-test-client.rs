//! `linkerd-cni-test-client`: connects (TCP) or sends (UDP) like a pod's application and prints
//! one JSON report of what the kernel said (see `linkerd_cni_tests::client`); with
//! `--validator-exit-codes`, exits as linkerd-network-validator does (0 passed, 95 failed).

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let opts = linkerd_cni_tests::client::Options::parse();
    let report = linkerd_cni_tests::client::execute(&opts);
    println!("{}", serde_json::to_string(&report)?);
    if opts.validator_exit_codes {
        std::process::exit(report.validator_exit_code());
    }
    Ok(())
}
