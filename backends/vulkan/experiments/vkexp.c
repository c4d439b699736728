/* Experiment driver for backends/vulkan/NOTES.md ("Issue 6 follow-up"), not built by CMake and
 * not part of the library: guest-mode RWKV-7/6 forwards (H=32, N=64, f32) on buffers this
 * program allocates itself, so that memory type, allocation strategy, tensor layout and input
 * data can be varied; GPU timestamps around the recorded op; submit/fence floors for decode.
 *   vkexp mem                      memory types and heaps
 *   vkexp fwd OP B T ALLOC LAYOUT [REPS]
 *        OP 7|6; ALLOC per|big|ded|over4|typeK (guest buffers) or wkv (the plugin's own
 *        context and wkv_buffer_create); LAYOUT btHN|tbHN|padK (batch stride K x T x H x N)
 *        env VKEXP_DATA=bench: wkv-bench's model-like inputs instead of 16 MiB random tiles;
 *        VKEXP_YFILL=1 (with bench data): y filled with random tiles; VKEXP_ZERO=1: buffers
 *        zero-filled first; VKEXP_INTERLEAVE=1: each buffer filled right after it is made
 *   vkexp mix B T                  RWKV-7: wkv-bench's inputs in one tensor at a time, all, all
 *                                  with the low mantissa bits randomised (cmd_mix)
 *   vkexp floor                    empty submit, timestamps-only submit, decode B=1/64/256
 *                                  (guest recording, 16 steps per command buffer, synchronous)
 * Build (from a build directory with the Vulkan plugin):
 *   cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -I../include -I../tools/common \
 *      ../backends/vulkan/experiments/vkexp.c -o vkexp libwkv_tools.a libwkv_reference.a \
 *      -L. -lwkv -ldl -lm -lstdc++ -Wl,-rpath,'$ORIGIN'
 */
#define VK_NO_PROTOTYPES
#include <vulkan/vulkan_core.h>

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <wkv/wkv.h>
#include <wkv/wkv_vulkan.h>

#include "wkv_tools.h"

static PFN_vkGetInstanceProcAddr gipa;
#define FNS(X)                                                                                                        \
    X(vkCreateInstance) X(vkEnumeratePhysicalDevices) X(vkGetPhysicalDeviceQueueFamilyProperties)                    \
    X(vkGetPhysicalDeviceMemoryProperties) X(vkGetPhysicalDeviceProperties) X(vkCreateDevice) X(vkGetDeviceQueue)   \
    X(vkCreateBuffer) X(vkGetBufferMemoryRequirements) X(vkAllocateMemory) X(vkBindBufferMemory) X(vkMapMemory)       \
    X(vkCreateCommandPool) X(vkAllocateCommandBuffers) X(vkResetCommandBuffer) X(vkBeginCommandBuffer)               \
    X(vkEndCommandBuffer) X(vkCmdPipelineBarrier) X(vkQueueSubmit) X(vkCreateFence) X(vkGetFenceStatus)              \
    X(vkResetFences) X(vkDeviceWaitIdle) X(vkCreateQueryPool) X(vkCmdResetQueryPool) X(vkCmdWriteTimestamp)          \
    X(vkGetQueryPoolResults) X(vkCmdCopyBuffer) X(vkDestroyBuffer) X(vkFreeMemory) X(vkCmdFillBuffer)
#define DECL(n) static PFN_##n n;
FNS(DECL)

