//! `linkerd-cni-test-proxy`: forwards every accepted connection to its `SO_ORIGINAL_DST`, like
//! linkerd2-proxy, and logs each connection as a JSON line (see `linkerd_cni_tests::proxy`).

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let opts = linkerd_cni_tests::proxy::Options::parse();
    linkerd_cni_tests::proxy::serve(&opts)?;
    Ok(())
}
