/* An engine-style host of libwkv's Vulkan guest mode (wkv_vulkan.h).
 *
 * The "engine" owns everything Vulkan: it creates its own VkInstance, VkDevice and queue
 * (through libvulkan.so.1), keeps the RNN state of an RWKV-7 layer in a VkBuffer of its own,
 * and per token writes the token's r w k v a b into another of its buffers, records the WKV
 * step into its own command buffer (wkv_vulkan_record_forward, between the barriers wkv_vulkan.h
 * asks for), submits and waits with its own fence — the way a frame loop would. libwkv only
 * gets the handles (wkv_vulkan_context_create) and wraps the engine's buffers
 * (wkv_vulkan_buffer_import) without owning them.
 *
 * At the end the same tokens go through the CPU backend in one call and the two are compared.
 * Exit status: 0 on a match, 1 on a mismatch or error, 77 when there is no Vulkan device. */
#define VK_NO_PROTOTYPES
#include <vulkan/vulkan_core.h>

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <wkv/wkv.h>
#include <wkv/wkv_vulkan.h>

enum { H = 2, N = 64, HN = H * N, TOKENS = 16 };

static PFN_vkGetInstanceProcAddr gipa;
#define FN(name) static PFN_##name name;
FN(vkCreateInstance) FN(vkDestroyInstance) FN(vkEnumeratePhysicalDevices) FN(vkGetPhysicalDeviceQueueFamilyProperties)
FN(vkGetPhysicalDeviceMemoryProperties) FN(vkCreateDevice) FN(vkDestroyDevice) FN(vkGetDeviceQueue) FN(vkCreateBuffer)
FN(vkDestroyBuffer) FN(vkGetBufferMemoryRequirements) FN(vkAllocateMemory) FN(vkFreeMemory) FN(vkBindBufferMemory)
FN(vkMapMemory) FN(vkCreateCommandPool) FN(vkDestroyCommandPool) FN(vkAllocateCommandBuffers) FN(vkResetCommandBuffer)
FN(vkBeginCommandBuffer) FN(vkEndCommandBuffer) FN(vkCmdPipelineBarrier) FN(vkQueueSubmit) FN(vkCreateFence)
FN(vkDestroyFence) FN(vkWaitForFences) FN(vkResetFences) FN(vkDeviceWaitIdle)
#undef FN

typedef struct engine_buffer {
    VkBuffer buffer;
    VkDeviceMemory memory;
    float* mapped;
    uint64_t bytes;
} engine_buffer;

static int make_buffer(VkPhysicalDevice pd, VkDevice dev, uint64_t bytes, engine_buffer* out) {
    VkBufferCreateInfo bci;
    memset(&bci, 0, sizeof bci);
    bci.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    bci.size = bytes;
    bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    if (vkCreateBuffer(dev, &bci, NULL, &out->buffer) != VK_SUCCESS) return 0;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev, out->buffer, &req);
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    const VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    uint32_t type = UINT32_MAX;
    for (uint32_t i = 0; i < mp.memoryTypeCount && type == UINT32_MAX; i++)
        if ((req.memoryTypeBits & (1u << i)) && (mp.memoryTypes[i].propertyFlags & want) == want) type = i;
    VkMemoryAllocateInfo mai;
    memset(&mai, 0, sizeof mai);
    mai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    mai.allocationSize = req.size;
    mai.memoryTypeIndex = type;
    if (type == UINT32_MAX || vkAllocateMemory(dev, &mai, NULL, &out->memory) != VK_SUCCESS) return 0;
    void* p = NULL;
    if (vkBindBufferMemory(dev, out->buffer, out->memory, 0) != VK_SUCCESS ||
        vkMapMemory(dev, out->memory, 0, VK_WHOLE_SIZE, 0, &p) != VK_SUCCESS)
        return 0;
    out->mapped = (float*)p;
    out->bytes = bytes;
    memset(p, 0, bytes);
    return 1;
}

