//! How a reranker that is a language model reads a (query, document) pair:
//! the template its model card writes, filled per document. The config
//! carries it, `eeane pull` writes it, the tokenizer applies it.

use serde::{Deserialize, Serialize};

/// How a language-model reranker reads a (query, document) pair, as its
/// model card writes it: `prefix`, then `pair` with `{instruction}`,
/// `{query}` and `{document}` filled in (with the tokenizer's own special
/// tokens, cut to fit), then `suffix`; each part tokenized apart, as the card
/// does. `instruction` is the default a request may replace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerankTemplate {
    pub prefix: String,
    pub pair: String,
    pub suffix: String,
    pub instruction: String,
}

impl RerankTemplate {
    pub const PLACEHOLDERS: [&'static str; 3] = ["{instruction}", "{query}", "{document}"];

    /// The pair's text for one document, the placeholders filled in one pass
    /// (so braces in a query or document are left as they are).
    pub fn fill(&self, instruction: Option<&str>, query: &str, document: &str) -> String {
        let values = [instruction.unwrap_or(&self.instruction), query, document];
        let mut out = String::with_capacity(self.pair.len() + query.len() + document.len() + self.instruction.len());
        let mut rest = self.pair.as_str();
        while let Some(start) = rest.find('{') {
            out.push_str(&rest[..start]);
            rest = &rest[start..];
            match Self::PLACEHOLDERS.iter().position(|p| rest.starts_with(p)) {
                Some(i) => {
                    out.push_str(values[i]);
                    rest = &rest[Self::PLACEHOLDERS[i].len()..];
                }
                None => {
                    out.push('{');
                    rest = &rest[1..];
                }
            }
        }
        out.push_str(rest);
        out
    }
}

#[cfg(test)]
mod rerank_template_tests {
    use super::RerankTemplate;

    #[test]
    fn placeholders_are_filled_once_and_braces_in_texts_kept() {
        let template = RerankTemplate {
            prefix: String::new(),
            pair: "{instruction}|{query}|{document}|{other}".into(),
            suffix: String::new(),
            instruction: "default".into(),
        };
        assert_eq!(template.fill(None, "q {document}", "d {query}"), "default|q {document}|d {query}|{other}");
        assert_eq!(template.fill(Some("mine"), "q", "d"), "mine|q|d|{other}");
    }
}
