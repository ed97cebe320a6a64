//! Findings and the error that carries them.
//!
//! A finding names the file, the line, the key, the value and what to write
//! instead. [`ConfigError`] holds every finding of one load and prints them in
//! the spec's shape:
//!
//! ```text
//! configuration is invalid:
//! saguin.yaml:
//!   - line 3: broker.log_level "verbose": it is one of debug, info, warn or error; omit the key for info
//! ```

use std::fmt;

/// One thing wrong with the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The file the finding is in, as the operator named it.
    pub file: String,
    /// The 1-based line, or 0 when the finding is about the file as a whole.
    pub line: u32,
    /// The key path, e.g. `broker.limits.max_keepalive` or `channels.events.filter`.
    pub key: String,
    /// The offending value as written (strings quoted), when there is one.
    pub value: Option<String>,
    /// The rest of the sentence, beginning with `": "` or `" "`.
    pub text: String,
}

impl Finding {
    /// The finding as one line, without the file (which heads its group).
    pub fn line_text(&self) -> String {
        let mut s = String::new();
        if self.line > 0 {
            s.push_str(&format!("line {}: ", self.line));
        }
        s.push_str(&self.key);
        if let Some(v) = &self.value {
            s.push(' ');
            s.push_str(v);
        }
        s.push_str(&self.text);
        s
    }
}

/// Why a configuration was refused: every finding of the load, at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    findings: Vec<Finding>,
}

impl ConfigError {
    /// Wraps findings; they are printed grouped by file, then by line.
    pub fn new(findings: Vec<Finding>) -> Self {
        ConfigError { findings }
    }

    /// Every finding, in the order printed.
    pub fn findings(&self) -> &[Finding] {
        &self.findings
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "configuration is invalid:")?;
        let mut files: Vec<&str> = Vec::new();
        for finding in &self.findings {
            if !files.contains(&finding.file.as_str()) {
                files.push(&finding.file);
            }
        }
        for file in files {
            writeln!(f, "{file}:")?;
            let mut group: Vec<&Finding> =
                self.findings.iter().filter(|x| x.file == file).collect();
            group.sort_by_key(|x| x.line);
            for finding in group {
                writeln!(f, "  - {}", finding.line_text())?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}
