//! A rerank request's documents and the order of their scores, parsed alike
//! by Infinity's `/rerank` and TEI's (`rerank.rs`, `tei.rs`).

use serde_json::Value;

use super::error::ApiError;

/// The documents of `field` (Infinity's `documents`, TEI's `texts`): strings,
/// or Cohere's `{"text": ...}` objects.
pub fn documents(values: Option<Vec<Value>>, max: usize, field: &str) -> Result<Vec<String>, ApiError> {
    let values = values.ok_or_else(|| ApiError::invalid_request("missing_documents", format!("{field} is required")).with_param(field))?;
    if values.is_empty() {
        return Err(ApiError::invalid_request("empty_documents", format!("{field} is an empty list")).with_param(field));
    }
    if values.len() > max {
        return Err(
            ApiError::too_large("too_many_documents", format!("{} {field}; at most {max} per request (server.max_inputs)", values.len())).with_param(field)
        );
    }
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(s) if !s.is_empty() => Ok(s),
            Value::Object(mut o) => {
                match o.remove("text") {
                    Some(Value::String(s)) if !s.is_empty() => Ok(s),
                    _ => Err(ApiError::invalid_request("empty_document", format!("{field}[{i}].text must be a non-empty string"))
                        .with_param(format!("{field}[{i}]"))),
                }
            }
            Value::String(_) => Err(ApiError::invalid_request("empty_document", format!("{field}[{i}] is empty")).with_param(format!("{field}[{i}]"))),
            _ => Err(ApiError::unprocessable("invalid_type", format!("{field}[{i}] must be a string or an object with a text field"))
                .with_param(format!("{field}[{i}]"))),
        })
        .collect()
}

/// Indices of `scores`, best first; ties keep the documents' order.
pub fn best_first(scores: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order
}
