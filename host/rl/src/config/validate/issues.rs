//! The problems validation collects: one [`ConfigIssue`] per problem, placed at its key in
//! the job file, sorted into file order at the end.

use crate::config::{ConfigError, ConfigIssue, LoadedJob};
use std::ops::Range;

/// The problems found so far in one job.
pub(super) struct Issues<'a> {
    pub job: &'a LoadedJob,
    list: Vec<ConfigIssue>,
}

impl<'a> Issues<'a> {
    /// None yet.
    pub fn new(job: &'a LoadedJob) -> Issues<'a> {
        Issues {
            job,
            list: Vec::new(),
        }
    }

    /// No problem found.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// A problem at `key`; `span` where the caller knows it, else the key's place in the file.
    pub fn push(&mut self, key: &str, span: Option<Range<usize>>, message: String, help: String) {
        let span = span.filter(|s| s.end > 0).or_else(|| self.job.span_of(key));
        let position = span.map(|s| self.job.position(s.start));
        self.list.push(ConfigIssue {
            file: self.job.path.clone(),
            key: key.to_owned(),
            position,
            message,
            help,
        });
    }

    /// A problem at `key` found by its place in the file.
    pub fn at(&mut self, key: &str, message: impl Into<String>, help: impl Into<String>) {
        self.push(key, None, message.into(), help.into());
    }

    /// Every problem, in file order (problems at one place in the order they were found;
    /// those without a position, of which none should remain, last).
    pub fn into_error(self) -> ConfigError {
        let mut list = self.list;
        list.sort_by_key(|i| i.position.unwrap_or((usize::MAX, usize::MAX)));
        ConfigError::Invalid { issues: list }
    }
}
