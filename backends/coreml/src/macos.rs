//! The part that calls Core ML (macOS only): one MLModel per bucket, and per
//! batch-2 bucket, each fed int32 `[rows, seq]` ids and mask and read back as
//! pooled vectors `[rows, dim]` or token states `[rows, seq, dim]`.
//! Type-checked on Linux (`cargo check --target aarch64-apple-darwin`); never
//! run here (docs/engines/coreml.md).

use std::collections::BTreeMap;
use std::path::Path;

use eeane_backend_core::{Engine, EngineError, EngineInfo, EngineOutput, InputShapes, TokenBatch};
use objc2::rc::Retained;
use objc2::runtime::{AnyObject, ProtocolObject};
use objc2::AllocAnyThread;
use objc2_core_ml::{
    MLComputeUnits, MLDictionaryFeatureProvider, MLFeatureProvider, MLFeatureValue, MLModel, MLModelConfiguration, MLMultiArray, MLMultiArrayDataType,
};
use objc2_foundation::{NSArray, NSDictionary, NSNumber, NSString, NSURL};

use crate::Artifacts;

pub struct CoreMlEngine {
    single: BTreeMap<usize, Retained<MLModel>>,
    pair: BTreeMap<usize, Retained<MLModel>>,
    inputs: [Retained<NSString>; 2],
    output: Option<Retained<NSString>>,
    info: EngineInfo,
}

// SAFETY: an MLModel may be used from any thread; eeane uses each engine from
// one thread at a time.
unsafe impl Send for CoreMlEngine {}

fn units(name: &str) -> MLComputeUnits {
    match name {
        "cpu_only" => MLComputeUnits::CPUOnly,
        "cpu_and_gpu" => MLComputeUnits::CPUAndGPU,
        "all" => MLComputeUnits::All,
        _ => MLComputeUnits::CPUAndNeuralEngine,
    }
}

fn open_model(path: &Path, compute_units: MLComputeUnits) -> Result<Retained<MLModel>, EngineError> {
    let url = NSURL::fileURLWithPath(&NSString::from_str(&path.to_string_lossy()));
    // SAFETY: plain Core ML calls with valid objects.
    unsafe {
        let configuration = MLModelConfiguration::new();
        configuration.setComputeUnits(compute_units);
        MLModel::modelWithContentsOfURL_configuration_error(&url, &configuration)
            .map_err(|e| EngineError::Model(format!("Core ML cannot load {}: {}", path.display(), e.localizedDescription())))
    }
}

pub fn load(artifacts: &Artifacts, compute_units: &str, input_names: [&str; 2], output: Option<&str>) -> Result<Box<dyn Engine>, EngineError> {
    let units_value = units(compute_units);
    let single = artifacts.buckets.iter().map(|(&b, p)| Ok((b, open_model(p, units_value)?))).collect::<Result<BTreeMap<_, _>, EngineError>>()?;
    let pair = artifacts.batch2.iter().map(|(&b, p)| Ok((b, open_model(p, units_value)?))).collect::<Result<BTreeMap<_, _>, EngineError>>()?;
    let shapes = single.keys().map(|&b| (1, b)).chain(pair.keys().map(|&b| (2, b))).collect();
    let info = EngineInfo {
        engine: "coreml".into(),
        device: format!("coreml:{compute_units}"),
        precision: "as compiled".into(),
        shapes: InputShapes::Fixed(shapes),
        takes_token_type_ids: false,
        seq_multiple: 1,
        call_cost_tokens: eeane_backend_core::CPU_CALL_COST_TOKENS,
        row_counts: Vec::new(),
        accelerated_layers: None,
        runtime_version: None,
    };
    Ok(Box::new(CoreMlEngine {
        single,
        pair,
        inputs: [NSString::from_str(input_names[0]), NSString::from_str(input_names[1])],
        output: output.map(NSString::from_str),
        info,
    }))
}

fn multi_array(rows: usize, seq: usize, values: &[i64]) -> Result<Retained<MLMultiArray>, EngineError> {
    let shape = NSArray::from_retained_slice(&[NSNumber::new_usize(rows), NSNumber::new_usize(seq)]);
    // SAFETY: a fresh int32 array of rows x seq, first-major and contiguous
    // (as initWithShape:dataType: makes it), filled through its data pointer.
    unsafe {
        let array = MLMultiArray::initWithShape_dataType_error(MLMultiArray::alloc(), &shape, MLMultiArrayDataType::Int32)
            .map_err(|e| EngineError::Inference(format!("Core ML input: {}", e.localizedDescription())))?;
        #[allow(deprecated)]
        let data = array.dataPointer().as_ptr() as *mut i32;
        for (i, &v) in values.iter().enumerate().take(rows * seq) {
            *data.add(i) = v as i32;
        }
        Ok(array)
    }
}

