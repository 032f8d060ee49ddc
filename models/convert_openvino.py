"""OpenVINO IR of a prepared ONNX model (the catalog's e5-small-enpt and its
INT8 twin), checked against ONNX Runtime on the same ONNX file.

openvino is imported by the conversion itself: a heavy import that the other
commands of prepare.py would pay for."""
import json
import shutil
import statistics

from catalog_recipes import E5_MAX_TOKENS, padded, spm_sequences
from checks import cosine, fixture_texts, session
from manifest import derived_target, write_manifest


def prepare_openvino_ir(cache, source, prepare_source):
    """OpenVINO IR (model.xml/.bin) of the prepared ONNX model `source`
    (made by `prepare_source` when it is not), its quantized
    weights compressed to int8 (`compress_quantize_weights_transformation`), one
    IR with dynamic shapes that eeane reshapes and compiles per bucket. Checked
    against ONNX Runtime on the same ONNX file, each text alone, in f32."""
    import openvino as ov
    from openvino._offline_transformations import compress_quantize_weights_transformation

    name = f"{source}-ov"
    out = derived_target(cache, name, source, prepare_source)
    if out is None:
        return
    src = cache / "models" / source
    out.mkdir(parents=True, exist_ok=True)
    model = ov.convert_model(str(src / "model.onnx"))
    compress_quantize_weights_transformation(model)
    ov.save_model(model, str(out / "model.xml"), compress_to_fp16=False)
    shutil.copy2(src / "sentencepiece.model", out / "sentencepiece.model")

    core = ov.Core()
    compiled = core.compile_model(str(out / "model.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    sess = session(src / "model.onnx")
    texts = fixture_texts()
    # An INT8 graph is also held against the fp32 model it was quantized from.
    fp32_of = json.loads((src / "manifest.json").read_text())["source"].get("quantized_from")
    fp32 = fp32_of and session(cache / "models" / fp32_of / "model.onnx")
    cosines, to_fp32 = [], []
    for seq in spm_sequences(out / "sentencepiece.model", texts, E5_MAX_TOKENS):
        feed = padded([seq])
        a = sess.run(None, feed)[0][0]
        b = compiled(feed)[0][0]
        cosines.append(cosine(a, b))
        if fp32:
            to_fp32.append(cosine(fp32.run(None, feed)[0][0], b))
    quantized = sum(op.get_type_name() == "FakeQuantize" for op in model.get_ops())
    size = (out / "model.bin").stat().st_size / 1e6
    print(f"{name}: IR {size:.0f} MB ({quantized} FakeQuantize ops); OpenVINO CPU f32 vs ONNX Runtime over {len(texts)} texts: "
          f"min cosine {min(cosines):.6f}, median {statistics.median(cosines):.6f}")
    if to_fp32:
        print(f"{name}: OpenVINO INT8 vs the fp32 ONNX ({fp32_of}) on ONNX Runtime: min cosine {min(to_fp32):.4f}, "
              f"median {statistics.median(to_fp32):.4f}")
    # INT8 kernels differ between runtimes (OpenVINO runs the FakeQuantize'd
    # MatMuls in int8, ONNX Runtime may not): the same file, so a looser floor.
    floor = 0.98 if quantized else 0.9999
    if min(cosines) < floor:
        raise SystemExit(f"{name}: OpenVINO's output drifts from ONNX Runtime's (min cosine below {floor}); not publishing it")
    write_manifest(out, {"converted_from": source, "openvino": ov.__version__},
                   {"fake_quantize_ops": quantized, "ir_megabytes": round(size, 1),
                    "min_cosine_vs_onnxruntime": min(cosines), "median_cosine_vs_onnxruntime": statistics.median(cosines),
                    **({"min_cosine_vs_fp32": min(to_fp32), "median_cosine_vs_fp32": statistics.median(to_fp32)} if to_fp32 else {})})
    print(f"{name}: ready in {out}")
