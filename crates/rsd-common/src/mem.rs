//! This process's memory counters from `/proc/self/status` (Linux).

/// Memory counters in bytes; each is 0 where the kernel does not report it (not Linux).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// Resident set size now (`VmRSS`).
    pub rss: u64,
    /// Peak resident set size (`VmHWM`).
    pub peak_rss: u64,
    /// The file-backed part of the resident set (`RssFile`): mapped shard pages, for a loader.
    pub rss_file: u64,
}

impl Memory {
    /// Reads the counters now. Costs tens of µs (open, read, format): sample, do not poll.
    pub fn now() -> Memory {
        let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        Memory::parse(&text)
    }

    fn parse(status: &str) -> Memory {
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|kib| kib.parse::<u64>().ok())
                .map_or(0, |kib| kib * 1024)
        };
        Memory {
            rss: field("VmRSS:"),
            peak_rss: field("VmHWM:"),
            rss_file: field("RssFile:"),
        }
    }
}

/// Bytes as MiB, for messages.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Resident KiB of this process's mappings of `path` (Linux `smaps`; `None` elsewhere): how much
/// of a memory-mapped file a reader keeps in its address space.
pub fn mapped_kib(path: &std::path::Path) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let name = path.to_str()?;
    let mut total = 0;
    let mut in_it = false;
    for line in smaps.lines() {
        if line.contains('-') && line.split_whitespace().count() >= 5 {
            in_it = line.ends_with(name);
        } else if in_it && line.starts_with("Rss:") {
            total += line.split_whitespace().nth(1)?.parse::<u64>().ok()?;
        }
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernel_format() {
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssAnon:\t 512 kB\nRssFile:\t  256 kB\n";
        assert_eq!(
            Memory::parse(status),
            Memory {
                rss: 1024 * 1024,
                peak_rss: 2048 * 1024,
                rss_file: 256 * 1024
            }
        );
        assert_eq!(Memory::parse(""), Memory::default());
    }

    #[test]
    fn reads_this_process() {
        if cfg!(target_os = "linux") {
            let m = Memory::now();
            assert!(m.rss > 0 && m.peak_rss >= m.rss, "{m:?}");
        }
    }
}