static void barrier(VkCommandBuffer cmd, VkPipelineStageFlags src, VkAccessFlags sa, VkPipelineStageFlags dst,
                    VkAccessFlags da) {
    VkMemoryBarrier mb;
    memset(&mb, 0, sizeof mb);
    mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    mb.srcAccessMask = sa;
    mb.dstAccessMask = da;
    vkCmdPipelineBarrier(cmd, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
}

static float frand(unsigned* s) {
    *s = *s * 1664525u + 1013904223u;
    return ((float)(*s >> 8) / 16777216.0f) - 0.5f;
}

int main(void) {
    void* lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return printf("no libvulkan.so.1: skipped\n"), 77;
    gipa = (PFN_vkGetInstanceProcAddr)dlsym(lib, "vkGetInstanceProcAddr");
    VkInstance inst = VK_NULL_HANDLE;
#define LOAD(name) name = (PFN_##name)gipa(inst, #name)
    LOAD(vkCreateInstance);
    VkApplicationInfo app;
    memset(&app, 0, sizeof app);
    app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
    app.pApplicationName = "wkv vulkan_engine example";
    app.apiVersion = VK_API_VERSION_1_1;
    VkInstanceCreateInfo ici;
    memset(&ici, 0, sizeof ici);
    ici.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    ici.pApplicationInfo = &app;
    if (vkCreateInstance(&ici, NULL, &inst) != VK_SUCCESS) return printf("no Vulkan instance: skipped\n"), 77;
    LOAD(vkDestroyInstance); LOAD(vkEnumeratePhysicalDevices); LOAD(vkGetPhysicalDeviceQueueFamilyProperties);
    LOAD(vkGetPhysicalDeviceMemoryProperties); LOAD(vkCreateDevice); LOAD(vkDestroyDevice); LOAD(vkGetDeviceQueue);
    LOAD(vkCreateBuffer); LOAD(vkDestroyBuffer); LOAD(vkGetBufferMemoryRequirements); LOAD(vkAllocateMemory);
    LOAD(vkFreeMemory); LOAD(vkBindBufferMemory); LOAD(vkMapMemory); LOAD(vkCreateCommandPool);
    LOAD(vkDestroyCommandPool); LOAD(vkAllocateCommandBuffers); LOAD(vkResetCommandBuffer);
    LOAD(vkBeginCommandBuffer); LOAD(vkEndCommandBuffer); LOAD(vkCmdPipelineBarrier); LOAD(vkQueueSubmit);
    LOAD(vkCreateFence); LOAD(vkDestroyFence); LOAD(vkWaitForFences); LOAD(vkResetFences); LOAD(vkDeviceWaitIdle);
#undef LOAD
    uint32_t nd = 1;
    VkPhysicalDevice pd = VK_NULL_HANDLE;
    if (vkEnumeratePhysicalDevices(inst, &nd, &pd) < 0 || nd == 0) return printf("no Vulkan device: skipped\n"), 77;
    uint32_t nq = 0, family = UINT32_MAX;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, NULL);
    VkQueueFamilyProperties qf[16];
    if (nq > 16) nq = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, qf);
    for (uint32_t i = 0; i < nq && family == UINT32_MAX; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) family = i;
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci;
    memset(&qci, 0, sizeof qci);
    qci.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    qci.queueFamilyIndex = family;
    qci.queueCount = 1;
    qci.pQueuePriorities = &prio;
    VkDeviceCreateInfo dci;
    memset(&dci, 0, sizeof dci);
    dci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    VkDevice dev = VK_NULL_HANDLE;
    if (family == UINT32_MAX || vkCreateDevice(pd, &dci, NULL, &dev) != VK_SUCCESS)
        return printf("cannot create a device\n"), 1;
    VkQueue queue;
    vkGetDeviceQueue(dev, family, 0, &queue);
    VkCommandPoolCreateInfo pci;
    memset(&pci, 0, sizeof pci);
    pci.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pci.queueFamilyIndex = family;
    VkCommandPool pool;
    vkCreateCommandPool(dev, &pci, NULL, &pool);
    VkCommandBufferAllocateInfo cai;
    memset(&cai, 0, sizeof cai);
    cai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    cai.commandPool = pool;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    VkCommandBuffer cmd;
    vkAllocateCommandBuffers(dev, &cai, &cmd);
    VkFenceCreateInfo fci;
    memset(&fci, 0, sizeof fci);
    fci.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    VkFence fence;
    vkCreateFence(dev, &fci, NULL, &fence);

    /* the engine's buffers: the layer's RNN state [1,H,N,N] and one token's inputs + output */
    engine_buffer state, io;
    if (!make_buffer(pd, dev, sizeof(float) * HN * N, &state) || !make_buffer(pd, dev, sizeof(float) * 7 * HN, &io))
        return printf("cannot allocate buffers\n"), 1;

    /* libwkv on the engine's device */
    wkv_vulkan_guest_options g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.instance = inst;
    g.physical_device = pd;
    g.device = dev;
    g.queue_family_index = family;
    g.get_instance_proc_addr = gipa;
    g.api_version = VK_API_VERSION_1_1;
    wkv_context* ctx = NULL;
    if (wkv_vulkan_context_create(NULL, &g, &ctx) != WKV_OK) return printf("%s\n", wkv_last_error(NULL)), 1;
    wkv_buffer *wstate = NULL, *wio = NULL;
    if (wkv_vulkan_buffer_import(ctx, state.buffer, state.bytes, &wstate) != WKV_OK ||
        wkv_vulkan_buffer_import(ctx, io.buffer, io.bytes, &wio) != WKV_OK)
        return printf("%s\n", wkv_last_error(ctx)), 1;

    int64_t tshape[4] = {1, 1, H, N}, sshape[4] = {1, H, N, N};
    wkv_forward_desc f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.op = WKV_OP_RWKV7;
    f.decay_form = WKV_DECAY_CLAMPW;
    wkv_tensor* slots[7] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b, &f.y};
    for (int i = 0; i < 7; i++) *slots[i] = wkv_tensor_make_buffer(wio, (uint64_t)i * HN * 4, WKV_DTYPE_F32, 4, tshape);
    f.state_in = f.state_out = wkv_tensor_make_buffer(wstate, 0, WKV_DTYPE_F32, 4, sshape); /* stepped in place */

    /* the token stream (kept for the CPU check) */
    static float tokens[TOKENS][6][HN], y_gpu[TOKENS][HN];
    unsigned seed = 12345;
    for (int t = 0; t < TOKENS; t++)
        for (int e = 0; e < HN; e++) {
            float kk = frand(&seed), a = frand(&seed) * 0.2f;
            tokens[t][0][e] = frand(&seed);        /* r */
            tokens[t][1][e] = frand(&seed) * 4.0f; /* w (clampw) */
            tokens[t][2][e] = kk;                  /* k */
            tokens[t][3][e] = frand(&seed);        /* v */
            tokens[t][4][e] = -a;                  /* a */
            tokens[t][5][e] = a * 0.5f;            /* b */
        }

    for (int t = 0; t < TOKENS; t++) { /* the frame loop */
        for (int i = 0; i < 6; i++) memcpy(io.mapped + i * HN, tokens[t][i], sizeof(float) * HN);
        vkResetCommandBuffer(cmd, 0);
        VkCommandBufferBeginInfo bi;
        memset(&bi, 0, sizeof bi);
        bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
        bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
        vkBeginCommandBuffer(cmd, &bi);
        /* before: the host's writes (and the previous step's state) visible to compute */
        barrier(cmd, VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                VK_ACCESS_HOST_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
        if (wkv_vulkan_record_forward(ctx, cmd, &f) != WKV_OK) return printf("%s\n", wkv_last_error(ctx)), 1;
        /* after: y read by the host */
        barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                VK_ACCESS_HOST_READ_BIT);
        vkEndCommandBuffer(cmd);
        VkSubmitInfo si;
        memset(&si, 0, sizeof si);
        si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
        si.commandBufferCount = 1;
        si.pCommandBuffers = &cmd;
        vkQueueSubmit(queue, 1, &si, fence);
        vkWaitForFences(dev, 1, &fence, VK_TRUE, UINT64_MAX);
        vkResetFences(dev, 1, &fence);
        memcpy(y_gpu[t], io.mapped + 6 * HN, sizeof(float) * HN);
    }

    /* the same tokens on the CPU backend, in one call */
    static float seq[6][TOKENS * HN], y_cpu[TOKENS * HN], s_cpu[HN * N];
    for (int t = 0; t < TOKENS; t++)
        for (int i = 0; i < 6; i++) memcpy(seq[i] + t * HN, tokens[t][i], sizeof(float) * HN);
    wkv_context_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.backend = WKV_BACKEND_CPU;
    wkv_context* cpu = NULL;
    if (wkv_context_create(&o, &cpu) != WKV_OK) return printf("%s\n", wkv_last_error(NULL)), 1;
    int64_t qshape[4] = {1, TOKENS, H, N};
    wkv_forward_desc c = f;
    c.r = wkv_tensor_make(seq[0], WKV_DTYPE_F32, 4, qshape);
    c.w = wkv_tensor_make(seq[1], WKV_DTYPE_F32, 4, qshape);
    c.k = wkv_tensor_make(seq[2], WKV_DTYPE_F32, 4, qshape);
    c.v = wkv_tensor_make(seq[3], WKV_DTYPE_F32, 4, qshape);
    c.a = wkv_tensor_make(seq[4], WKV_DTYPE_F32, 4, qshape);
    c.b = wkv_tensor_make(seq[5], WKV_DTYPE_F32, 4, qshape);
    c.y = wkv_tensor_make(y_cpu, WKV_DTYPE_F32, 4, qshape);
    memset(&c.state_in, 0, sizeof c.state_in); /* the engine's state started at zero */
    c.state_out = wkv_tensor_make(s_cpu, WKV_DTYPE_F32, 4, sshape);
    if (wkv_forward(cpu, &c) != WKV_OK) return printf("%s\n", wkv_last_error(cpu)), 1;
    double num = 0, den = 0, snum = 0, sden = 0;
    for (int t = 0; t < TOKENS; t++)
        for (int e = 0; e < HN; e++) {
            double d = (double)y_gpu[t][e] - y_cpu[t * HN + e];
            num += d * d;
            den += (double)y_cpu[t * HN + e] * y_cpu[t * HN + e];
        }
    for (int e = 0; e < HN * N; e++) {
        double d = (double)state.mapped[e] - s_cpu[e];
        snum += d * d;
        sden += (double)s_cpu[e] * s_cpu[e];
    }
    const double ey = sqrt(num / den), es = sqrt(snum / sden);
    printf("%d tokens stepped on the engine's device (%s): y vs CPU %.2e, state vs CPU %.2e\n", TOKENS,
           "guest mode", ey, es);

    wkv_buffer_destroy(wio);
    wkv_buffer_destroy(wstate);
    wkv_context_destroy(ctx);
    wkv_context_destroy(cpu);
    vkDeviceWaitIdle(dev);
    vkDestroyBuffer(dev, state.buffer, NULL);
    vkFreeMemory(dev, state.memory, NULL);
    vkDestroyBuffer(dev, io.buffer, NULL);
    vkFreeMemory(dev, io.memory, NULL);
    vkDestroyFence(dev, fence, NULL);
    vkDestroyCommandPool(dev, pool, NULL);
    vkDestroyDevice(dev, NULL);
    vkDestroyInstance(inst, NULL);
    dlclose(lib);
    return ey < 1e-4 && es < 1e-4 ? 0 : 1;
}
