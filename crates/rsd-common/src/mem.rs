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