/// A float16 output value as f32 (exact: every half is a float).
fn widen(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// The array's values in first-major order, whatever its strides, as f32.
fn read(array: &MLMultiArray) -> Result<(Vec<usize>, Vec<f32>), EngineError> {
    // SAFETY: reads within the array's shape and strides.
    unsafe {
        let shape: Vec<usize> = array.shape().iter().map(|n| n.as_usize()).collect();
        let strides: Vec<usize> = array.strides().iter().map(|n| n.as_usize()).collect();
        let count: usize = shape.iter().product();
        let kind = array.dataType();
        #[allow(deprecated)]
        let base = array.dataPointer().as_ptr();
        let mut out = Vec::with_capacity(count);
        for flat in 0..count {
            let (mut rest, mut offset) = (flat, 0usize);
            for d in (0..shape.len()).rev() {
                offset += (rest % shape[d]) * strides[d];
                rest /= shape[d];
            }
            out.push(if kind == MLMultiArrayDataType::Float32 {
                *(base as *const f32).add(offset)
            } else if kind == MLMultiArrayDataType::Float16 {
                widen(*(base as *const u16).add(offset))
            } else {
                return Err(EngineError::Inference("Core ML output is neither float32 nor float16".into()));
            });
        }
        Ok((shape, out))
    }
}

impl CoreMlEngine {
    fn call(&self, model: &MLModel, rows: usize, seq: usize, ids: &[i64], mask: &[i64]) -> Result<(Vec<usize>, Vec<f32>), EngineError> {
        let failed = |what: &str, e: Retained<objc2_foundation::NSError>| EngineError::Inference(format!("Core ML {what}: {}", e.localizedDescription()));
        let (ids, mask) = (multi_array(rows, seq, ids)?, multi_array(rows, seq, mask)?);
        // SAFETY: wrapping valid arrays.
        let (ids, mask) = unsafe { (MLFeatureValue::featureValueWithMultiArray(&ids), MLFeatureValue::featureValueWithMultiArray(&mask)) };
        let keys: [&NSString; 2] = [&self.inputs[0], &self.inputs[1]];
        let values: [&AnyObject; 2] = [&ids, &mask];
        let dictionary = NSDictionary::from_slices(&keys, &values);
        // SAFETY: plain Core ML calls with valid objects.
        unsafe {
            let provider =
                MLDictionaryFeatureProvider::initWithDictionary_error(MLDictionaryFeatureProvider::alloc(), &dictionary).map_err(|e| failed("inputs", e))?;
            let result = model.predictionFromFeatures_error(ProtocolObject::from_ref(&*provider)).map_err(|e| failed("prediction", e))?;
            let name = match &self.output {
                Some(name) => name.clone(),
                None => result.featureNames().iter().next().ok_or_else(|| EngineError::Inference("Core ML returned no output".into()))?,
            };
            let value = result.featureValueForName(&name).ok_or_else(|| EngineError::Inference(format!("Core ML has no output {name}")))?;
            let array = value.multiArrayValue().ok_or_else(|| EngineError::Inference(format!("Core ML output {name} is not an array")))?;
            read(&array)
        }
    }
}

impl Engine for CoreMlEngine {
    fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// A batch of two runs through the bucket's batch-2 model when there is
    /// one; otherwise each row runs alone through the batch-1 model.
    fn run(&mut self, batch: &TokenBatch) -> Result<EngineOutput, EngineError> {
        let seq = batch.seq;
        let mut calls: Vec<(usize, usize)> = Vec::new();
        if batch.batch == 2 && self.pair.contains_key(&seq) {
            calls.push((0, 2));
        } else {
            calls.extend((0..batch.batch).map(|r| (r, 1)));
        }
        let (mut data, mut dim, mut hidden) = (Vec::new(), 0, false);
        for (first, rows) in calls {
            let model = if rows == 2 {
                &self.pair[&seq]
            } else {
                self.single.get(&seq).ok_or_else(|| EngineError::Input(format!("no Core ML artifact for {seq} tokens")))?
            };
            let span = first * seq..(first + rows) * seq;
            let (shape, values) = self.call(model, rows, seq, &batch.input_ids[span.clone()], &batch.attention_mask[span])?;
            dim = *shape.last().unwrap_or(&0);
            hidden = shape.len() == 3;
            data.extend(values);
        }
        Ok(if hidden { EngineOutput::Hidden { data, batch: batch.batch, seq, dim } } else { EngineOutput::Pooled { data, batch: batch.batch, dim } })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn half_floats_widen_exactly() {
        assert_eq!(super::widen(0x3c00), 1.0);
        assert_eq!(super::widen(0xc000), -2.0);
        assert_eq!(super::widen(0x0001), 2f32.powi(-24));
        assert!(super::widen(0x7e00).is_nan());
    }
}
