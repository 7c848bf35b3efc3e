//! `linkerd-cni-test-client`: connects (TCP) or sends (UDP) like a pod's application and prints
//! one JSON report of what the kernel said (see `linkerd_cni_tests::client`).

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let opts = linkerd_cni_tests::client::Options::parse();
    let report = linkerd_cni_tests::client::execute(&opts);
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
