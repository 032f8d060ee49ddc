//! A deterministic corpus of short code and prose, shaped like what coding
//! agents index: signatures, docstrings, short functions, queries, comments,
//! commit messages, and documentation sentences. The same seed gives the same
//! texts on every machine.

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const NOUNS: &[&str] = &[
    "user",
    "order",
    "config",
    "token",
    "buffer",
    "request",
    "response",
    "session",
    "cache",
    "index",
    "vector",
    "model",
    "file",
    "path",
    "record",
    "batch",
    "queue",
    "worker",
    "client",
    "server",
    "message",
    "event",
    "handler",
    "schema",
    "table",
    "column",
    "query",
    "result",
    "error",
    "stream",
    "chunk",
    "document",
    "embedding",
    "tokenizer",
    "account",
];
const VERBS: &[&str] = &[
    "load",
    "parse",
    "validate",
    "compute",
    "fetch",
    "update",
    "create",
    "delete",
    "normalize",
    "encode",
    "decode",
    "merge",
    "split",
    "flush",
    "retry",
    "resolve",
    "render",
    "serialize",
    "filter",
    "sort",
    "build",
    "open",
    "close",
];
const ADJECTIVES: &[&str] = &[
    "empty", "invalid", "cached", "pending", "sorted", "unique", "remote", "local", "optional", "default", "stale", "partial", "nested", "large", "small",
    "new", "raw", "encoded", "active", "expired",
];
const TYPES: &[&str] = &["str", "int", "float", "bool", "bytes", "list[str]", "dict[str, int]", "Path", "Optional[str]"];
const RUST_TYPES: &[&str] = &["&str", "usize", "u64", "f32", "bool", "Vec<u8>", "&[f32]", "Option<String>", "PathBuf"];

fn pick<'a>(rng: &mut ChaCha8Rng, words: &[&'a str]) -> &'a str {
    words.choose(rng).expect("non-empty word list")
}

fn ident(rng: &mut ChaCha8Rng) -> String {
    format!("{}_{}", pick(rng, VERBS), pick(rng, NOUNS))
}

fn sentence(rng: &mut ChaCha8Rng) -> String {
    let (v, a, n, n2) = (pick(rng, VERBS), pick(rng, ADJECTIVES), pick(rng, NOUNS), pick(rng, NOUNS));
    match rng.random_range(0..5) {
        0 => format!("{}s the {a} {n} before the {n2} is written.", capitalize(v)),
        1 => format!("Returns the {a} {n} for the given {n2}, or None if it does not exist."),
        2 => format!("If the {n} is {a}, the {n2} is {v}d again on the next call."),
        3 => format!("The {n2} must be {v}d before any {a} {n} can be read."),
        _ => format!("Raises an error when the {n} is {a} or the {n2} cannot be {v}d."),
    }
}

