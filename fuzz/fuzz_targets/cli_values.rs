//! `linkerd install-cni`'s values: `--set` and `--set-string` expressions through the real
//! argument parser and renderer, or a values file's YAML through the same checks.
//!
//! Input: a mode byte, then NUL-separated parts. Even mode: each part is a flag's expression,
//! its first byte choosing `--set` (even) or `--set-string` (odd). Odd mode: the rest is a
//! values file. (`--set-file` and `--values` read files: the fuzzer never names one.)
//!
//! Properties: nothing panics or overflows the stack, whatever the keys' depth or the list
//! indexes; what renders is YAML that parses back into documents.

#![no_main]

use clap::{Args, FromArgMatches};
use libfuzzer_sys::fuzz_target;
use linkerd_cli::{
    chart,
    install_cni::{self, InstallCniArgs},
    manifest,
    values::{self, Origins},
};

/// The release namespace (`--cni-namespace`'s default).
const NAMESPACE: &str = "linkerd-cni";

fn check_rendered(manifests: &str) {
    manifest::parse_documents(manifests).expect("the rendered manifests are YAML");
}

fn flags(parts: &[&[u8]]) {
    let mut argv = vec!["install-cni".to_string()];
    for part in parts {
        let Some((kind, expr)) = part.split_first() else {
            continue;
        };
        argv.push(
            if kind % 2 == 0 {
                "--set"
            } else {
                "--set-string"
            }
            .into(),
        );
        argv.push(String::from_utf8_lossy(expr).into_owned());
    }
    let command = InstallCniArgs::augment_args(clap::Command::new("install-cni"));
    let Ok(matches) = command.try_get_matches_from(argv) else {
        return;
    };
    let Ok(args) = InstallCniArgs::from_arg_matches(&matches) else {
        return;
    };
    if let Ok(rendered) = install_cni::render(&args, &matches, NAMESPACE) {
        check_rendered(&rendered.manifests);
    }
}

fn values_file(text: &[u8]) {
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let Ok(overrides) = values::parse_yaml(text, "fuzz") else {
        return;
    };
    let Ok(defaults) = values::chart_defaults() else {
        panic!("the chart's defaults parse");
    };
    let mut merged = defaults.clone();
    let mut origins = Origins::default();
    origins.record_tree(&overrides, "values file fuzz");
    values::coalesce(&mut merged, overrides);
    values::drop_unknown(&mut merged, &defaults);
    if values::validate(&merged, &origins).is_ok() {
        if let Ok(manifests) = chart::render(&merged, NAMESPACE) {
            check_rendered(&manifests);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        let parts: Vec<&[u8]> = rest.split(|b| *b == 0).take(16).collect();
        flags(&parts);
    } else {
        values_file(rest);
    }
});
