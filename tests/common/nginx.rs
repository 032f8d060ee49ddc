//! nginx on loopback, running an example configuration from examples/deploy/
//! with its upstream and listen lines pointed at a test's replicas and port.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn binary() -> PathBuf {
    ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("nginx is missing: run `bash tests/run.sh` (EEANE_EXTRA_MODELS=nginx bash models/setup.sh)")
}

pub struct Nginx {
    child: Child,
    pub url: String,
    dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Nginx {
    /// A file nginx wrote into its prefix directory (a log the test configured).
    pub fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    pub fn prefix(&self) -> &std::path::Path {
        self.dir.path()
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// nginx with `examples/deploy/{example}`: each run of its `server
/// 127.0.0.1:` upstream lines becomes `replicas` (with the example's
/// options), its listen line a free port; lines starting with one of `drop`
/// are left out, and after a line starting with `after`, `line` is added.
pub fn start(example: &str, replicas: &[&str], drop: &[&str], inserts: &[(&str, &str)]) -> Nginx {
    let text = std::fs::read_to_string(format!("{}/examples/deploy/{example}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let port = free_port();
    let mut lines: Vec<String> = Vec::new();
    let mut in_servers = false;
    let mut upstreams = 0;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("server 127.0.0.1:") {
            if !in_servers {
                let options = trimmed.split_once(' ').unwrap().1.split_once(' ').map(|(_, o)| o).unwrap_or(";");
                lines.extend(replicas.iter().map(|r| format!("        server {r} {options}")));
                upstreams += 1;
            }
            in_servers = true;
            continue;
        }
        in_servers = false;
        if drop.iter().any(|d| trimmed.starts_with(d)) {
            continue;
        }
        if trimmed.starts_with("listen ") {
            lines.push(format!("        listen 127.0.0.1:{port};"));
        } else {
            lines.push(line.to_string());
        }
        lines.extend(inserts.iter().filter(|(after, _)| trimmed.starts_with(after)).map(|(_, added)| added.to_string()));
    }
    assert!(upstreams > 0, "examples/deploy/{example} has no upstream server lines");
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("nginx.conf");
    std::fs::write(&conf, lines.join("\n")).unwrap();
    let prefix = dir.path().to_str().unwrap();
    let child = Command::new(binary())
        .args(["-p", prefix, "-c", conf.to_str().unwrap(), "-e", &format!("{prefix}/error.log")])
        .args(["-g", &format!("daemon off; pid {prefix}/nginx.pid;")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start nginx");
    let url = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "nginx did not listen: {}",
            std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Nginx { child, url, dir }
}
