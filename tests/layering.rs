//! HTTP goes through one door: the handlers in src/http know `serving` (its
//! requests, answers, errors and status snapshots) and the config, never the
//! registry, the model, the tokenizers, the batcher or the engines. A new API
//! surface is then one file that knows only `serving`.

#[test]
fn http_knows_serving_and_nothing_behind_it() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
    let behind = ["crate::registry", "crate::model", "crate::tokenize", "crate::batcher", "crate::engines", "crate::pooling", "eeane_backend_"];
    let mut reaches = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap().map(Result::unwrap) {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                if let Some(module) = behind.iter().find(|m| line.contains(*m)) {
                    reaches.push(format!("{}:{}: {module}", path.file_name().unwrap().to_string_lossy(), n + 1));
                }
            }
        }
    }
    assert!(reaches.is_empty(), "src/http reaches past serving:\n{}", reaches.join("\n"));
}
