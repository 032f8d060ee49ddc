//! How a reranker that is a language model reads a (query, document) pair:
//! the template its model card writes, filled per document. The config
//! carries it, `eeane pull` writes it, the tokenizer applies it.

use serde::{Deserialize, Serialize};

/// How a language-model reranker reads a (query, document) pair, as its
/// model card writes it: `parts`, each with `{instruction}`, `{query}` and
/// `{document}` filled in, tokenized apart without special tokens (so a part
/// names a special token by its text, as `"<bos>"`) and joined in order.
///
/// Cutting follows the cards: the part holding `{query}` (when it does not
/// also hold `{document}`) is cut to `query_tokens`; the part holding
/// `{document}` is cut so that the parts up to it fit `pair_tokens`, and all
/// of them the entry's `max_tokens`. `instruction` is the default a request
/// may replace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "TemplateTable")]
pub struct RerankTemplate {
    pub parts: Vec<String>,
    pub instruction: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_tokens: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pair_tokens: Option<usize>,
}

/// The two ways a config writes a template: `parts`, or the
/// prefix/pair/suffix table that `eeane pull` wrote for Qwen3-Reranker
/// before bge-reranker-v2-gemma's template needed more parts (still read, so
/// that a config pulled then keeps serving). One flat table, so that a
/// misspelt key is named.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TemplateTable {
    parts: Option<Vec<String>>,
    prefix: Option<String>,
    pair: Option<String>,
    suffix: Option<String>,
    instruction: String,
    #[serde(default)]
    query_tokens: Option<usize>,
    #[serde(default)]
    pair_tokens: Option<usize>,
}

impl TryFrom<TemplateTable> for RerankTemplate {
    type Error = &'static str;

    fn try_from(table: TemplateTable) -> Result<Self, Self::Error> {
        let parts = match (table.parts, table.prefix, table.pair, table.suffix) {
            (Some(parts), None, None, None) => parts,
            (None, prefix, Some(pair), suffix) => [prefix, Some(pair), suffix].into_iter().flatten().collect(),
            _ => return Err("a rerank_template has parts = [...], or pair with an optional prefix and suffix; not both"),
        };
        Ok(Self { parts, instruction: table.instruction, query_tokens: table.query_tokens, pair_tokens: table.pair_tokens })
    }
}

/// What a template part holds, by its placeholders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartRole {
    /// No placeholder: tokenized once, at load.
    Fixed,
    /// `{instruction}` and/or `{query}`, no `{document}`: tokenized once a request.
    Request,
    /// `{document}`: tokenized once a document, and cut to fit.
    Document,
}

