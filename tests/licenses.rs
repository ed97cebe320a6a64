//! `saguin --licenses` (B-564): the licences of the code compiled into the binary,
//! embedded in it and generated from the packages that actually reach it.
//!
//! The packages are what `cargo tree` says reaches the binary on each target it
//! ships for (normal dependencies; no procedural macros, build scripts or tests),
//! their licence files come from where `cargo metadata` says each package's sources
//! are. `src/licenses/bundled.rs` must be exactly what that gives; after a change to
//! Cargo.lock, `SAGUIN_BLESS=1 cargo test --test licenses` writes it again.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The targets binaries are built for, each as `src/licenses.rs` names its own: the
/// `std::env::consts::ARCH` and the C library, which decide what is linked in (the
/// static musl builds carry mimalloc, the glibc ones do not).
const TARGETS: &[(&str, &str)] = &[
    ("x86_64-unknown-linux-gnu", "x86_64-gnu"),
    ("x86_64-unknown-linux-musl", "x86_64-musl"),
    ("armv7-unknown-linux-gnueabihf", "arm-gnu"),
    ("armv7-unknown-linux-musleabihf", "arm-musl"),
    ("aarch64-unknown-linux-gnu", "aarch64-gnu"),
    ("aarch64-unknown-linux-musl", "aarch64-musl"),
];

const GENERATED: &str = "src/licenses/bundled.rs";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn cargo(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("cargo prints UTF-8")
}

/// (name, version) -> the targets whose binaries contain the package.
fn packages_in_binaries() -> BTreeMap<(String, String), BTreeSet<&'static str>> {
    let mut found: BTreeMap<(String, String), BTreeSet<&'static str>> = BTreeMap::new();
    for (triple, target) in TARGETS {
        let tree = cargo(&[
            "tree",
            "--locked",
            "-e",
            "normal,no-proc-macro",
            "--target",
            triple,
            "--prefix",
            "none",
            "-f",
            "{p}",
        ]);
        for line in tree.lines() {
            let mut words = line.split_whitespace();
            let (Some(name), Some(version)) = (words.next(), words.next()) else {
                continue;
            };
            // Sagüin itself. A vendored dependency (vendor/) is named by its path too,
            // and is listed like any other.
            if name == "saguin" {
                continue;
            }
            let version = version.trim_start_matches('v').to_owned();
            found
                .entry((name.to_owned(), version))
                .or_default()
                .insert(target);
        }
    }
    found
}

/// (name, version) -> (declared licence, directory of its sources).
fn metadata() -> BTreeMap<(String, String), (String, PathBuf)> {
    let mut args = vec!["metadata", "--format-version", "1", "--locked"];
    for (target, _) in TARGETS {
        args.extend(["--filter-platform", target]);
    }
    let json: serde_json::Value = serde_json::from_str(&cargo(&args)).expect("cargo metadata JSON");
    let mut out = BTreeMap::new();
    for p in json["packages"].as_array().expect("packages") {
        let field = |k: &str| p[k].as_str().unwrap_or_default().to_owned();
        let dir = Path::new(&field("manifest_path"))
            .parent()
            .expect("a manifest has a directory")
            .to_path_buf();
        out.insert((field("name"), field("version")), (field("license"), dir));
    }
    out
}

fn is_licence_file(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["LICEN", "COPYING", "NOTICE", "UNLICENSE", "COPYRIGHT"]
        .iter()
        .any(|p| upper.starts_with(p))
}

/// Where a declaration offers MIT among alternatives, MIT is taken and the
/// alternatives' own texts are left out; every other file (NOTICE, third-party
/// licences) stays.
fn chosen_files(declared: &str, files: Vec<String>) -> (Option<&'static str>, Vec<String>) {
    let alternatives: Vec<&str> = declared
        .split(" OR ")
        .flat_map(|a| a.split('/'))
        .map(|a| a.trim_matches(|c| c == '(' || c == ')' || c == ' '))
        .collect();
    let has_mit_file = files.iter().any(|f| f.to_ascii_uppercase().contains("MIT"));
    if alternatives.len() < 2 || !alternatives.contains(&"MIT") || !has_mit_file {
        return (None, files);
    }
    let kept = files
        .into_iter()
        .filter(|f| {
            let upper = f.to_ascii_uppercase();
            !["APACHE", "UNLICENSE", "BSL", "ZLIB"]
                .iter()
                .any(|other| upper.contains(other))
        })
        .collect();
    (Some("MIT"), kept)
}

