//! `tandem serve` children for the tests: one fresh server per engine, its first stdout line
//! (`tandem serve: listening on http://HOST:PORT`) read for the URL. Each child is a
//! `tandem_plugin_support::Supervised` process (its own group, `PR_SET_PDEATHSIG`) kept in a
//! static, so it lives as long as the test process and is stopped with it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tandem_conformance::target_profile_dir;
use tandem_plugin_support::Supervised;

/// The servers started by this test process.
static SERVERS: Mutex<Vec<Supervised>> = Mutex::new(Vec::new());

/// What the first stdout line starts with.
const READY: &str = "tandem serve: listening on ";

/// Starts `tandem serve MODEL --port 0 ARGS...` (the workspace's binary beside the test
/// binary) and returns its URL; its stdout and stderr go to `target/tmp/<name>.{out,err}`.
pub fn serve(name: &str, model: &Path, args: &[&str]) -> String {
    let tandem = target_profile_dir().join("tandem");
    let dir = logs_dir();
    let out_path = dir.join(format!("{name}.out"));
    let err_path = dir.join(format!("{name}.err"));
    let open = |p: &PathBuf| {
        std::fs::File::create(p).unwrap_or_else(|e| panic!("creating {}: {e}", p.display()))
    };
    let mut cmd = Command::new(&tandem);
    cmd.arg("serve")
        .arg(model)
        .args(["--port", "0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(open(&out_path))
        .stderr(open(&err_path));
    let child = Supervised::spawn(cmd, &format!("serve-{name}"), Duration::from_secs(5))
        .unwrap_or_else(|e| {
            panic!(
                "{} serve: {e}; build it first (`cargo build -p tandem`)",
                tandem.display()
            )
        });
    let started = Instant::now();
    let url = loop {
        let text = std::fs::read_to_string(&out_path).unwrap_or_default();
        if let Some(line) = text.lines().next().filter(|_| text.contains('\n')) {
            match line.strip_prefix(READY) {
                Some(url) => break url.trim().to_owned(),
                None => panic!("tandem serve's first line is `{line}`, not `{READY}…`"),
            }
        }
        if let Some(status) = child.exited() {
            let err = std::fs::read_to_string(&err_path).unwrap_or_default();
            panic!(
                "tandem serve exited ({status}) before listening: {}",
                err.trim()
            );
        }
        // A bound on a failure only: a healthy server prints its line in well under a second.
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "tandem serve printed no `{READY}` line in 300 s (log {})",
            err_path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    SERVERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(child);
    url
}

/// The server of the `index`-th engine: the `index`-th URL of `$SGLANG_URLS` (comma-separated:
/// real SGLang servers on a GPU machine, each started on the same tiny model; see NOTES.md),
/// else a fresh `tandem serve` with the memory saver and LoRA on. `true` when real SGLang
/// serves it (it reports no weight digests).
pub fn server_for(index: usize, model: &Path) -> (String, bool) {
    if let Ok(urls) = std::env::var("SGLANG_URLS") {
        let url = urls.split(',').nth(index).unwrap_or_else(|| {
            panic!(
                "$SGLANG_URLS names fewer than {} servers (one per engine)",
                index + 1
            )
        });
        return (url.trim().to_owned(), true);
    }
    let args = ["--enable-memory-saver", "--enable-lora"];
    (serve(&format!("engine-{index}"), model, &args), false)
}

/// `target/tmp/sglang-serve/`: the servers' output and the request traces.
pub fn logs_dir() -> PathBuf {
    let dir = target_profile_dir()
        .parent()
        .unwrap_or(Path::new("."))
        .join("tmp")
        .join("sglang-serve");
    let _ = std::fs::create_dir_all(&dir);
    dir
}
