//! The code-daemon-shaped model (e5-small-enpt: raw SentencePiece ids, pooling
//! and L2 inside the graph, an INT8 Q/DQ twin) over real HTTP, against the
//! Python reference (onnxruntime + sentencepiece on the same files).

mod common;

use common::{cosine, e5_dir, fixture_texts, run_reference, Server};
use serde_json::{json, Value};

fn config() -> String {
    let (fp32, int8) = (e5_dir("e5-small-enpt"), e5_dir("e5-small-enpt-int8"));
    let entry = |id: &str, dir: &std::path::Path, extra: &str| {
        format!(
            "[[models]]\nid = \"{id}\"\nengine = \"onnxruntime\"\nmodel = \"{}\"\ntokenizer = \"{}\"\npooling = \"none\"\nmax_tokens = 512\n{extra}\n",
            dir.join("model.onnx").display(),
            dir.join("sentencepiece.model").display()
        )
    };
    [
        entry("e5-small-enpt", &fp32, "accept_token_ids = true"),
        entry("e5-small-enpt-window", &fp32, "long_text = \"window\"\nwindow = 128\nstride = 96"),
        entry("e5-small-enpt-int8", &int8, ""),
        // A pooled graph configured to pool again must fail, not pool twice.
        entry("pooled-twice", &fp32, "").replace("pooling = \"none\"", "pooling = \"mean\""),
    ]
    .concat()
}

fn texts() -> Vec<String> {
    let mut texts = fixture_texts();
    let code = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/batcher/plan.rs")).unwrap();
    texts.push(code.chars().take(3000).collect());
    texts.push("Textos longos são divididos em janelas sobrepostas. ".repeat(60));
    texts.push("Long texts are split into overlapping windows and averaged. ".repeat(12));
    texts
}

fn reference(texts: &[String], onnx: &std::path::Path, window: Option<(usize, usize)>) -> (Vec<Vec<f64>>, Vec<usize>) {
    let model = e5_dir("e5-small-enpt").join("sentencepiece.model");
    let mut request = json!({"mode": "embed", "model": model, "onnx": onnx, "max_tokens": 512, "texts": texts});
    if let Some((w, s)) = window {
        request["window"] = json!(w);
        request["stride"] = json!(s);
    }
    let v = run_reference("spm_reference.py", &request);
    let vectors = v["vectors"].as_array().unwrap().iter().map(common::f64s).collect();
    let counts = v["token_counts"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap() as usize).collect();
    (vectors, counts)
}

fn embed(server: &Server, model: &str, input: Value) -> (Vec<Vec<f32>>, usize) {
    let (status, response) = server.post("/v1/embeddings", &json!({"model": model, "input": input}));
    assert_eq!(status, 200, "{model}: {response}");
    (common::vectors(&response), response["usage"]["prompt_tokens"].as_u64().unwrap() as usize)
}

fn check(label: &str, got: &[Vec<f32>], want: &[Vec<f64>]) -> f64 {
    let mut worst = 1.0f64;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), 384);
        let c = cosine(g, w);
        assert!(c >= 0.99999, "{label}: text {i}: cosine {c} to the Python reference");
        worst = worst.min(c);
    }
    println!("{label}: min cosine to the Python reference over {} texts: {worst:.8}", got.len());
    worst
}

#[test]
fn pooled_sentencepiece_models_match_python_truncated_windowed_and_int8() {
    let texts = texts();
    let server = Server::start(Some(&config()), &[]);
    let fp32_onnx = e5_dir("e5-small-enpt").join("model.onnx");

    // fp32, truncated at 512 tokens.
    let (want, counts) = reference(&texts, &fp32_onnx, None);
    assert!(counts.contains(&512), "some text must reach the 512-token cap");
    let (fp32, usage) = embed(&server, "e5-small-enpt", json!(texts));
    assert_eq!(usage, counts.iter().sum::<usize>());
    check("e5-small-enpt fp32", &fp32, &want);
    for v in &fp32 {
        let norm: f64 = v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "the graph's output is used as it comes, L2-normalized: {norm}");
    }

    // Raw token ids give the text's vector.
    let ids = run_reference(
        "spm_reference.py",
        &json!({"mode": "ids", "model": e5_dir("e5-small-enpt").join("sentencepiece.model"), "convention": "raw", "max_tokens": 512, "texts": texts[..4]}),
    );
    let content: Vec<Vec<i64>> = ids["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let s: Vec<i64> = common::f64s(s).into_iter().map(|x| x as i64).collect();
            s[1..s.len() - 1].to_vec()
        })
        .collect();
    let (by_ids, _) = embed(&server, "e5-small-enpt", json!(content));
    assert_eq!(by_ids, fp32[..4].to_vec(), "token ids and text give different vectors");

    // Windows of 128 tokens, stride 96: the mean of the windows, renormalized.
    let (want_w, counts_w) = reference(&texts, &fp32_onnx, Some((128, 96)));
    assert!(counts_w.iter().zip(&counts).any(|(w, t)| w > t), "usage must count every window's tokens");
    let (windowed, usage_w) = embed(&server, "e5-small-enpt-window", json!(texts));
    assert_eq!(usage_w, counts_w.iter().sum::<usize>(), "usage counts all tokens embedded");
    check("e5-small-enpt window 128/96", &windowed, &want_w);
    let short = counts.iter().position(|&n| n < 20).unwrap();
    assert!(cosine(&windowed[short], &common::as_f64(&fp32[short])) > 0.999999, "one window is the plain vector");

    // The INT8 Q/DQ twin: faithful to its own file, and its drift from fp32 reported.
    let (want_q, _) = reference(&texts, &e5_dir("e5-small-enpt-int8").join("model.onnx"), None);
    let (int8, _) = embed(&server, "e5-small-enpt-int8", json!(texts));
    check("e5-small-enpt-int8", &int8, &want_q);
    let mut drift: Vec<f64> = int8.iter().zip(&fp32).map(|(q, f)| cosine(q, &common::as_f64(f))).collect();
    drift.sort_by(f64::total_cmp);
    println!("e5-small-enpt-int8 vs fp32 over {} texts: min cosine {:.4}, median {:.4}", drift.len(), drift[0], drift[drift.len() / 2]);

    // Pooling a pooled graph again is refused with the fix named; the rest keeps serving.
    let (status, response) = server.post("/v1/embeddings", &json!({"model": "pooled-twice", "input": "x"}));
    assert_eq!(status, 503, "{response}");
    assert!(
        response["error"]["message"].as_str().unwrap().contains("pooling = \\\"none\\\"")
            || response["error"]["message"].as_str().unwrap().contains("pooling = \"none\""),
        "{response}"
    );
    let (again, _) = embed(&server, "e5-small-enpt", json!(texts[..4]));
    assert_eq!(again, fp32[..4].to_vec());
}