fn capitalize(word: &str) -> String {
    let mut c = word.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

fn python_function(rng: &mut ChaCha8Rng) -> String {
    let name = ident(rng);
    let args: Vec<String> = (0..rng.random_range(1..4)).map(|_| format!("{}: {}", pick(rng, NOUNS), pick(rng, TYPES))).collect();
    let mut body = format!("def {name}({}) -> {}:\n    \"\"\"{}\"\"\"\n", args.join(", "), pick(rng, TYPES), sentence(rng));
    for _ in 0..rng.random_range(1..7) {
        let (a, b) = (pick(rng, NOUNS), pick(rng, NOUNS));
        body += &match rng.random_range(0..4) {
            0 => format!("    if not {a}:\n        raise ValueError(\"{} {a}\")\n", pick(rng, ADJECTIVES)),
            1 => format!("    {a} = self.{}({b})\n", ident(rng)),
            2 => format!("    for {a} in {b}s:\n        {a}.{}()\n", pick(rng, VERBS)),
            _ => format!("    result[{a}.id] = {b}\n"),
        };
    }
    body + &format!("    return {}\n", pick(rng, NOUNS))
}

fn rust_function(rng: &mut ChaCha8Rng) -> String {
    let name = ident(rng);
    let args: Vec<String> = (0..rng.random_range(1..4)).map(|_| format!("{}: {}", pick(rng, NOUNS), pick(rng, RUST_TYPES))).collect();
    let mut body = format!("/// {}\npub fn {name}({}) -> Result<{}, Error> {{\n", sentence(rng), args.join(", "), pick(rng, RUST_TYPES));
    for _ in 0..rng.random_range(1..6) {
        let (a, b) = (pick(rng, NOUNS), pick(rng, NOUNS));
        body += &match rng.random_range(0..3) {
            0 => format!("    let {a} = {b}.{}()?;\n", ident(rng)),
            1 => format!("    if {a}.is_empty() {{\n        return Err(Error::{}({b}.into()));\n    }}\n", capitalize(pick(rng, ADJECTIVES))),
            _ => format!("    for {a} in {b}.iter() {{\n        {a}.{}();\n    }}\n", pick(rng, VERBS)),
        };
    }
    body + &format!("    Ok({})\n}}\n", pick(rng, NOUNS))
}

fn javascript(rng: &mut ChaCha8Rng) -> String {
    let (name, a, b) = (ident(rng), pick(rng, NOUNS), pick(rng, NOUNS));
    format!("export const {name} = async ({a}, {b}) => {{\n  const res = await fetch(`/api/{a}s/${{{b}.id}}`);\n  if (!res.ok) throw new Error('{}');\n  return res.json();\n}};\n", sentence(rng))
}

fn sql(rng: &mut ChaCha8Rng) -> String {
    let (t, c, c2) = (pick(rng, NOUNS), pick(rng, NOUNS), pick(rng, NOUNS));
    format!("SELECT {c}_id, {c2}, COUNT(*) AS n FROM {t}s WHERE {c2} IS NOT NULL AND created_at > NOW() - INTERVAL '{} days' GROUP BY {c}_id, {c2} ORDER BY n DESC LIMIT {};", rng.random_range(1..90), rng.random_range(5..500))
}

fn signature(rng: &mut ChaCha8Rng) -> String {
    match rng.random_range(0..3) {
        0 => format!("def {}(self, {}: {}) -> {}:", ident(rng), pick(rng, NOUNS), pick(rng, TYPES), pick(rng, TYPES)),
        1 => format!("fn {}(&mut self, {}: {}) -> {}", ident(rng), pick(rng, NOUNS), pick(rng, RUST_TYPES), pick(rng, RUST_TYPES)),
        _ => format!("func (s *{}) {}(ctx context.Context, id string) error", capitalize(pick(rng, NOUNS)), capitalize(&ident(rng).replace('_', ""))),
    }
}

fn commit(rng: &mut ChaCha8Rng) -> String {
    format!(
        "{} {} {} in {}: {}",
        capitalize(pick(rng, &["fix", "add", "remove", "refactor", "speed up"])),
        pick(rng, ADJECTIVES),
        pick(rng, NOUNS),
        ident(rng),
        sentence(rng)
    )
}

fn prose(rng: &mut ChaCha8Rng) -> String {
    (0..rng.random_range(1..5)).map(|_| sentence(rng)).collect::<Vec<_>>().join(" ")
}

/// `n` texts from `seed`.
pub fn corpus(n: usize, seed: u64) -> Vec<String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| match rng.random_range(0..100) {
            0..=17 => signature(&mut rng),
            18..=33 => python_function(&mut rng),
            34..=45 => rust_function(&mut rng),
            46..=53 => javascript(&mut rng),
            54..=61 => sql(&mut rng),
            62..=71 => commit(&mut rng),
            72..=83 => sentence(&mut rng),
            _ => prose(&mut rng),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_corpus_is_deterministic_and_varied() {
        let a = super::corpus(500, 7);
        assert_eq!(a, super::corpus(500, 7));
        assert_ne!(a, super::corpus(500, 8));
        let lens: Vec<usize> = a.iter().map(|t| t.len()).collect();
        assert!(lens.iter().min().unwrap() < &60 && lens.iter().max().unwrap() > &400, "{lens:?}");
    }
}