impl RerankTemplate {
    pub const PLACEHOLDERS: [&'static str; 3] = ["{instruction}", "{query}", "{document}"];

    pub fn role(part: &str) -> PartRole {
        if part.contains("{document}") {
            PartRole::Document
        } else if Self::PLACEHOLDERS.iter().any(|p| part.contains(p)) {
            PartRole::Request
        } else {
            PartRole::Fixed
        }
    }

    /// The index of the part that holds `{document}`.
    pub fn document_part(&self) -> Option<usize> {
        self.parts.iter().position(|p| Self::role(p) == PartRole::Document)
    }

    /// The index of the part cut to `query_tokens`: the one that holds
    /// `{query}` without `{document}`.
    pub fn query_part(&self) -> Option<usize> {
        self.parts.iter().position(|p| p.contains("{query}") && !p.contains("{document}"))
    }

    /// Why this template cannot be applied, if it cannot: `{document}` in
    /// exactly one part, `{query}` in one, `query_tokens` only with a query
    /// part of its own.
    pub fn problem(&self) -> Option<String> {
        let holding = |placeholder: &str| self.parts.iter().filter(|p| p.contains(placeholder)).count();
        match (holding("{document}"), holding("{query}")) {
            (1, 1) => {}
            (documents, queries) => {
                return Some(format!("parts must hold {{query}} once and {{document}} once; they hold them {queries} and {documents} times"));
            }
        }
        if self.query_tokens.is_some() && self.query_part().is_none() {
            return Some("query_tokens cuts a part that holds {query} without {document}; no part does".into());
        }
        if self.query_tokens == Some(0) || self.pair_tokens == Some(0) {
            return Some("query_tokens and pair_tokens must be at least 1".into());
        }
        None
    }

    /// A part's text with the placeholders filled in one pass (so braces in a
    /// query or document are left as they are).
    pub fn fill(&self, part: &str, instruction: Option<&str>, query: &str, document: &str) -> String {
        let values = [instruction.unwrap_or(&self.instruction), query, document];
        let mut out = String::with_capacity(part.len() + query.len() + document.len() + self.instruction.len());
        let mut rest = part;
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
    use super::{PartRole, RerankTemplate};

    fn template(parts: &[&str]) -> RerankTemplate {
        RerankTemplate { parts: parts.iter().map(|p| p.to_string()).collect(), instruction: "default".into(), query_tokens: None, pair_tokens: None }
    }

    #[test]
    fn placeholders_are_filled_once_and_braces_in_texts_kept() {
        let t = template(&["{instruction}|{query}|{document}|{other}"]);
        assert_eq!(t.fill(&t.parts[0], None, "q {document}", "d {query}"), "default|q {document}|d {query}|{other}");
        assert_eq!(t.fill(&t.parts[0], Some("mine"), "q", "d"), "mine|q|d|{other}");
    }

    #[test]
    fn parts_are_told_apart_by_their_placeholders() {
        let t = RerankTemplate { query_tokens: Some(3), ..template(&["<bos>", "A: {query}", "\n", "B: {document}", "\n", "{instruction}"]) };
        let roles: Vec<PartRole> = t.parts.iter().map(|p| RerankTemplate::role(p)).collect();
        use PartRole::*;
        assert_eq!(roles, [Fixed, Request, Fixed, Document, Fixed, Request]);
        assert_eq!((t.query_part(), t.document_part(), t.problem()), (Some(1), Some(3), None));
    }

    #[test]
    fn a_template_that_cannot_be_applied_says_why() {
        assert!(template(&["{query}"]).problem().unwrap().contains("{document} once"));
        assert!(template(&["{query}{document}", "{document}"]).problem().unwrap().contains("2 times"));
        let cut_query_with_document = RerankTemplate { query_tokens: Some(8), ..template(&["{query} {document}"]) };
        assert!(cut_query_with_document.problem().unwrap().contains("query_tokens"));
    }

    #[test]
    fn the_prefix_pair_suffix_table_is_read_as_three_parts() {
        #[derive(Debug, serde::Deserialize)]
        struct Entry {
            rerank_template: RerankTemplate,
        }
        let old: Entry = toml::from_str("rerank_template = { prefix = \"p\", pair = \"{query}|{document}\", suffix = \"s\", instruction = \"i\" }").unwrap();
        assert_eq!(old.rerank_template, RerankTemplate { instruction: "i".into(), ..template(&["p", "{query}|{document}", "s"]) });
        let new: Entry = toml::from_str("rerank_template = { parts = [\"{query}\", \"{document}\"], instruction = \"i\", query_tokens = 4 }").unwrap();
        assert_eq!(new.rerank_template, RerankTemplate { instruction: "i".into(), query_tokens: Some(4), ..template(&["{query}", "{document}"]) });
        let stray = toml::from_str::<Entry>("rerank_template = { parts = [], instruction = \"i\", stray = 1 }").unwrap_err();
        assert!(stray.to_string().contains("unknown field `stray`"), "{stray}");
        let both = toml::from_str::<Entry>("rerank_template = { parts = [], pair = \"p\", instruction = \"i\" }").unwrap_err();
        assert!(both.to_string().contains("not both"), "{both}");
    }
}