static VkInstance inst;
static VkPhysicalDevice pd;
static VkDevice dev;
static VkQueue queue;
static VkCommandBuffer cmd;
static VkFence fence;
static VkQueryPool qp;
static uint32_t family;
static double ts_period; /* ns per tick */
static VkPhysicalDeviceMemoryProperties mp;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int cmpd(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}
static double median(double* v, int n) {
    qsort(v, n, sizeof *v, cmpd);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void setup(void) {
    void* lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) exit(77);
    gipa = (PFN_vkGetInstanceProcAddr)dlsym(lib, "vkGetInstanceProcAddr");
#define LOAD(n) n = (PFN_##n)gipa(inst, #n);
    LOAD(vkCreateInstance);
    VkApplicationInfo app = {VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.apiVersion = VK_API_VERSION_1_2;
    VkInstanceCreateInfo ici = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ici.pApplicationInfo = &app;
    if (vkCreateInstance(&ici, NULL, &inst) != VK_SUCCESS) exit(77);
    FNS(LOAD)
    uint32_t nd = 1;
    if (vkEnumeratePhysicalDevices(inst, &nd, &pd) < 0 || !nd) exit(77);
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(pd, &props);
    ts_period = props.limits.timestampPeriod;
    printf("device %s, timestampPeriod %.3f ns\n", props.deviceName, ts_period);
    vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    uint32_t nq = 0;
    VkQueueFamilyProperties qf[16];
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, NULL);
    if (nq > 16) nq = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, qf);
    family = UINT32_MAX;
    for (uint32_t i = 0; i < nq && family == UINT32_MAX; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) family = i;
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qci.queueFamilyIndex = family;
    qci.queueCount = 1;
    qci.pQueuePriorities = &prio;
    VkDeviceCreateInfo dci = {VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    if (vkCreateDevice(pd, &dci, NULL, &dev) != VK_SUCCESS) exit(1);
    vkGetDeviceQueue(dev, family, 0, &queue);
    VkCommandPoolCreateInfo pci = {VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pci.queueFamilyIndex = family;
    VkCommandPool pool;
    vkCreateCommandPool(dev, &pci, NULL, &pool);
    VkCommandBufferAllocateInfo cai = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    cai.commandPool = pool;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    vkAllocateCommandBuffers(dev, &cai, &cmd);
    VkFenceCreateInfo fci = {VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    vkCreateFence(dev, &fci, NULL, &fence);
    VkQueryPoolCreateInfo qpi = {VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    qpi.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qpi.queryCount = 2;
    vkCreateQueryPool(dev, &qpi, NULL, &qp);
}

static void begin(void) {
    vkResetCommandBuffer(cmd, 0);
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    vkBeginCommandBuffer(cmd, &bi);
}

/* submits, spins on the fence; returns wall seconds from submit to signalled */
static double submit_spin(void) {
    vkEndCommandBuffer(cmd);
    VkSubmitInfo si = {VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd;
    double t0 = now();
    vkQueueSubmit(queue, 1, &si, fence);
    while (vkGetFenceStatus(dev, fence) == VK_NOT_READY) {
    }
    double t = now() - t0;
    vkResetFences(dev, 1, &fence);
    return t;
}

static double gpu_seconds(void) {
    uint64_t ts[2];
    vkGetQueryPoolResults(dev, qp, 0, 2, sizeof ts, ts, 8, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
    return (double)(ts[1] - ts[0]) * ts_period * 1e-9;
}

static void barrier_all(void) {
    VkMemoryBarrier mb = {VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_MEMORY_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT;
    vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, 0, 1, &mb, 0,
                         NULL, 0, NULL);
}

typedef struct hbuf {
    VkBuffer b;
    VkDeviceMemory m;
    uint64_t bytes;
} hbuf;

static uint32_t first_type(uint32_t allowed, VkMemoryPropertyFlags need, int skip) {
    for (uint32_t i = 0; i < mp.memoryTypeCount; i++)
        if ((allowed & (1u << i)) && (mp.memoryTypes[i].propertyFlags & need) == need && skip-- == 0) return i;
    return UINT32_MAX;
}

/* type: -1 = the plugin's choice (first DEVICE_LOCAL), else the index */
static int make(uint64_t bytes, int type, int dedicated, hbuf* out) {
    VkBufferCreateInfo bci = {VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bci.size = bytes;
    bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    if (vkCreateBuffer(dev, &bci, NULL, &out->b) != VK_SUCCESS) return 0;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev, out->b, &req);
    uint32_t t = type >= 0 ? (uint32_t)type : first_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
    if (t >= mp.memoryTypeCount || !(req.memoryTypeBits & (1u << t))) {
        printf("  memory type %d not allowed (bits 0x%x)\n", type, req.memoryTypeBits);
        return 0;
    }
    VkMemoryDedicatedAllocateInfo ded = {VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO};
    ded.buffer = out->b;
    VkMemoryAllocateInfo mai = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    mai.allocationSize = req.size;
    mai.memoryTypeIndex = t;
    if (dedicated) mai.pNext = &ded;
    if (vkAllocateMemory(dev, &mai, NULL, &out->m) != VK_SUCCESS) return 0;
    vkBindBufferMemory(dev, out->b, out->m, 0);
    out->bytes = bytes;
    return 1;
}
static void unmake(hbuf* b) {
    vkDestroyBuffer(dev, b->b, NULL);
    vkFreeMemory(dev, b->m, NULL);
}

static void print_mem(void) {
    for (uint32_t i = 0; i < mp.memoryHeapCount; i++)
        printf("heap %u: %.1f GiB flags 0x%x\n", i, mp.memoryHeaps[i].size / 1073741824.0, mp.memoryHeaps[i].flags);
    for (uint32_t i = 0; i < mp.memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = mp.memoryTypes[i].propertyFlags;
        printf("type %u: heap %u%s%s%s%s\n", i, mp.memoryTypes[i].heapIndex, f & 1 ? " DEVICE_LOCAL" : "",
               f & 2 ? " HOST_VISIBLE" : "", f & 4 ? " HOST_COHERENT" : "", f & 8 ? " HOST_CACHED" : "");
    }
    hbuf b;
    uint64_t sizes[] = {1 << 20, 64ull << 20, 128ull << 20, 256ull << 20};
    for (int i = 0; i < 4; i++) {
        VkBufferCreateInfo bci = {VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
        bci.size = sizes[i];
        bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
        vkCreateBuffer(dev, &bci, NULL, &b.b);
        VkMemoryRequirements req;
        vkGetBufferMemoryRequirements(dev, b.b, &req);
        printf("buffer %llu MiB: memoryTypeBits 0x%x alignment %llu size %llu\n",
               (unsigned long long)(sizes[i] >> 20), req.memoryTypeBits, (unsigned long long)req.alignment,
               (unsigned long long)req.size);
        vkDestroyBuffer(dev, b.b, NULL);
    }
}

static wkv_context* guest(void) {
    wkv_vulkan_guest_options g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.instance = inst;
    g.physical_device = pd;
    g.device = dev;
    g.queue_family_index = family;
    g.get_instance_proc_addr = gipa;
    g.api_version = VK_API_VERSION_1_2;
    wkv_context* ctx = NULL;
    if (wkv_vulkan_context_create(NULL, &g, &ctx) != WKV_OK) {
        printf("guest: %s\n", wkv_last_error(NULL));
        exit(1);
    }
    return ctx;
}

/* Random-looking data: a 16 MiB host pattern per tensor kind, uploaded in tiles (the
 * library's upload path, which works on imported buffers too). */
static void fill_up(wkv_context* ctx, wkv_buffer* wb, uint64_t off, uint64_t bytes, int kind) {
    static float* pat[8];
    const uint64_t tile = 16ull << 20;
    if (!pat[kind]) {
        pat[kind] = (float*)malloc(tile);
        unsigned s = 12345u + 777u * (unsigned)kind;
        for (uint64_t i = 0; i < tile / 4; i++) {
            s = s * 1664525u + 1013904223u;
            float x = (float)(s >> 8) / 16777216.0f - 0.5f; /* [-0.5, 0.5) */
            float v = kind == 1 ? 4.0f * x : kind == 4 ? -0.05f * (x + 0.5f) : kind == 5 ? 0.05f * (x + 0.5f) : x;
            if (kind == 6) v = 0.1f * x; /* state */
            pat[kind][i] = v;
        }
    }
    for (uint64_t o = 0; o < bytes; o += tile)
        if (wkv_buffer_upload(ctx, wb, off + o, pat[kind], bytes - o < tile ? bytes - o : tile) != WKV_OK) {
            printf("upload: %s\n", wkv_last_error(ctx));
            exit(1);
        }
}

/* ------------------------------------------------------------------ forward experiment */
static int cmd_fwd(int argc, char** argv) {
    if (argc < 7) return 2;
    const int op = atoi(argv[2]);
    const int64_t B = atoll(argv[3]), T = atoll(argv[4]), H = 32, N = 64;
    const char* alloc = argv[5];
    const char* layout = argv[6];
    const int reps = argc > 7 ? atoi(argv[7]) : 5;
    const int ntok = op == 7 ? 7 : 5; /* r w k v (a b) y */
    const uint64_t elems = (uint64_t)(B * T * H * N);
    const int pad = !strncmp(layout, "pad", 3) ? atoi(layout + 3) : 1;
    const uint64_t tbytes = elems * 4 * pad;
    const uint64_t sbytes = (uint64_t)(B * H * N * N) * 4;
    int64_t shape[4] = {B, T, H, N}, sshape[4] = {B, H, N, N}, ushape[2] = {H, N};
    int64_t strides[4];
    if (!strcmp(layout, "tbHN")) {
        strides[0] = H * N, strides[1] = B * H * N, strides[2] = N, strides[3] = 1;
    } else {
        strides[0] = pad * T * H * N, strides[1] = H * N, strides[2] = N, strides[3] = 1;
    }
    int type = -1, ded = 0, big = 0, over = 1, own = !strcmp(alloc, "wkv");
    if (!strncmp(alloc, "type", 4)) type = atoi(alloc + 4);
    else if (!strcmp(alloc, "ded")) ded = 1;
    else if (!strcmp(alloc, "big")) big = 1;
    else if (!strcmp(alloc, "over4")) over = 4;
    wkv_context* ctx = NULL;
    if (own) {
        wkv_context_options o;
        memset(&o, 0, sizeof o);
        o.struct_size = sizeof o;
        o.backend = WKV_BACKEND_VULKAN;
        if (wkv_context_create(&o, &ctx) != WKV_OK) return printf("ctx: %s\n", wkv_last_error(NULL)), 1;
    } else {
        ctx = guest();
    }
    hbuf bufs[10];
    wkv_buffer* wb[10];
    uint64_t offs[10];
    const int nb = ntok + 3; /* tensors, u, state in, state out */
    uint64_t sizes[10];
    for (int i = 0; i < ntok; i++) sizes[i] = tbytes;
    sizes[ntok] = (uint64_t)(H * N) * 4;
    sizes[ntok + 1] = sizes[ntok + 2] = sbytes;
    const int kinds7[] = {0, 1, 2, 3, 4, 5, 3}, kinds6[] = {0, 7, 2, 3, 3};
    double t_alloc = now();
    if (own) {
        for (int i = 0; i < nb; i++) {
            offs[i] = 0;
            if (wkv_buffer_create(ctx, sizes[i], &wb[i]) != WKV_OK) return printf("%s\n", wkv_last_error(ctx)), 1;
            if (getenv("VKEXP_INTERLEAVE")) fill_up(ctx, wb[i], 0, sizes[i], i < ntok ? (op == 7 ? kinds7[i] : kinds6[i]) : i == ntok ? 0 : 6);
        }
    } else if (big) {
        uint64_t total = 0;
        for (int i = 0; i < nb; i++) offs[i] = total, total += (sizes[i] + 255) / 256 * 256;
        if (!make(total, type, ded, &bufs[0])) return printf("alloc failed\n"), 1;
        if (wkv_vulkan_buffer_import(ctx, bufs[0].b, total, &wb[0]) != WKV_OK) return printf("%s\n", wkv_last_error(ctx)), 1;
        for (int i = 1; i < nb; i++) bufs[i] = bufs[0], wb[i] = wb[0];
    } else {
        for (int i = 0; i < nb; i++) {
            offs[i] = 0;
            if (!make(sizes[i] * over, type, ded, &bufs[i])) return printf("alloc failed\n"), 1;
            if (wkv_vulkan_buffer_import(ctx, bufs[i].b, sizes[i] * over, &wb[i]) != WKV_OK)
                return printf("%s\n", wkv_last_error(ctx)), 1;
            if (getenv("VKEXP_ZERO")) { /* what wkv_buffer_create does */
                begin();
                vkCmdFillBuffer(cmd, bufs[i].b, 0, VK_WHOLE_SIZE, 0u);
                submit_spin();
            }
            if (getenv("VKEXP_INTERLEAVE")) fill_up(ctx, wb[i], 0, sizes[i], i < ntok ? (op == 7 ? kinds7[i] : kinds6[i]) : i == ntok ? 0 : 6);
        }
    }
    t_alloc = now() - t_alloc;
    const char* data = getenv("VKEXP_DATA");
    if (data && !strcmp(data, "bench")) { /* wkv-bench perf's inputs (contiguous layout) */
        float* h[7];
        for (int i = 0; i < 7; i++) h[i] = (float*)calloc(elems, 4);
        wkvt_rng rng;
        wkvt_rng_seed(&rng, 1);
        float* u = (float*)calloc((size_t)(H * N), 4);
        if (op == 7) wkvt_rwkv7_random(&rng, 2, WKV_DECAY_CLAMPW, B, T, H, N, h[0], h[1], h[2], h[3], h[4], h[5]);
        else wkvt_rwkv6_random(&rng, 2, WKV_DECAY_EXP_NEG_EXP, B, T, H, N, h[0], h[1], h[2], h[3], u);
        for (int i = 0; i < ntok - 1; i++) wkv_buffer_upload(ctx, wb[i], offs[i], h[i], elems * 4);
        if (getenv("VKEXP_YFILL")) fill_up(ctx, wb[ntok - 1], offs[ntok - 1], sizes[ntok - 1], 3); /* y: random */
        wkv_buffer_upload(ctx, wb[ntok], offs[ntok], u, (size_t)(H * N) * 4);
        for (int i = 0; i < 7; i++) free(h[i]);
        free(u);
    } else if (!getenv("VKEXP_INTERLEAVE")) {
        for (int i = 0; i < ntok; i++) fill_up(ctx, wb[i], offs[i], sizes[i], op == 7 ? kinds7[i] : kinds6[i]);
        fill_up(ctx, wb[ntok], offs[ntok], sizes[ntok], 0);
    }
    if (!getenv("VKEXP_INTERLEAVE")) fill_up(ctx, wb[ntok + 1], offs[ntok + 1], sizes[ntok + 1], 6);
    wkv_forward_desc f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.op = op == 7 ? WKV_OP_RWKV7 : WKV_OP_RWKV6;
    f.decay_form = op == 7 ? WKV_DECAY_CLAMPW : WKV_DECAY_EXP_NEG_EXP;
    wkv_tensor* slots7[7] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b, &f.y};
    wkv_tensor* slots6[5] = {&f.r, &f.w, &f.k, &f.v, &f.y};
    for (int i = 0; i < ntok; i++) {
        wkv_tensor* t = op == 7 ? slots7[i] : slots6[i];
        *t = wkv_tensor_make_buffer(wb[i], offs[i], WKV_DTYPE_F32, 4, shape);
        t->strides = strides;
    }
    if (op == 6) f.u = wkv_tensor_make_buffer(wb[ntok], offs[ntok], WKV_DTYPE_F32, 2, ushape);
    f.state_in = wkv_tensor_make_buffer(wb[ntok + 1], offs[ntok + 1], WKV_DTYPE_F32, 4, sshape);
    f.state_out = wkv_tensor_make_buffer(wb[ntok + 2], offs[ntok + 2], WKV_DTYPE_F32, 4, sshape);
    double gpu[64] = {0}, wall[64] = {0};
    for (int r = -1; r < reps && !own; r++) {
        begin();
        vkCmdResetQueryPool(cmd, qp, 0, 2);
        barrier_all();
        vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, qp, 0);
        if (wkv_vulkan_record_forward(ctx, cmd, &f) != WKV_OK) return printf("record: %s\n", wkv_last_error(ctx)), 1;
        vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qp, 1);
        double w = submit_spin();
        if (r >= 0) wall[r] = w, gpu[r] = gpu_seconds();
    }
    /* the same bindings through the synchronous call (submits and waits itself) */
    double sync[64];
    for (int r = -1; r < reps; r++) {
        double t0 = now();
        if (wkv_forward(ctx, &f) != WKV_OK) return printf("sync: %s\n", wkv_last_error(ctx)), 1;
        if (r >= 0) sync[r] = now() - t0;
    }
    const double tens = (double)ntok * tbytes / pad / 1e6;
    printf("RESULT op=%d B=%lld T=%lld alloc=%s layout=%s tensors=%.0fMB gpu_ms=%.3f wall_ms=%.3f sync_ms=%.3f "
           "us_per_step=%.3f (alloc %.1f ms)\n",
           op, (long long)B, (long long)T, alloc, layout, tens, 1e3 * median(gpu, reps), 1e3 * median(wall, reps),
           1e3 * median(sync, reps), 1e6 * median(gpu, reps) / T, 1e3 * t_alloc);
    fflush(stdout);
    for (int i = 0; i < (big ? 1 : nb); i++) wkv_buffer_destroy(wb[i]);
    if (big)
        for (int i = 1; i < nb; i++) (void)i;
    wkv_context_destroy(ctx);
    vkDeviceWaitIdle(dev);
    if (!own)
        for (int i = 0; i < (big ? 1 : nb); i++) unmake(&bufs[i]);
    return 0;
}

/* ------------------------------------------------------------------ which input is slow */
/* vkexp mix B T: RWKV-7 with wkv-bench's inputs in one tensor at a time (the others random
 * tiles), then all of them, then all of them with the low 8 mantissa bits of every value
 * randomised (the values move by < 2^-15 relative: arithmetic would not notice, a memory
 * system that compresses bit patterns would). Kernel time by GPU timestamps, median of 3. */
static int cmd_mix(int argc, char** argv) {
    if (argc < 4) return 2;
    const int64_t B = atoll(argv[2]), T = atoll(argv[3]), H = 32, N = 64;
    const uint64_t elems = (uint64_t)(B * T * H * N), tb = elems * 4, sb = (uint64_t)(B * H * N * N) * 4;
    int64_t shape[4] = {B, T, H, N}, sshape[4] = {B, H, N, N};
    wkv_context* ctx = guest();
    hbuf bufs[9];
    wkv_buffer* wb[9];
    for (int i = 0; i < 9; i++) {
        const uint64_t sz = i < 7 ? tb : sb;
        if (!make(sz, -1, 0, &bufs[i]) || wkv_vulkan_buffer_import(ctx, bufs[i].b, sz, &wb[i]) != WKV_OK)
            return printf("alloc failed\n"), 1;
    }
    float* h[6];
    for (int i = 0; i < 6; i++) h[i] = (float*)malloc(tb);
    wkvt_rng rng;
    wkvt_rng_seed(&rng, 1);
    wkvt_rwkv7_random(&rng, 2, WKV_DECAY_CLAMPW, B, T, H, N, h[0], h[1], h[2], h[3], h[4], h[5]);
    const int kinds[7] = {0, 1, 2, 3, 4, 5, 3};
    fill_up(ctx, wb[6], 0, tb, 3);
    fill_up(ctx, wb[7], 0, sb, 6);
    wkv_forward_desc f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = WKV_DECAY_CLAMPW;
    wkv_tensor* slots[7] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b, &f.y};
    for (int i = 0; i < 7; i++) *slots[i] = wkv_tensor_make_buffer(wb[i], 0, WKV_DTYPE_F32, 4, shape);
    f.state_in = wkv_tensor_make_buffer(wb[7], 0, WKV_DTYPE_F32, 4, sshape);
    f.state_out = wkv_tensor_make_buffer(wb[8], 0, WKV_DTYPE_F32, 4, sshape);
    const char* names[6] = {"r", "w", "k", "v", "a", "b"};
    /* the most telling first: all, all perturbed, then one tensor at a time (-1: none) */
    const int order[9] = {6, 7, 1, 4, 5, 0, 2, 3, -1};
    float* hp[6];
    for (int i = 0; i < 6; i++) {
        unsigned x = 987654321u + 17u * (unsigned)i;
        hp[i] = (float*)malloc(tb);
        for (uint64_t e = 0; e < elems; e++) {
            x = x * 1664525u + 1013904223u;
            uint32_t u;
            memcpy(&u, &h[i][e], 4);
            u ^= (x >> 24) & 0xffu;
            memcpy(&hp[i][e], &u, 4);
        }
    }
    for (int oi = 0; oi < 9; oi++) {
        const int cfg = order[oi];
        for (int i = 0; i < 6; i++) {
            const int bench = cfg == i || cfg >= 6;
            if (bench) wkv_buffer_upload(ctx, wb[i], 0, cfg == 7 ? hp[i] : h[i], tb);
            else fill_up(ctx, wb[i], 0, tb, kinds[i]);
        }
        double gpu[3];
        for (int r = -1; r < 3; r++) {
            begin();
            vkCmdResetQueryPool(cmd, qp, 0, 2);
            barrier_all();
            vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, qp, 0);
            if (wkv_vulkan_record_forward(ctx, cmd, &f) != WKV_OK) return printf("record: %s\n", wkv_last_error(ctx)), 1;
            vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qp, 1);
            submit_spin();
            if (r >= 0) gpu[r] = gpu_seconds();
        }
        printf("MIX B=%lld T=%lld bench inputs: %-14s gpu_ms=%.3f\n", (long long)B, (long long)T,
               cfg < 0 ? "none" : cfg < 6 ? names[cfg] : cfg == 6 ? "all" : "all+lowbits", 1e3 * median(gpu, 3));
        fflush(stdout);
    }
    return 0;
}

