//! `eeane check-config`: the example file passes; broken files exit 2 naming the key.

use std::process::{Command, Output};

fn check_config(config: &str, env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("eeane.toml");
    std::fs::write(&path, config).unwrap();
    Command::new(env!("CARGO_BIN_EXE_eeane"))
        .args(["check-config", "--config"])
        .arg(&path)
        .env_remove("EEANE_API_KEY")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

#[test]
fn the_example_file_is_valid_and_documents_every_key() {
    let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/eeane.example.toml")).unwrap();
    let out = check_config(&example, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let resolved: toml::Value = toml::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap();
    assert_eq!(resolved["models"][0]["id"].as_str(), Some("all-minilm-l6-v2"));
    assert!(resolved["models"][0]["model"].as_str().unwrap().ends_with("/models/all-minilm-l6-v2/model.onnx"));
    // Every key the resolved config has appears in the example, so none is undocumented.
    let mut keys = Vec::new();
    for (section, table) in resolved.as_table().unwrap() {
        let tables = match table {
            toml::Value::Array(items) => items.iter().filter_map(|t| t.as_table()).collect::<Vec<_>>(),
            toml::Value::Table(t) => vec![t],
            _ => vec![],
        };
        for t in tables {
            keys.extend(t.keys().map(|k| format!("{section}.{k}")));
        }
    }
    for key in [
        "server.api_key",
        "server.max_loaded_models",
        "server.graceful_shutdown_timeout",
        "models.output",
        "models.precision",
        "models.load_policy",
        "models.keep_alive",
        "models.pad_to_multiple_of",
        "models.pack_tokens",
        "models.source",
    ] {
        keys.push(key.into());
    }
    for key in keys {
        let name = key.rsplit('.').next().unwrap();
        assert!(example.contains(&format!("\n{name} =")) || example.contains(&format!("# {name} =")), "{key} is not documented");
    }
}

#[test]
fn the_api_key_is_never_printed() {
    let out = check_config("[server]\napi_key = \"hunter2\"\n", &[]);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(!stdout.contains("hunter2") && stdout.contains("<redacted>"), "{stdout}");
    let out = check_config("", &[("EEANE_API_KEY", "from-env")]);
    assert!(!String::from_utf8(out.stdout).unwrap().contains("from-env"));
}

#[test]
fn broken_files_exit_2_with_a_message_naming_the_key() {
    let model = "[[models]]\nid = \"m\"\nengine = \"onnxruntime\"\nmodel = \"m.onnx\"\ntokenizer = \"t.json\"\nmax_tokens = 128\n";
    let cases = [
        ("[server]\nport = \"seven\"\n".to_string(), "server.port"),
        ("[server]\nprot = 7997\n".to_string(), "prot"),
        ("[server]\nport = 70000\n".to_string(), "server.port"),
        ("[server\nport = 1\n".to_string(), "TOML"),
        (format!("{model}pooling = \"avg\"\n"), "pooling"),
        (format!("{model}engine_typo = 1\n"), "engine_typo"),
        (model.replace("engine = \"onnxruntime\"", "engine = \"tensorrt\""), "models[0].engine"),
        (model.replace("max_tokens = 128\n", ""), "max_tokens"),
        (format!("{model}{}", model.replace("id = \"m\"", "id = \"n\"\naliases = [\"m\"]")), "models[1].aliases"),
        ("models = []\n".to_string(), "models"),
        (format!("{model}long_text = \"window\"\nwindow = 256\n"), "models[0].window"),
        (format!("{model}long_text = \"window\"\nstride = 127\n"), "models[0].stride"),
        (format!("{model}tokenizer_ids = \"hf\"\n"), "tokenizer_ids"),
    ];
    for (config, key) in cases {
        let out = check_config(&config, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{config}\n{stderr}");
        assert!(stderr.contains(key), "message does not name {key:?}: {stderr}");
        eprintln!("{key}: {stderr}");
    }
}

/// What check-config prints is a configuration eeane reads back to itself:
/// printed again, it is the same text, for the built-in defaults, the
/// example file and entries with `precision = "auto"`, buckets and devices.
#[test]
fn its_output_reads_back_to_itself() {
    let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/eeane.example.toml")).unwrap();
    let entry = |extra: &str| {
        format!("[[models]]\nid = \"m\"\nmodel = \"{{cache}}/models/all-minilm-l6-v2/model.onnx\"\ntokenizer = \"{{cache}}/models/all-minilm-l6-v2/tokenizer.json\"\nmax_tokens = 128\n{extra}\n")
    };
    let configs = [
        ("the built-in defaults", String::new()),
        ("the example file", example),
        ("auto on any engine", entry("precision = \"auto\"")),
        ("auto on its engine", entry("engine = \"openvino\"\nprecision = \"auto\"")),
        (
            "a language-model reranker's template in parts, its query and pair cut",
            entry("engine = \"onnxruntime\"\nkind = \"reranker\"\npooling = \"none\"\nrerank_template = { parts = [\"<bos>\", \"A: {query}\", \"\\n\", \"B: {document}\", \"\\n\", \"{instruction}\"], query_tokens = 96, pair_tokens = 120, instruction = \"Yes or No?\" }"),
        ),
        (
            "a language-model reranker's template as prefix, pair and suffix (read as three parts)",
            entry("engine = \"onnxruntime\"\nkind = \"reranker\"\npooling = \"none\"\nrerank_template = { prefix = \"<|im_start|>system\\nJudge \\\"yes\\\"\", pair = \"<Query>: {query}\\n<Document>: {document}\", suffix = \"\\n\", instruction = \"Find it\" }"),
        ),
        ("buckets and two devices", entry("engine = \"openvino\"\nprecision = \"bf16\"\ndevice = [\"cpu\", \"cpu\"]\nbuckets = [{ max_tokens = 32, max_batch = 8 }, { max_tokens = 128, max_batch = 4 }]")),
    ];
    for (what, config) in configs {
        let first = check_config(&config, &[]);
        assert!(first.status.success(), "{what}: {}", String::from_utf8_lossy(&first.stderr));
        let printed = String::from_utf8(first.stdout).unwrap();
        assert!(!printed.contains("auto_precision"), "{what}: an internal field is printed:\n{printed}");
        let again = check_config(&printed, &[]);
        assert!(again.status.success(), "{what}: the printed config is refused: {}\n{printed}", String::from_utf8_lossy(&again.stderr));
        assert_eq!(String::from_utf8(again.stdout).unwrap(), printed, "{what}: the printed config does not resolve to itself");
    }
    // precision = "auto" is printed as written; an entry that names no engine gets none printed.
    let printed = String::from_utf8(check_config(&entry("precision = \"auto\""), &[]).stdout).unwrap();
    let resolved: toml::Value = toml::from_str(&printed).unwrap();
    assert_eq!(resolved["models"][0]["precision"].as_str(), Some("auto"), "{printed}");
    assert!(resolved["models"][0].get("engine").is_none(), "{printed}");
}
