//! Disjoint CPU sets for a model's several CPU engines.
//!
//! A model with `device = ["cpu", "cpu"]` runs two engines fed from its one
//! queue. Left to themselves both engines' thread pools span every core and
//! contend when both run: two OpenVINO bf16 engines of 8 threads on 16 cores
//! ran at 1.05 of the in-process limit against 1.25 for one engine (OpenVINO
//! pins its threads by default, each process without regard to the other),
//! and 1.53 once each had its own 8 cores. Each CPU engine therefore gets its
//! own share of the process's CPUs, whole physical cores (SMT siblings stay
//! together), and as many compute threads as its share has cores.

use std::collections::BTreeMap;

/// One engine's share: the logical CPUs it may run on and its physical cores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuSet {
    pub cpus: Vec<usize>,
    pub cores: usize,
}

impl CpuSet {
    /// The CPUs as a list of ranges, as `taskset -c` writes them ("0-7,16-23").
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        let mut i = 0;
        while i < self.cpus.len() {
            let start = self.cpus[i];
            while i + 1 < self.cpus.len() && self.cpus[i + 1] == self.cpus[i] + 1 {
                i += 1;
            }
            parts.push(if self.cpus[i] == start { start.to_string() } else { format!("{start}-{}", self.cpus[i]) });
            i += 1;
        }
        parts.join(",")
    }
}

/// `cores` (each a physical core's logical CPUs, in order) dealt into `parts`
/// contiguous shares of whole cores, the first shares taking the remainder.
/// Fewer cores than parts: every part gets every core (nothing to split).
pub fn split(cores: &[Vec<usize>], parts: usize) -> Vec<CpuSet> {
    if parts == 0 {
        return Vec::new();
    }
    if cores.len() < parts {
        let mut cpus: Vec<usize> = cores.iter().flatten().copied().collect();
        cpus.sort_unstable();
        return vec![CpuSet { cpus, cores: cores.len() }; parts];
    }
    let (each, extra) = (cores.len() / parts, cores.len() % parts);
    let mut next = 0;
    (0..parts)
        .map(|part| {
            let take = each + usize::from(part < extra);
            let mut cpus: Vec<usize> = cores[next..next + take].iter().flatten().copied().collect();
            cpus.sort_unstable();
            next += take;
            CpuSet { cpus, cores: take }
        })
        .collect()
}

/// This process's CPUs grouped by physical core (package, core id from
/// sysfs), cores in order of their first CPU. Where the topology cannot be
/// read, each CPU counts as a core of its own.
pub fn cores() -> Vec<Vec<usize>> {
    let mut by_core: BTreeMap<(u32, u32), Vec<usize>> = BTreeMap::new();
    let mut unknown = Vec::new();
    for cpu in allowed() {
        let read =
            |what: &str| std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{what}")).ok().and_then(|s| s.trim().parse::<u32>().ok());
        match (read("physical_package_id"), read("core_id")) {
            (Some(package), Some(core)) => by_core.entry((package, core)).or_default().push(cpu),
            _ => unknown.push(vec![cpu]),
        }
    }
    let mut cores: Vec<Vec<usize>> = by_core.into_values().chain(unknown).collect();
    cores.sort_by_key(|c| c[0]);
    cores
}

/// Whether this process may run on fewer CPUs than the machine has online
/// (`taskset`, a container's cpuset, a Kubernetes CPU limit with pinning).
/// ONNX Runtime sizes its default thread pool from the machine's physical
/// cores, not from the mask, and pins the pool's threads itself: under
/// `taskset -c 0` on a 2-core machine its second thread ran on CPU 1.
#[cfg(target_os = "linux")]
pub fn restricted() -> bool {
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    online > 0 && allowed().len() < online as usize
}

#[cfg(not(target_os = "linux"))]
pub fn restricted() -> bool {
    false
}

/// The CPUs this process may run on.
#[cfg(target_os = "linux")]
fn allowed() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&cpu| libc::CPU_ISSET(cpu, &set)).collect()
    }
}

#[cfg(not(target_os = "linux"))]
fn allowed() -> Vec<usize> {
    (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
}

/// Keeps the calling thread on `set`. What it starts afterwards inherits the
/// mask: a runtime's thread pool created on it, and a child process it spawns.
#[cfg(target_os = "linux")]
pub fn pin_current_thread(set: &CpuSet) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET is bounded by CPU_SETSIZE.
    unsafe {
        let mut mask: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in set.cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(cpu, &mut mask);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mask) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Elsewhere (macOS has no affinity masks) the engines share the CPUs.
#[cfg(not(target_os = "linux"))]
pub fn pin_current_thread(_set: &CpuSet) -> std::io::Result<()> {
    Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "CPU affinity is not supported on this system"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn singles(n: usize) -> Vec<Vec<usize>> {
        (0..n).map(|c| vec![c]).collect()
    }

    #[test]
    fn splits_whole_cores_evenly_first_shares_take_the_remainder() {
        let sets = split(&singles(16), 2);
        assert_eq!(sets.iter().map(CpuSet::describe).collect::<Vec<_>>(), ["0-7", "8-15"]);
        assert_eq!(sets.iter().map(|s| s.cores).collect::<Vec<_>>(), [8, 8]);
        let sets = split(&singles(10), 3);
        assert_eq!(sets.iter().map(CpuSet::describe).collect::<Vec<_>>(), ["0-3", "4-6", "7-9"]);
    }

    #[test]
    fn smt_siblings_stay_together() {
        // Linux numbers the second thread of core c as c + cores.
        let cores: Vec<Vec<usize>> = (0..4).map(|c| vec![c, c + 4]).collect();
        let sets = split(&cores, 2);
        assert_eq!(sets[0], CpuSet { cpus: vec![0, 1, 4, 5], cores: 2 });
        assert_eq!(sets[1].describe(), "2-3,6-7");
    }

    #[test]
    fn fewer_cores_than_engines_share_them_all() {
        let sets = split(&singles(1), 2);
        assert_eq!(sets, vec![CpuSet { cpus: vec![0], cores: 1 }; 2]);
        assert!(split(&singles(4), 0).is_empty());
    }

    #[test]
    fn this_machine_has_cores() {
        let cores = cores();
        assert!(!cores.is_empty());
        let cpus: usize = cores.iter().map(Vec::len).sum();
        assert!(cpus >= cores.len());
    }
}
