// eeane's shim over ncnn: the few calls eeane needs, with a C ABI, including
// what ncnn's c_api.h lacks (the GPU instance, device names and types, how
// many layers were bound to Vulkan). Built by models/build_ncnn.sh against the
// ncnn it builds; the Rust engine opens it at run time.
#include <cstring>
#include <mutex>
#include <vector>

#include "ncnn/gpu.h"
#include "ncnn/layer.h"
#include "ncnn/net.h"

extern "C" {

// --- Vulkan devices -------------------------------------------------------

// Creates the GPU instance on first use; returns the number of Vulkan devices.
int eeane_ncnn_gpu_count() {
#if NCNN_VULKAN
    ncnn::create_gpu_instance();
    return ncnn::get_gpu_count();
#else
    return 0;
#endif
}

// The device's name into buf (NUL-terminated); its type: 0 discrete,
// 1 integrated, 2 virtual, 3 cpu (lavapipe), -1 no such device.
int eeane_ncnn_gpu_info(int index, char *buf, int len) {
#if NCNN_VULKAN
    if (index < 0 || index >= ncnn::get_gpu_count() || len <= 0) return -1;
    const ncnn::GpuInfo &info = ncnn::get_gpu_info(index);
    std::strncpy(buf, info.device_name(), len - 1);
    buf[len - 1] = 0;
    return info.type();
#else
    (void)index; (void)buf; (void)len;
    return -1;
#endif
}

// Releases the GPU instance (and with it the driver's memory); call only when
// no net is alive.
void eeane_ncnn_gpu_release() {
#if NCNN_VULKAN
    ncnn::destroy_gpu_instance();
#endif
}

// --- nets -----------------------------------------------------------------

struct EeaneNet {
    ncnn::Net net;
    std::mutex lock;
};

// A net on the CPU (gpu < 0) or on Vulkan device `gpu`, with fp16 storage,
// packing and arithmetic all on or all off. The device is attached and the
// options set before load_param: ncnn binds layers to Vulkan while loading,
// and fp16 flags changed later do not undo its packed layout.
void *eeane_ncnn_net_load(int gpu, int fp16, int threads, const char *param, const char *bin) {
    EeaneNet *n = new EeaneNet();
    n->net.opt.use_fp16_packed = fp16 != 0;
    n->net.opt.use_fp16_storage = fp16 != 0;
    n->net.opt.use_fp16_arithmetic = fp16 != 0;
    n->net.opt.use_bf16_storage = false;
    if (threads > 0) n->net.opt.num_threads = threads;
#if NCNN_VULKAN
    if (gpu >= 0) {
        n->net.opt.use_vulkan_compute = true;
        n->net.set_vulkan_device(gpu);
    } else {
        n->net.opt.use_vulkan_compute = false;
    }
#else
    if (gpu >= 0) { delete n; return nullptr; }
#endif
    if (n->net.load_param(param) != 0 || n->net.load_model(bin) != 0) {
        delete n;
        return nullptr;
    }
    return n;
}

// Layers bound to Vulkan, and all layers (into *total).
int eeane_ncnn_vulkan_layers(void *handle, int *total) {
    EeaneNet *n = static_cast<EeaneNet *>(handle);
    const std::vector<ncnn::Layer *> &layers = n->net.layers();
    *total = (int)layers.size();
    int on = 0;
#if NCNN_VULKAN
    if (n->net.opt.use_vulkan_compute && n->net.vulkan_device())
        for (const ncnn::Layer *l : layers) on += l->support_vulkan ? 1 : 0;
#endif
    return on;
}

// Runs one sequence of `len` token ids at its own length (positions 0..len-1,
// mask all ones) and writes its token states, len x dim floats, into out
// (capacity cap floats). Returns dim, or a negative error.
int eeane_ncnn_run(void *handle, const int *ids, int len, float *out, long cap) {
    EeaneNet *n = static_cast<EeaneNet *>(handle);
    // Mats that own their memory: the mask's first operation runs in place.
    ncnn::Mat in_ids(len, (size_t)4u), in_pos(len, (size_t)4u), in_mask(len, (size_t)4u);
    int *pid = (int *)in_ids.data, *ppos = (int *)in_pos.data;
    float *pmask = (float *)in_mask.data;
    for (int i = 0; i < len; i++) { pid[i] = ids[i]; ppos[i] = i; pmask[i] = 1.f; }
    ncnn::Mat states;
    {
        std::lock_guard<std::mutex> guard(n->lock);
        ncnn::Extractor ex = n->net.create_extractor();
        if (ex.input("in0", in_ids) || ex.input("in1", in_pos) || ex.input("in2", in_mask)) return -2;
        if (ex.extract("out0", states) != 0) return -3;
    }
    if (states.dims != 2 || states.h != len) return -4;
    int dim = states.w;
    if ((long)len * dim > cap) return -5;
    for (int r = 0; r < len; r++) std::memcpy(out + (size_t)r * dim, states.row(r), sizeof(float) * dim);
    return dim;
}

void eeane_ncnn_net_free(void *handle) {
    delete static_cast<EeaneNet *>(handle);
}

}  // extern "C"