/* ------------------------------------------------------------------ decode floors */
static int cmd_floor(void) {
    const int reps = 200;
    double a[200], g[200];
    for (int r = 0; r < reps; r++) {
        begin();
        a[r] = submit_spin();
    }
    printf("FLOOR empty command buffer submit+spin: median %.2f us (min %.2f)\n", 1e6 * median(a, reps), 1e6 * a[0]);
    for (int r = 0; r < reps; r++) {
        begin();
        vkCmdResetQueryPool(cmd, qp, 0, 2);
        vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, qp, 0);
        vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qp, 1);
        a[r] = submit_spin();
    }
    printf("FLOOR timestamps-only submit+spin: median %.2f us\n", 1e6 * median(a, reps));
    /* pre-recorded, resubmitted as is */
    begin();
    vkEndCommandBuffer(cmd);
    for (int r = 0; r < reps; r++) {
        VkSubmitInfo si = {VK_STRUCTURE_TYPE_SUBMIT_INFO};
        si.commandBufferCount = 1;
        si.pCommandBuffers = &cmd;
        double t0 = now();
        vkQueueSubmit(queue, 1, &si, fence);
        while (vkGetFenceStatus(dev, fence) == VK_NOT_READY) {
        }
        a[r] = now() - t0;
        vkResetFences(dev, 1, &fence);
    }
    printf("FLOOR resubmit of an empty recorded command buffer: median %.2f us\n", 1e6 * median(a, reps));

    int64_t Bs[] = {1, 64, 256};
    for (int bi = 0; bi < 3; bi++) {
        const int64_t B = Bs[bi], H = 32, N = 64;
        int64_t shape[4] = {B, 1, H, N}, sshape[4] = {B, H, N, N};
        wkv_context* ctx = guest();
        hbuf io, st;
        const uint64_t hn = (uint64_t)(B * H * N) * 4, sb = (uint64_t)(B * H * N * N) * 4;
        make(7 * hn, -1, 0, &io);
        make(sb, -1, 0, &st);
        wkv_buffer *wio, *wst;
        wkv_vulkan_buffer_import(ctx, io.b, 7 * hn, &wio);
        wkv_vulkan_buffer_import(ctx, st.b, sb, &wst);
        fill_up(ctx, wio, 0, 7 * hn, 0);
        fill_up(ctx, wst, 0, sb, 6);
        wkv_forward_desc f;
        memset(&f, 0, sizeof f);
        f.struct_size = sizeof f;
        f.op = WKV_OP_RWKV7;
        f.decay_form = WKV_DECAY_CLAMPW;
        wkv_tensor* slots[7] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b, &f.y};
        for (int i = 0; i < 7; i++) *slots[i] = wkv_tensor_make_buffer(wio, i * hn, WKV_DTYPE_F32, 4, shape);
        f.state_in = f.state_out = wkv_tensor_make_buffer(wst, 0, WKV_DTYPE_F32, 4, sshape);
        double rec[200];
        for (int r = -1; r < reps; r++) {
            double t0 = now();
            begin();
            vkCmdResetQueryPool(cmd, qp, 0, 2);
            barrier_all();
            vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, qp, 0);
            wkv_vulkan_record_forward(ctx, cmd, &f);
            vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qp, 1);
            double t1 = now();
            double w = submit_spin();
            if (r >= 0) rec[r] = t1 - t0, a[r] = w, g[r] = gpu_seconds();
        }
        double s[200];
        for (int r = -1; r < reps; r++) {
            double t0 = now();
            if (wkv_forward(ctx, &f) != WKV_OK) return printf("%s\n", wkv_last_error(ctx)), 1;
            if (r >= 0) s[r] = now() - t0;
        }
        printf("DECODE B=%lld: guest record %.2f us + submit..fence %.2f us (gpu %.2f us between timestamps); "
               "synchronous wkv_forward %.2f us\n",
               (long long)B, 1e6 * median(rec, reps), 1e6 * median(a, reps), 1e6 * median(g, reps), 1e6 * median(s, reps));
        /* K steps recorded into one command buffer, one context each (the ring of size 1) */
        enum { K = 16 };
        wkv_context* cs[K];
        wkv_buffer *cio[K], *cst[K];
        for (int k = 0; k < K; k++) {
            cs[k] = guest();
            wkv_vulkan_buffer_import(cs[k], io.b, 7 * hn, &cio[k]);
            wkv_vulkan_buffer_import(cs[k], st.b, sb, &cst[k]);
        }
        double kk[20];
        for (int r = -1; r < 20; r++) {
            begin();
            vkCmdResetQueryPool(cmd, qp, 0, 2);
            barrier_all();
            vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, qp, 0);
            for (int k = 0; k < K; k++) {
                wkv_forward_desc fk = f;
                wkv_tensor* sl[7] = {&fk.r, &fk.w, &fk.k, &fk.v, &fk.a, &fk.b, &fk.y};
                for (int i = 0; i < 7; i++) sl[i]->data = cio[k];
                fk.state_in.data = fk.state_out.data = cst[k];
                if (k) barrier_all();
                wkv_vulkan_record_forward(cs[k], cmd, &fk);
            }
            vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qp, 1);
            double w = submit_spin();
            if (r >= 0) kk[r] = w, g[r] = gpu_seconds();
        }
        printf("DECODE B=%lld: %d steps in one command buffer: %.2f us per step wall, %.2f us per step gpu\n",
               (long long)B, K, 1e6 * median(kk, 20) / K, 1e6 * median(g, 20) / K);
        for (int k = 0; k < K; k++) {
            wkv_buffer_destroy(cio[k]);
            wkv_buffer_destroy(cst[k]);
            wkv_context_destroy(cs[k]);
        }
        wkv_buffer_destroy(wio);
        wkv_buffer_destroy(wst);
        wkv_context_destroy(ctx);
        vkDeviceWaitIdle(dev);
        unmake(&io);
        unmake(&st);
    }
    return 0;
}

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    setup();
    if (!strcmp(argv[1], "mem")) return print_mem(), 0;
    if (!strcmp(argv[1], "fwd")) return cmd_fwd(argc, argv);
    if (!strcmp(argv[1], "floor")) return cmd_floor();
    if (!strcmp(argv[1], "mix")) return cmd_mix(argc, argv);
    return 2;
}
