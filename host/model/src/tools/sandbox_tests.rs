//! Tests of the python tool's sandbox with a real `python3`: what the code prints is the
//! answer; a loop is stopped at the CPU limit and a sleep at the wall-clock limit (each limit
//! set far from the other, so load on the machine cannot swap them); an allocation without
//! bound is a `MemoryError`; a socket reaches nothing; long output is cut; every failure is
//! one line.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::tools::run_builtin;
use serde_json::json;

fn limits() -> SandboxLimits {
    SandboxLimits {
        wall: Duration::from_secs(120),
        cpu_s: 1,
        memory_bytes: 256 << 20,
        output_bytes: 64,
    }
}

fn failure(code: &str, l: &SandboxLimits) -> String {
    let e = run_python(code, l).unwrap_err();
    let line = e.to_string();
    assert!(line.starts_with("python: "), "{line}");
    assert!(!line.contains('\n'), "one line: {line}");
    line
}

#[test]
fn what_the_code_prints_is_the_answer() {
    assert_eq!(run_python("print(6 * 7)", &limits()).unwrap(), "42");
    let answer = run_builtin(
        "python",
        &json!({"code": "import math\nprint(math.factorial(10))"}),
    );
    assert_eq!(answer.unwrap(), "3628800");
    // The code's own exception: its last line.
    let line = failure("raise ValueError('bad input')", &limits());
    assert!(line.ends_with("ValueError: bad input"), "{line}");
    // No code argument: the expected form.
    let e = run_builtin("python", &json!({"expression": "1"})).unwrap_err();
    assert!(e.to_string().contains("{\"code\""), "{e}");
}

#[test]
fn a_loop_stops_at_the_cpu_limit_and_a_sleep_at_the_wall_clock() {
    let line = failure("while True:\n    pass", &limits());
    assert!(line.contains("CPU limit of 1 s"), "{line}");
    let short = SandboxLimits {
        wall: Duration::from_millis(500),
        cpu_s: 60,
        ..limits()
    };
    let line = failure("import time\ntime.sleep(600)", &short);
    assert!(line.contains("wall-clock limit"), "{line}");
}

#[test]
fn unbounded_allocation_is_a_memory_error() {
    let line = failure(
        "a = []\nwhile True:\n    a.append(bytearray(1 << 24))",
        &limits(),
    );
    assert!(line.contains("MemoryError"), "{line}");
}

#[test]
fn a_socket_reaches_nothing() {
    let code = "import socket\ns = socket.create_connection(('1.1.1.1', 80), timeout=5)\nprint('connected')";
    let line = failure(code, &limits());
    let blocked = line.contains("Network is unreachable")
        || line.contains("network access is disabled")
        || line.contains("Cannot assign requested address");
    assert!(blocked, "{:?}: {line}", isolation());
}

#[test]
fn long_output_is_cut() {
    let text = run_python("print('x' * 1000)", &limits()).unwrap();
    assert!(text.starts_with(&"x".repeat(64)), "{text}");
    assert!(text.ends_with("[output cut at 64 of 1001 bytes]"), "{text}");
}

#[test]
fn what_the_code_starts_dies_with_it() {
    // A child that would outlive the run: it writes its pid, then sleeps.
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let code = format!(
        "import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\nopen({:?}, 'w').write(str(p.pid))\nprint('started')",
        pidfile.display().to_string()
    );
    let l = SandboxLimits {
        wall: Duration::from_secs(60),
        ..limits()
    };
    assert_eq!(run_python(&code, &l).unwrap(), "started");
    let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().parse().unwrap();
    // Killed with its group: gone once reaped by init, or a zombie at most. (A SIGKILL lands
    // when the child is next scheduled: it is waited for, up to the child's own 600 s.)
    let state = || std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let alive = |state: &str| {
        state
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .is_some_and(|s| s != "Z" && s != "X")
    };
    let until = std::time::Instant::now() + Duration::from_secs(300);
    while alive(&state()) && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !alive(&state()),
        "the child {pid} outlived the run: {}",
        state()
    );
}
