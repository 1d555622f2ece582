//! Facts about the machine and a process, read from `/proc`: every figure the bench prints
//! names its machine, and server CPU and memory are measured, not guessed.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Cores and CPU model, as `BENCHMARKS.md` asks every figure to carry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu_model: String,
}

impl Machine {
    pub fn detect() -> Machine {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        Machine { cores, cpu_model }
    }

    /// One line for reports: `2 cores, AMD EPYC`.
    pub fn line(&self) -> String {
        format!("{} cores, {}", self.cores, self.cpu_model)
    }
}

/// CPU time and resident memory of one process at one instant.
#[derive(Debug, Clone, Copy)]
pub struct ProcSample {
    pub at: Instant,
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
}

impl ProcSample {
    /// Reads `/proc/<pid>/stat` and `/proc/<pid>/statm`; `None` if the process is gone.
    pub fn read(pid: u32) -> Option<ProcSample> {
        let at = Instant::now();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let fields = stat_fields(&stat)?;
        // utime and stime are fields 14 and 15 of the full line.
        let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
        let rss_pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        // SAFETY: sysconf has no preconditions.
        let (tck, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
        Some(ProcSample {
            at,
            cpu_seconds: ticks as f64 / tck.max(1) as f64,
            rss_bytes: rss_pages * page.max(1) as u64,
        })
    }

    /// CPU use between two samples, in percent of one core.
    pub fn cpu_pct_since(&self, earlier: &ProcSample) -> f64 {
        let wall = self.at.duration_since(earlier.at).as_secs_f64();
        if wall <= 0.0 { 0.0 } else { 100.0 * (self.cpu_seconds - earlier.cpu_seconds) / wall }
    }
}

/// The fields of a `/proc/<pid>/stat` line after the command name (which may hold spaces and
/// parentheses, so it ends at the last `)`): index 0 is field 3 of the line, the state.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    Some(rest.split_whitespace().collect())
}

/// `pid` and all its descendants, found through the parent pid in `/proc/*/stat`.
pub fn process_tree(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let child: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let ppid = stat_fields(&stat)?.get(1)?.parse().ok()?;
            Some((child, ppid))
        })
        .collect();
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(parents.iter().filter(|&&(_, ppid)| ppid == parent).map(|&(child, _)| child));
        i += 1;
    }
    tree
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_skip_a_command_name_with_spaces_and_parentheses() {
        let line = "42 (my (odd) name) S 7 42 42 0 -1 4194560 0 0 0 0 11 22 0 0";
        let fields = stat_fields(line).unwrap();
        assert_eq!((fields[0], fields[1], fields[11], fields[12]), ("S", "7", "11", "22"));
        assert_eq!(stat_fields("42 (x)"), Some(vec![]));
        assert_eq!(stat_fields("no parenthesis"), None);
    }

    #[test]
    fn reads_its_own_process() {
        let sample = ProcSample::read(std::process::id()).expect("own /proc entry");
        assert!(sample.rss_bytes > 0);
        assert!(sample.cpu_seconds >= 0.0);
        assert!(ProcSample::read(u32::MAX).is_none());
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let tree = process_tree(std::process::id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(tree.contains(&std::process::id()) && tree.contains(&child.id()), "{tree:?}");
        let m = Machine::detect();
        assert!(m.cores >= 1);
        assert!(m.line().contains("cores"));
    }
}
