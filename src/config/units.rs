//! The value grammar: durations (`90m`), sizes (`128KiB`) and `none`.

use std::time::Duration;

/// A parsed duration and whether it was written in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ParsedDuration {
    pub value: Duration,
    pub millis: bool,
}

/// Parses `<whole number><unit>` with unit one of ms, s, m, h, d.
pub(crate) fn parse_duration(text: &str) -> Result<ParsedDuration, String> {
    let text = text.trim();
    let digits = text.chars().take_while(|c| c.is_ascii_digit()).count();
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err("is not a duration; write a whole number and one unit from ms, s, m, h and d, such as 90m".into());
    }
    let n: u64 = number
        .parse()
        .map_err(|_| "is too large a number; write a smaller duration".to_string())?;
    let (secs_per, millis) = match unit {
        "ms" => (0, true),
        "s" => (1, false),
        "m" => (60, false),
        "h" => (3600, false),
        "d" => (86_400, false),
        "" => {
            return Err(format!(
                "has no unit; write a whole number and one unit from ms, s, m, h and d, such as {n}s"
            ));
        }
        _ => {
            return Err("is not a duration; write a whole number and one unit from ms, s, m, h and d, such as 90m rather than 1h30m".into());
        }
    };
    let value = if millis {
        Duration::from_millis(n)
    } else {
        Duration::from_secs(
            n.checked_mul(secs_per)
                .ok_or_else(|| "is too long; write a smaller duration".to_string())?,
        )
    };
    Ok(ParsedDuration { value, millis })
}

/// Parses a size: a whole number of bytes, or a whole number and one of
/// B, KiB, MiB, GiB, TiB.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text.chars().take_while(|c| c.is_ascii_digit()).count();
    let (number, unit) = text.split_at(digits);
    let bad = || {
        "is not a size; write a whole number and one of KiB, MiB or GiB, such as 128KiB".to_string()
    };
    if number.is_empty() {
        return Err(bad());
    }
    let n: u64 = number.parse().map_err(|_| bad())?;
    let mult: u64 = match unit.trim_start() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" | "kB" | "K" | "k" | "KB/s" => {
            return Err(format!(
                "is not a size Sagüin reads; units are binary, so write {n}KiB"
            ));
        }
        "MB" | "M" => {
            return Err(format!(
                "is not a size Sagüin reads; units are binary, so write {n}MiB"
            ));
        }
        "GB" | "G" => {
            return Err(format!(
                "is not a size Sagüin reads; units are binary, so write {n}GiB"
            ));
        }
        _ => return Err(bad()),
    };
    n.checked_mul(mult)
        .ok_or_else(|| "is too large; write a smaller size".to_string())
}

/// Writes a duration back in the largest unit that divides it exactly.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let s = d.as_secs();
    if s == 0 {
        return "0s".into();
    }
    for (unit, n) in [("d", 86_400), ("h", 3600), ("m", 60)] {
        if s.is_multiple_of(n) {
            return format!("{}{unit}", s / n);
        }
    }
    format!("{s}s")
}

/// Writes a size back in the largest binary unit that divides it exactly.
pub fn format_size(n: u64) -> String {
    if n == 0 {
        return "0".into();
    }
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if n.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    format!("{n}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// B-517: a whole number and one unit; 1h30m, no unit and fractions refused.
    #[test]
    fn durations_take_one_unit() {
        assert_eq!(
            parse_duration("90m").unwrap().value,
            Duration::from_secs(5400)
        );
        assert!(parse_duration("150ms").unwrap().millis);
        assert!(parse_duration("1h30m").is_err());
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("1.5s").is_err());
        assert_eq!(format_duration(Duration::from_secs(30 * 86_400)), "30d");
        assert_eq!(format_duration(Duration::from_millis(150)), "150ms");
    }

    #[test]
    fn sizes_are_binary() {
        assert_eq!(parse_size("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("100KiB").unwrap(), 102_400);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("1MB").is_err());
        assert_eq!(format_size(8 << 10), "8KiB");
    }
}
