//! Pooling, normalization and `dimensions`, shared by every engine.

use eeane_backend_core::{EngineError, EngineOutput, TokenBatch};

use crate::config::Pooling;

/// Pools one row of token states `[seq, dim]` over its first `len` (real) tokens.
/// Padding never reaches the result: only the first `len` rows are read.
pub fn pool(states: &[f32], dim: usize, len: usize, pooling: Pooling) -> Vec<f32> {
    let real = &states[..len * dim];
    let sum = || {
        let mut sum = vec![0f64; dim];
        for token in real.chunks_exact(dim) {
            for (s, &v) in sum.iter_mut().zip(token) {
                *s += v as f64;
            }
        }
        sum
    };
    match pooling {
        Pooling::Cls => states[..dim].to_vec(),
        Pooling::None => unreachable!("graphs that pool return pooled output, which is never pooled again"),
        Pooling::Mean => sum().into_iter().map(|s| (s / len.max(1) as f64) as f32).collect(),
        Pooling::MeanSqrtLen => sum().into_iter().map(|s| (s / (len.max(1) as f64).sqrt()) as f32).collect(),
        Pooling::Max => {
            let mut max = vec![f32::NEG_INFINITY; dim];
            for token in real.chunks_exact(dim) {
                max.iter_mut().zip(token).for_each(|(m, &v)| *m = m.max(v));
            }
            max
        }
        Pooling::LastToken => states[len.max(1) * dim - dim..len.max(1) * dim].to_vec(),
    }
}

/// Scales `v` to unit length; a zero vector stays zero.
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
}

/// One vector from an input's window vectors: their mean, renormalized when
/// the model normalizes (a single window is returned as it is).
pub fn combine_windows(mut windows: Vec<Vec<f32>>, renormalize: bool) -> Vec<f32> {
    if windows.len() == 1 {
        return windows.pop().unwrap_or_default();
    }
    let dim = windows.first().map_or(0, Vec::len);
    let mut sum = vec![0f64; dim];
    for w in &windows {
        sum.iter_mut().zip(w).for_each(|(s, &v)| *s += v as f64);
    }
    let mut mean: Vec<f32> = sum.into_iter().map(|s| (s / windows.len() as f64) as f32).collect();
    if renormalize {
        normalize(&mut mean);
    }
    mean
}

/// OpenAI's `dimensions`: keep the first `dims` values and renormalize.
pub fn truncate_dimensions(v: &mut Vec<f32>, dims: usize) {
    v.truncate(dims);
    normalize(v);
}

/// Pools an engine's output into one vector per row; `who` names the model and
/// engine in the error a non-finite output gets.
pub fn pool_output(output: EngineOutput, batch: &TokenBatch, pooling: Pooling, unit_length: bool, who: &str) -> Result<Vec<Vec<f32>>, EngineError> {
    let mut vectors: Vec<Vec<f32>> = match (output, pooling) {
        (EngineOutput::Pooled { data, dim, .. }, Pooling::None) => data.chunks_exact(dim).map(<[f32]>::to_vec).collect(),
        (EngineOutput::Hidden { data, seq, dim, .. }, pooling) if pooling != Pooling::None => {
            data.chunks_exact(seq * dim).zip(&batch.lengths).map(|(states, &len)| pool(states, dim, len, pooling)).collect()
        }
        (EngineOutput::Pooled { .. }, p) => {
            return Err(EngineError::Model(format!(
                "the graph returns pooled vectors, but the model is configured with pooling = {p:?}; use pooling = \"none\""
            )))
        }
        (EngineOutput::Hidden { .. }, _) => {
            return Err(EngineError::Model("the graph returns token states, but the model is configured with pooling = \"none\"".into()))
        }
    };
    // A NaN or infinity is never a vector the model means: fail loudly instead,
    // whatever the engine (on Core ML it means the compiled model did not run
    // on the Neural Engine: off it, its output comes back non-finite).
    if let Some(row) = vectors.iter().position(|v| v.iter().any(|x| !x.is_finite())) {
        return Err(EngineError::Inference(format!(
            "{who} produced a non-finite value (NaN or infinity) for sequence {row} of a batch of {}, so nothing is returned. \
             Likely causes: fp16 overflow (precision = \"fp16\"), a broken or mis-converted graph, or on Core ML the Neural \
             Engine not really in use",
            batch.batch
        )));
    }
    if unit_length {
        vectors.iter_mut().for_each(|v| normalize(v));
    }
    Ok(vectors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_ignores_padding_rows() {
        let states = [1.0, 2.0, 3.0, 4.0, 100.0, 100.0];
        assert_eq!(pool(&states, 2, 2, Pooling::Mean), vec![2.0, 3.0]);
        assert_eq!(pool(&states, 2, 2, Pooling::Cls), vec![1.0, 2.0]);
        // Max, last token and mean over sqrt(len) read the real tokens only too.
        assert_eq!(pool(&states, 2, 2, Pooling::Max), vec![3.0, 4.0]);
        assert_eq!(pool(&[-1.0, 5.0, -3.0, 2.0, 9.0, 9.0], 2, 2, Pooling::Max), vec![-1.0, 5.0]);
        assert_eq!(pool(&states, 2, 2, Pooling::LastToken), vec![3.0, 4.0]);
        assert_eq!(pool(&states, 2, 1, Pooling::LastToken), vec![1.0, 2.0]);
        let root2 = std::f64::consts::SQRT_2;
        assert_eq!(pool(&states, 2, 2, Pooling::MeanSqrtLen), vec![(4.0 / root2) as f32, (6.0 / root2) as f32]);
    }

    #[test]
    fn windows_average_then_renormalize() {
        assert_eq!(combine_windows(vec![vec![0.6, 0.8]], true), vec![0.6, 0.8]);
        let v = combine_windows(vec![vec![1.0, 0.0], vec![0.0, 1.0]], true);
        assert!((v[0] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6 && (v[1] - v[0]).abs() < 1e-7);
        assert_eq!(combine_windows(vec![vec![1.0, 0.0], vec![0.0, 1.0]], false), vec![0.5, 0.5]);
    }

    #[test]
    fn normalize_and_truncate() {
        let mut v = vec![3.0, 4.0, 12.0];
        normalize(&mut v);
        assert!((v.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-6);
        truncate_dimensions(&mut v, 2);
        assert_eq!(v.len(), 2);
        assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6);
        let mut zero = vec![0.0; 3];
        normalize(&mut zero);
        assert_eq!(zero, vec![0.0; 3]);
    }
}
