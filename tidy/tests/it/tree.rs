//! The rules on the real repository: fails with every violation, one per line, and the
//! figures of the tree.

use std::path::Path;

use tandem_tidy::{Rule, check, edges_block};

#[test]
fn the_repository_keeps_its_architecture() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let report = check(&root).expect("tidy runs on the repository");
    println!("tidy: {}", report.figures);
    if report.violations.is_empty() {
        return;
    }
    let mut text = String::new();
    for violation in &report.violations {
        text.push_str(&format!("{violation}\n"));
    }
    text.push_str(&format!(
        "{} violations; {}\n",
        report.violations.len(),
        report.figures
    ));
    if !report.of(Rule::CrateEdges).is_empty() {
        match edges_block(&root) {
            Ok(block) => text.push_str(&format!(
                "the edges cargo metadata reports (layers not included):\n{block}"
            )),
            Err(e) => text.push_str(&format!("(the actual edges could not be listed: {e})\n")),
        }
    }
    panic!("the tree breaks tidy rules:\n{text}");
}