fn normalized(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn raw_string(body: &str) -> String {
    let mut hashes = String::from("#");
    while body.contains(&format!("\"{hashes}")) {
        hashes.push('#');
    }
    format!("r{hashes}\"{body}\"{hashes}")
}

fn generate() -> String {
    let packages = packages_in_binaries();
    let meta = metadata();
    let mut texts: Vec<(String, String)> = Vec::new(); // (from, body)
    let mut by_content: BTreeMap<String, usize> = BTreeMap::new();
    let mut entries = String::new();
    for ((name, version), targets) in &packages {
        let (declared, dir) = meta
            .get(&(name.clone(), version.clone()))
            .unwrap_or_else(|| panic!("cargo metadata does not know {name} {version}"));
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|f| is_licence_file(f))
            .collect();
        files.sort();
        let (chosen, files) = chosen_files(declared, files);
        assert!(
            !files.is_empty(),
            "{name} {version} ships no licence file: its text must be added by hand"
        );
        let mut indices = Vec::new();
        for file in files {
            let body = std::fs::read_to_string(dir.join(&file))
                .unwrap_or_else(|e| panic!("{name} {version} {file}: {e}"));
            let body = body.trim_end().to_owned();
            let index = *by_content.entry(normalized(&body)).or_insert_with(|| {
                texts.push((format!("{name} {version}, {file}"), body));
                texts.len() - 1
            });
            indices.push(index.to_string());
        }
        let targets: Vec<String> = targets.iter().map(|t| format!("{t:?}")).collect();
        let chosen = match chosen {
            Some(c) => format!("Some({c:?})"),
            None => "None".to_owned(),
        };
        entries.push_str(&format!(
            "    Package {{ name: {name:?}, version: {version:?}, declared: {declared:?}, chosen: {chosen}, targets: &[{}], texts: &[{}] }},\n",
            targets.join(", "),
            indices.join(", ")
        ));
    }
    let mut out = String::from(
        "// Generated by tests/licenses.rs from Cargo.lock; do not edit.\n\
         // After a dependency changes: SAGUIN_BLESS=1 cargo test --test licenses\n\n\
         use super::{Package, Text};\n\n\
         pub(super) const PACKAGES: &[Package] = &[\n",
    );
    out.push_str(&entries);
    out.push_str("];\n\npub(super) const TEXTS: &[Text] = &[\n");
    for (from, body) in &texts {
        out.push_str(&format!(
            "    Text {{ from: {from:?}, body: {} }},\n",
            raw_string(body)
        ));
    }
    out.push_str("];\n");
    out
}

#[test]
fn the_embedded_licences_are_those_of_the_packages_in_the_binaries() {
    let want = generate();
    let path = root().join(GENERATED);
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have == want {
        return;
    }
    if std::env::var_os("SAGUIN_BLESS").is_some() {
        std::fs::write(&path, &want).expect("writes the generated file");
        eprintln!("wrote {}", path.display());
        return;
    }
    let lines = |s: &str| -> BTreeSet<String> {
        s.lines()
            .filter(|l| l.trim_start().starts_with("Package {"))
            .map(str::to_owned)
            .collect()
    };
    let (want_p, have_p) = (lines(&want), lines(&have));
    panic!(
        "{GENERATED} is not what Cargo.lock gives; run `SAGUIN_BLESS=1 cargo test --test licenses`.\n\
         missing: {:#?}\nstale: {:#?}",
        want_p.difference(&have_p).collect::<Vec<_>>(),
        have_p.difference(&want_p).collect::<Vec<_>>()
    );
}

#[test]
fn licenses_prints_them_without_reading_any_configuration() {
    // B-564: exits before any configuration is read, even one that does not exist.
    let out = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .args(["--licenses", "--config", "/nonexistent/saguin.yaml"])
        .output()
        .expect("saguin --licenses runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    for package in [
        "rustls",
        "ring",
        "rusqlite",
        "smol",
        "tungstenite",
        "serde-saphyr",
    ] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&format!("{package} "))),
            "{package} is not listed:\n{}",
            text.chars().take(4000).collect::<String>()
        );
    }
    assert!(text.contains("SQLite"), "SQLite's dedication is missing");
    assert!(
        text.contains("Permission is hereby granted"),
        "the MIT text is missing"
    );
    assert!(
        text.contains("Apache License"),
        "the Apache text is missing"
    );
}
