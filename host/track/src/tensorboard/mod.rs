//! TensorBoard: event files TensorBoard reads (`tensorboard --logdir DIR`), written by this
//! process. Each opening starts a new file (`events.out.tfevents.<time>.<host>.<pid>.<n>`;
//! TensorBoard reads a directory's files in name order); every write is flushed to the file
//! before the step counts as sent.

mod proto;

use crate::error::TrackError;
use crate::flatten::Line;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Files opened by this process (the last part of their names).
static OPENED: AtomicU32 = AtomicU32::new(0);

/// An open event file.
pub struct EventWriter {
    path: PathBuf,
    file: std::fs::File,
}

impl EventWriter {
    /// A new event file in `dir` (created if missing), starting with its version event.
    pub fn create(dir: &Path) -> Result<EventWriter, TrackError> {
        std::fs::create_dir_all(dir)
            .map_err(TrackError::io(format!("creating {}", dir.display())))?;
        let now = unix_now();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".to_string());
        let n = OPENED.fetch_add(1, Ordering::Relaxed);
        let name = format!(
            "events.out.tfevents.{}.{host}.{}.{n}",
            now as u64,
            std::process::id()
        );
        let path = dir.join(name);
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(TrackError::io(format!("creating {}", path.display())))?;
        let mut w = EventWriter { path, file };
        w.write(&proto::file_version(now))?;
        Ok(w)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One line's scalars at its step.
    pub fn line(&mut self, line: &Line) -> Result<(), TrackError> {
        let t = line.time.unwrap_or_else(unix_now);
        self.write(&proto::scalars(t, line.step, &line.scalars))
    }

    /// A text (markdown) at `step`, under `tag`.
    pub fn text(&mut self, step: u32, tag: &str, body: &str) -> Result<(), TrackError> {
        self.write(&proto::text(unix_now(), step, tag, body))
    }

    /// Marks a restart at `step`: TensorBoard drops what earlier files hold for `step` and
    /// after (a resumed run's steps replace the first attempt's).
    pub fn restart_at(&mut self, step: u32) -> Result<(), TrackError> {
        self.write(&proto::session_start(unix_now(), step))
    }

    fn write(&mut self, event: &[u8]) -> Result<(), TrackError> {
        self.file
            .write_all(&proto::record(event))
            .and_then(|()| self.file.flush())
            .map_err(TrackError::io(format!("writing {}", self.path.display())))
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The TensorBoard tracker of a run: a new event file per opening; the job file as the text
/// `job` at step 0 of the first; a resumed run's restart marked.
pub(crate) struct TensorboardSink {
    dir: PathBuf,
    writer: Option<EventWriter>,
}

impl TensorboardSink {
    pub(crate) fn new(dir: PathBuf) -> TensorboardSink {
        TensorboardSink { dir, writer: None }
    }
}

impl crate::sinks::Sink for TensorboardSink {
    fn name(&self) -> &'static str {
        "tensorboard"
    }

    fn key(&self) -> String {
        format!("tensorboard {}", self.dir.display())
    }

    fn open(
        &mut self,
        state: &mut crate::state::SinkState,
        run: &crate::sinks::RunInfo,
    ) -> Result<(), TrackError> {
        let mut w = EventWriter::create(&self.dir)?;
        match state.sent {
            None => w.text(0, "job", &format!("```toml\n{}\n```", run.job_text))?,
            Some(sent) => w.restart_at(sent.saturating_add(1))?,
        }
        self.writer = Some(w);
        Ok(())
    }

    fn send(&mut self, lines: &[&Line]) -> Result<(), TrackError> {
        let w = self
            .writer
            .as_mut()
            .ok_or_else(|| TrackError::tracker("tensorboard", "no event file open"))?;
        lines.iter().try_for_each(|l| w.line(l))
    }

    fn finish(&mut self, _checkpoint: Option<&Path>, _failed: bool) -> Result<(), TrackError> {
        self.writer = None;
        Ok(())
    }
}
