// eeane's shim over ncnn: the few calls eeane needs, with a C ABI, including
// what ncnn's c_api.h lacks (the GPU instance, device names and types, how
// many layers were bound to Vulkan). Built by models/build_ncnn.sh against the
// ncnn it builds; the Rust engine opens it at run time.
#include <dlfcn.h>

#include <cstdio>
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

// The device's UUID (VkPhysicalDeviceIDProperties.deviceUUID, which tells
// identical cards apart) into buf as 8-4-4-4-12 hex digits; 0, or -1 when
// the driver cannot say or buf is too short.
int eeane_ncnn_gpu_uuid(int index, char *buf, int len) {
#if NCNN_VULKAN
    if (index < 0 || index >= ncnn::get_gpu_count() || len < 37) return -1;
    // Vulkan 1.1's entry point, from the loader ncnn opened: libncnn exports
    // none of its own function pointers. A 1.0 loader has none: no UUID.
    PFN_vkGetPhysicalDeviceProperties2KHR properties2 = 0;
    void *loader = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (loader) properties2 = (PFN_vkGetPhysicalDeviceProperties2KHR)dlsym(loader, "vkGetPhysicalDeviceProperties2");
    if (!properties2) return -1;
    VkPhysicalDeviceIDProperties id = {};
    id.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES;
    VkPhysicalDeviceProperties2 properties = {};
    properties.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
    properties.pNext = &id;
    properties2(ncnn::get_gpu_info(index).physicalDevice(), &properties);
    const unsigned char *u = id.deviceUUID;
    std::snprintf(buf, len, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3], u[4], u[5], u[6],
                  u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    return 0;
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

// A net with allocators of its own, so that what a long run took can be given
// back (ncnn's device-wide pools keep every buffer they ever made until the
// GPU instance goes: seed 000 saw 1,961 MiB held after one long request).
struct EeaneNet {
    ncnn::Net net;
    std::mutex lock;
    ncnn::UnlockedPoolAllocator blob_pool;
    ncnn::PoolAllocator workspace_pool;
#if NCNN_VULKAN
    ncnn::VkBlobAllocator *blob_vk = nullptr;
    ncnn::VkBlobAllocator *workspace_vk = nullptr;
    ncnn::VkStagingAllocator *staging_vk = nullptr;
#endif
    ~EeaneNet() {
        net.clear();
#if NCNN_VULKAN
        delete blob_vk;
        delete workspace_vk;
        delete staging_vk;
#endif
    }
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
    n->net.opt.blob_allocator = &n->blob_pool;
    n->net.opt.workspace_allocator = &n->workspace_pool;
#if NCNN_VULKAN
    if (gpu >= 0) {
        n->net.opt.use_vulkan_compute = true;
        n->net.set_vulkan_device(gpu);
        const ncnn::VulkanDevice *vkdev = n->net.vulkan_device();
        if (!vkdev) { delete n; return nullptr; }
        n->blob_vk = new ncnn::VkBlobAllocator(vkdev);
        n->workspace_vk = new ncnn::VkBlobAllocator(vkdev);
        n->staging_vk = new ncnn::VkStagingAllocator(vkdev);
        n->net.opt.blob_vkallocator = n->blob_vk;
        n->net.opt.workspace_vkallocator = n->workspace_vk;
        n->net.opt.staging_vkallocator = n->staging_vk;
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

// Runs `nseg` sequences packed side by side into one row of `total` tokens
// (ids back to back, segment lengths in seg_lens): positions restart at 0 in
// each segment and the [total x total] mask lets a token attend only within
// its own segment, so each sequence computes exactly as if it ran alone, at
// its own length, with no padding. Writes the token states, total x dim
// floats, into out (capacity cap floats). Returns dim, or a negative error.
int eeane_ncnn_run(void *handle, const int *ids, const int *seg_lens, int nseg, float *out, long cap) {
    EeaneNet *n = static_cast<EeaneNet *>(handle);
    int total = 0;
    for (int s = 0; s < nseg; s++) {
        if (seg_lens[s] <= 0) return -1;
        total += seg_lens[s];
    }
    if (total <= 0) return -1;
    // Mats that own their memory: the mask's first operation runs in place.
    ncnn::Mat in_ids(total, (size_t)4u), in_pos(total, (size_t)4u), in_mask(total, total, (size_t)4u);
    int *pid = (int *)in_ids.data, *ppos = (int *)in_pos.data;
    in_mask.fill(0.f);
    for (int s = 0, at = 0; s < nseg; at += seg_lens[s], s++) {
        for (int i = 0; i < seg_lens[s]; i++) {
            pid[at + i] = ids[at + i];
            ppos[at + i] = i;
            float *row = in_mask.row(at + i);
            for (int j = 0; j < seg_lens[s]; j++) row[at + j] = 1.f;
        }
    }
    ncnn::Mat states;
    {
        std::lock_guard<std::mutex> guard(n->lock);
        ncnn::Extractor ex = n->net.create_extractor();
        if (ex.input("in0", in_ids) || ex.input("in1", in_pos) || ex.input("in2", in_mask)) return -2;
        if (ex.extract("out0", states) != 0) return -3;
    }
    if (states.dims != 2 || states.h != total) return -4;
    int dim = states.w;
    if ((long)total * dim > cap) return -5;
    for (int r = 0; r < total; r++) std::memcpy(out + (size_t)r * dim, states.row(r), sizeof(float) * dim);
    return dim;
}

// Gives back the buffers the net's allocators keep for reuse (host and
// device); the next run allocates afresh. Call between runs.
void eeane_ncnn_trim(void *handle) {
    EeaneNet *n = static_cast<EeaneNet *>(handle);
    std::lock_guard<std::mutex> guard(n->lock);
    n->blob_pool.clear();
    n->workspace_pool.clear();
#if NCNN_VULKAN
    if (n->blob_vk) n->blob_vk->clear();
    if (n->workspace_vk) n->workspace_vk->clear();
    if (n->staging_vk) n->staging_vk->clear();
#endif
}

void eeane_ncnn_net_free(void *handle) {
    delete static_cast<EeaneNet *>(handle);
}

}  // extern "C"
