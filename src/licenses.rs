//! The licences of the code compiled into the binary: `saguin --licenses` (B-564).
//!
//! Sagüin ships as one file, so the answer to "whose code is this" travels inside it.
//! `bundled.rs` is generated from Cargo.lock by `tests/licenses.rs`, which fails when
//! the two disagree, for the packages that reach the binary on each target it
//! ships for: normal dependencies, not build scripts, procedural macros or tests.

use std::io::{self, Write};

#[rustfmt::skip]
mod bundled;

/// A package whose code is compiled into the binary.
struct Package {
    name: &'static str,
    version: &'static str,
    /// The licence as the package declares it (an SPDX expression).
    declared: &'static str,
    /// Where the declaration offers a choice that includes MIT, the one Sagüin takes.
    chosen: Option<&'static str>,
    /// The targets whose binaries contain it, named as [`this_target`] names one.
    targets: &'static [&'static str],
    /// Indices into `TEXTS` of the licence files it ships.
    texts: &'static [usize],
}

/// One licence file, shared by every package that ships the same text.
struct Text {
    /// The first package and file it was read from.
    from: &'static str,
    body: &'static str,
}

/// This binary's architecture and C library ("arm-musl"): together they decide what
/// is linked in - the static musl builds carry mimalloc, the glibc ones do not.
fn this_target() -> String {
    let libc = if cfg!(target_env = "musl") {
        "musl"
    } else {
        "gnu"
    };
    format!("{}-{libc}", std::env::consts::ARCH)
}

fn in_this_binary(package: &Package, target: &str) -> bool {
    package.targets.contains(&target)
}

/// Writes the list of packages in this binary, then each licence text they ship once.
pub fn write(out: &mut impl Write) -> io::Result<()> {
    let target = this_target();
    let packages: Vec<&Package> = bundled::PACKAGES
        .iter()
        .filter(|p| in_this_binary(p, &target))
        .collect();
    writeln!(
        out,
        "saguin {} ({target}) is Apache-2.0. It contains code from these packages, under these licences:\n",
        env!("CARGO_PKG_VERSION"),
    )?;
    let mut shown = vec![false; bundled::TEXTS.len()];
    for p in &packages {
        let refs: Vec<String> = p.texts.iter().map(|t| format!("[{}]", t + 1)).collect();
        let licence = match p.chosen {
            Some(chosen) => format!("{} ({chosen} applies)", p.declared),
            None => p.declared.to_owned(),
        };
        let package = format!("{} {}", p.name, p.version);
        writeln!(out, "  {package:<32} {licence:<48} {}", refs.join(" "))?;
        for &t in p.texts {
            shown[t] = true;
        }
    }
    writeln!(
        out,
        "\nSQLite, compiled in by libsqlite3-sys, is in the public domain \
         (https://sqlite.org/copyright.html)."
    )?;
    for (i, text) in bundled::TEXTS.iter().enumerate() {
        if shown[i] {
            writeln!(out, "\n[{}] {}\n\n{}", i + 1, text.from, text.body)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_package_has_a_text_and_every_index_is_in_range() {
        for p in bundled::PACKAGES {
            assert!(!p.texts.is_empty(), "{} ships no licence text", p.name);
            assert!(
                p.texts.iter().all(|&t| t < bundled::TEXTS.len()),
                "{}",
                p.name
            );
        }
    }

    #[test]
    fn the_text_lists_this_targets_packages_and_their_licences() {
        let mut out = Vec::new();
        write(&mut out).expect("writes to memory");
        let text = String::from_utf8(out).expect("utf-8");
        let target = this_target();
        for p in bundled::PACKAGES
            .iter()
            .filter(|p| in_this_binary(p, &target))
        {
            assert!(
                text.contains(&format!("{} {}", p.name, p.version)),
                "{}",
                p.name
            );
        }
        assert!(text.contains("SQLite"));
    }

    #[test]
    fn mimalloc_is_listed_for_the_static_musl_builds_alone() {
        let mimalloc = bundled::PACKAGES
            .iter()
            .find(|p| p.name == "mimalloc")
            .expect("mimalloc is a dependency");
        for target in ["arm-musl", "aarch64-musl", "x86_64-musl"] {
            assert!(in_this_binary(mimalloc, target), "{target}");
        }
        for target in ["arm-gnu", "aarch64-gnu", "x86_64-gnu"] {
            assert!(!in_this_binary(mimalloc, target), "{target}");
        }
    }
}
