//! Points the coexistence tests at the stand-in tenant's eBPF object (`linkerd-cni-ebpf-tenant`,
//! built with the agent's object by `linkerd-cni-ebpf-build`, never shipped), which they embed.

use std::path::Path;

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let workspace = Path::new(&manifest)
        .parent()
        .expect("tests/ lives in the workspace root");
    for path in linkerd_cni_ebpf_build::source_paths(workspace) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rerun-if-env-changed=LINKERD_CNI_EBPF_OBJECT");
    // Next to a prebuilt agent object, else built here (a no-op when it is up to date).
    let object = match std::env::var("LINKERD_CNI_EBPF_OBJECT") {
        Ok(path) => Path::new(&path).into(),
        Err(_) => match linkerd_cni_ebpf_build::build(workspace) {
            Ok(path) => path,
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        },
    };
    let tenant = object.with_file_name(linkerd_cni_ebpf_build::TENANT_OBJECT);
    println!("cargo:rerun-if-changed={}", tenant.display());
    println!(
        "cargo:rustc-env=LINKERD_CNI_TENANT_OBJECT={}",
        tenant.display()
    );
}
