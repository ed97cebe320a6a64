//! Mutations of a configuration file's lines, for the tests that load mutated files
//! and require a finding or an acceptance, never a panic. Deterministic: a failing
//! case is the same on every run and machine.

#![allow(dead_code)]

/// How many cases a test runs and from which seed: `SAGUIN_MUTATIONS=cases[:seed]`
/// hunts further than the default, on demand.
pub fn cases_and_rng(default_cases: u64, default_seed: u64) -> (usize, Rng) {
    let asked = std::env::var("SAGUIN_MUTATIONS").unwrap_or_default();
    let mut asked = asked.split(':').map(|n| n.parse::<u64>().ok());
    let cases = asked.next().flatten().unwrap_or(default_cases);
    let seed = asked.next().flatten().unwrap_or(default_seed);
    (cases as usize, Rng(seed | 1))
}

/// A small deterministic generator (xorshift64*), so a failing case is the same on
/// every run and machine.
pub struct Rng(u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, from: &'a [T]) -> &'a T {
        &from[self.below(from.len())]
    }
}

/// Values a mutation puts where a value was: edges of every kind the file takes.
const ODD_VALUES: &[&str] = &[
    "",
    "0",
    "-1",
    "1",
    "none",
    "~",
    "null",
    "true",
    "[]",
    "{}",
    "[a, b]",
    "{a: 1}",
    "''",
    "\"\"",
    "1e99",
    "18446744073709551616",
    "4294967296",
    "65536",
    "0x10",
    "1KiB",
    "99999999999TiB",
    "0B",
    "1ms",
    "10ms",
    "1s",
    "500us",
    "5m",
    "30d",
    "100%",
    "NaN",
    "-0",
    "+5",
    "1.5",
    "9223372036854775807",
    "append",
    "latest",
    "queue",
    "memory",
    "sqlite",
    "tcp://h:1883",
    "tls://[::1]:0",
    "127.0.0.1:0",
    "[::1]:99999",
    "a/#",
    "#",
    "+",
    "$SYS/#",
    "$saguin/x",
    "a/{b,c}",
    "a/{",
    "x/__dlq",
    "%u/#",
    "&anchor x",
    "*alias",
    "!!binary aGk=",
    "\"\\u0000\"",
    "é/ü",
    "a\tb",
];

/// Characters a mutation writes over one: YAML's syntax and what it quotes.
const ODD_CHARS: &[char] = &[
    ':', '-', '{', '}', '[', ']', '#', '&', '*', '!', '"', '\'', '\t', '$', '+', '%', '|', '>',
    '@', '`', '\\', ',', '?', ' ', '\n', 'é', '\u{0}', '\u{feff}',
];

/// One random edit of `text`'s lines; `donors` lends lines from other files.
pub fn mutate(rng: &mut Rng, text: &str, donors: &[String]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    if lines.is_empty() {
        lines.push(String::new());
    }
    let at = rng.below(lines.len());
    match rng.below(8) {
        0 => {
            lines.remove(at);
        }
        1 => {
            let line = lines[at].clone();
            lines.insert(at, line);
        }
        2 => {
            let line = &mut lines[at];
            let cut = line.find(": ").map_or(line.len(), |i| i + 2);
            line.truncate(cut);
            if !line.ends_with(": ") {
                line.push_str(": ");
            }
            line.push_str(ODD_VALUES[rng.below(ODD_VALUES.len())]);
        }
        3 => {
            let donor = rng.pick(donors);
            let donor_lines: Vec<&str> = donor.lines().collect();
            if !donor_lines.is_empty() {
                let line = donor_lines[rng.below(donor_lines.len())].to_owned();
                lines.insert(at, line);
            }
        }
        4 => {
            let line = &mut lines[at];
            if rng.below(2) == 0 {
                line.insert_str(0, "  ");
            } else if let Some(rest) = line.strip_prefix("  ") {
                *line = rest.to_owned();
            }
        }
        5 => {
            let line = &mut lines[at];
            let chars: Vec<char> = line.chars().collect();
            let i = rng.below(chars.len() + 1);
            let mut out: String = chars[..i.min(chars.len())].iter().collect();
            out.push(*rng.pick(ODD_CHARS));
            out.extend(chars.iter().skip(i + 1));
            *line = out;
        }
        6 => lines.truncate(at + 1),
        _ => {
            let other = rng.below(lines.len());
            lines.swap(at, other);
        }
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// Loads `cases` mutations of `seeds` (each a few edits of one seed) with `load`,
/// which reads its text as the file `m.yaml`. Every load must refuse with findings
/// on a line of that file that say what to do, or accept - never panic. Returns
/// (accepted, refused); panics naming the first failing cases.
pub fn check<T>(
    seeds: &[String],
    (cases, mut rng): (usize, Rng),
    load: impl Fn(&str) -> Result<T, saguin::config::ConfigError>,
) -> (usize, usize) {
    let mut failures = Vec::new();
    let (mut accepted, mut refused) = (0, 0);
    for case in 0..cases {
        let mut text = seeds[case % seeds.len()].clone();
        for _ in 0..=rng.below(3) {
            text = mutate(&mut rng, &text, seeds);
        }
        let lines = text.lines().count() as u32;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| load(&text))) {
            Err(_) => failures.push(format!("case {case} panicked on:\n{text}")),
            Ok(Ok(_)) => accepted += 1,
            Ok(Err(e)) => {
                refused += 1;
                for f in e.findings() {
                    if f.file != "m.yaml" || f.line > lines + 1 || f.text.len() < 10 {
                        failures.push(format!(
                            "case {case}: a finding off the file or with no remedy: {}\n{text}",
                            f.line_text()
                        ));
                    }
                }
            }
        }
        if failures.len() >= 5 {
            break;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n-----\n\n"));
    (accepted, refused)
}
