//! The Hub look-alike (tests/hub/lookalike.py) on loopback, serving a folder
//! of repositories, and `eeane pull` against it with an HF_HOME of its own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The folder `dir` (under target/, replaced on each run) laid out once per
/// test binary by `command`. A failure is kept with the tail of the command's
/// stderr: every test that needs the folder fails at once with that cause,
/// rather than laying it out again (a disk that filled once cost 17 tries of
/// half a minute each, and the cause sat in none of the failures' messages).
pub fn laid_out_once(cell: &OnceLock<Result<PathBuf, String>>, dir: PathBuf, mut command: Command) -> &Path {
    let laid_out = cell.get_or_init(|| {
        let _ = std::fs::remove_dir_all(&dir);
        let out = command.stderr(Stdio::piped()).output().map_err(|e| format!("{command:?} did not start: {e}"))?;
        if out.status.success() {
            return Ok(dir);
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Err(format!("laying out {} failed ({}): {command:?}\n{}", dir.display(), out.status, tail.join("\n")))
    });
    match laid_out {
        Ok(dir) => dir,
        Err(cause) => panic!("{cause}"),
    }
}

pub fn python() -> PathBuf {
    super::cache_dir().join("venv/bin/python")
}

/// A script of tests/hub/.
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hub").join(name)
}

pub struct LookAlike {
    child: Child,
    pub endpoint: String,
}

impl LookAlike {
    /// Serves `repos` (a folder of ORG/NAME repositories), `token` opening gated ones.
    pub fn start(repos: &Path, token: &str) -> LookAlike {
        let ports = tempfile::NamedTempFile::new().unwrap().into_temp_path();
        std::fs::remove_file(&ports).unwrap();
        let child = Command::new(python())
            .arg(script("lookalike.py"))
            .arg("--repos")
            .arg(repos)
            .arg("--port-file")
            .arg(&ports)
            .arg("--token")
            .arg(token)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while !ports.exists() {
            assert!(started.elapsed() < Duration::from_secs(60), "the look-alike did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let text = std::fs::read_to_string(&ports).unwrap();
        let hub_port = text.split_whitespace().next().unwrap().to_string();
        LookAlike { child, endpoint: format!("http://127.0.0.1:{hub_port}") }
    }

    /// Every request it saw: server, method, path, whether it carried a token, its Range.
    pub fn log(&self) -> Vec<serde_json::Value> {
        reqwest::blocking::get(format!("{}/_lookalike/log", self.endpoint)).unwrap().json().unwrap()
    }

    /// `kind` (truncate_once, corrupt) for the LFS file with this sha256.
    pub fn fault(&self, kind: &str, sha256: &str) {
        let status = reqwest::blocking::Client::new().post(format!("{}/_lookalike/fault?kind={kind}&sha={sha256}", self.endpoint)).send().unwrap().status();
        assert_eq!(status, 204);
    }
}

impl Drop for LookAlike {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Pulled {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `eeane pull FLAGS SOURCE` with HF_HOME = `home`, the endpoint and extra environment.
pub fn pull_with(flags: &[&str], home: &Path, endpoint: &str, source: &str, env: &[(&str, &str)]) -> Pulled {
    let out = Command::new(env!("CARGO_BIN_EXE_eeane"))
        .arg("pull")
        .args(flags)
        .arg(source)
        .env("HF_HOME", home)
        .env("HF_ENDPOINT", endpoint)
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_CACHE")
        .env_remove("HUGGINGFACE_HUB_CACHE")
        .env_remove("HF_HUB_OFFLINE")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    Pulled { ok: out.status.success(), stdout: String::from_utf8_lossy(&out.stdout).into(), stderr: String::from_utf8_lossy(&out.stderr).into() }
}

/// Entries `eeane pull --device cuda:...` printed, for the CPU that serves
/// them in tests: without their `device` and `precision = "auto"` lines.
pub fn on_the_cpu(entries: &str) -> String {
    entries.lines().filter(|l| !l.starts_with("device = ") && !l.starts_with("precision = ")).map(|l| format!("{l}\n")).collect()
}

/// A repository's folder in the HF cache under `home`.
pub fn repo_dir(home: &Path, repo: &str) -> PathBuf {
    home.join("hub").join(format!("models--{}", repo.replace('/', "--")))
}

/// The repository's one snapshot in the HF cache under `home`.
pub fn the_snapshot(home: &Path, repo: &str) -> PathBuf {
    let snapshots = repo_dir(home, repo).join("snapshots");
    let mut commits: Vec<_> = std::fs::read_dir(&snapshots).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(commits.len(), 1, "{commits:?}");
    commits.pop().unwrap()
}

pub fn sha256_hex(path: &Path) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

/// Files under `dir`, relative, sorted (symlinks followed); none when it does not exist.
pub fn files_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push(path.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    if dir.exists() {
        walk(dir, dir, &mut out);
    }
    out.sort();
    out
}
