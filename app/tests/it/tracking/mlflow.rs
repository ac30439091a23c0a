//! A real `mlflow server` (SQLite store, loopback, a port the kernel picks): a run sends it
//! every step, the plan as params and the final checkpoint; the server stopped mid-run loses
//! no step once a server on the same store is back (`tandem log push`).

use super::*;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::sync::mpsc::channel;
use std::time::Duration;

/// `mlflow server` on `store`, in its own process group; its port from its startup line.
struct Server {
    child: Child,
    port: u16,
    stopped: bool,
}

impl Server {
    fn start(store: &Path) -> Server {
        let python = PathBuf::from(track_python());
        let mlflow = python.parent().unwrap().join("mlflow");
        let mut child = Command::new(mlflow)
            .args([
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--workers",
                "1",
            ])
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", store.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("Uvicorn running on http://127.0.0.1:").nth(1) {
                    let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    let _ = tx.send(port.parse::<u16>().unwrap());
                }
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(300))
            .expect("mlflow server did not start in 300 s");
        Server {
            child,
            port,
            stopped: false,
        }
    }

    fn uri(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Kills the server and its workers.
    fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
#[ignore = "needs the trackers' Python (scripts/setup-track.sh) for `mlflow server`; run by .ci/run"]
fn mlflow_gets_every_step_and_a_server_stopped_mid_run_loses_none() {
    let t = Scratch::new();
    let store = t.dir.join("mlflow.db");
    let mut first = Server::start(&store);
    let o = JobOpts {
        steps: 4,
        save_every: 2,
        ..JobOpts::default()
    };
    let logging = format!(
        "[logging.mlflow]\ntracking_uri = \"{}\"\nexperiment = \"tandem-test\"\n",
        first.uri()
    );
    let job = job_with_logging(&t, &o, &logging);
    let mut run = t.spawn(&job, &[]);
    // The server goes away once step 2 is done: whatever it had, the rest is the backlog.
    let stderr = run.stderr.take().unwrap();
    let mut seen = String::new();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        if line.contains("step    2/4") {
            first.stop();
        }
        seen.push_str(&line);
        seen.push('\n');
    }
    let status = run.wait().unwrap();
    assert!(status.success(), "{seen}");
    let second = Server::start(&store);
    let out = t.tandem(&["log", "push", "run", "--mlflow-uri", &second.uri()]);
    assert!(
        out.status.success(),
        "{}{}",
        out.stderr_text(),
        out.stdout_text()
    );
    let state = tracking_state(&t.dir.join("run"));
    let run_id = state["targets"]["mlflow tandem-test"]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(state["targets"]["mlflow tandem-test"]["sent"], 4, "{state}");
    let read = read_back(&["mlflow", &second.uri(), &run_id]);
    assert_eq!(read["status"], "FINISHED", "{read}");
    assert_eq!(read["params"]["algorithm.group_size"], "4");
    let checkpoint = read["tags"]["tandem.checkpoint"]
        .as_str()
        .unwrap_or_default();
    assert!(checkpoint.ends_with("step-000004"), "{checkpoint}");
    for line in t.metrics() {
        let step = line["step"].as_u64().unwrap();
        for (name, value) in scalars(&line) {
            let points: Vec<f64> = read["metrics"][&name]
                .as_array()
                .unwrap_or_else(|| panic!("MLflow has no `{name}`"))
                .iter()
                .filter(|p| p[0].as_u64() == Some(step))
                .map(|p| p[1].as_f64().unwrap())
                .collect();
            assert!(!points.is_empty(), "`{name}` lost at step {step}");
            assert!(
                points.iter().all(|v| *v == value),
                "`{name}` at step {step}: {points:?}"
            );
        }
    }
}
