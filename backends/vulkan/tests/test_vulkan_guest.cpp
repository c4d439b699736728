// Vulkan guest mode (wkv_vulkan.h): the test is the host. It creates its own VkInstance (with
// the Khronos validation layer and a messenger that counts messages, when the layer is
// installed), VkDevice and queue through libvulkan.so.1, shares them with
// wkv_vulkan_context_create, imports one host-visible VkBuffer holding every tensor, records
// RWKV-7/6/4 forward and RWKV-6/4 backward into its own command buffer with the documented
// barriers, submits, and compares the results (read straight from the mapped memory) with the
// CPU backend on the same inputs. Also: synchronous calls on a guest context, the refusals.
#include "wkv_doctest.h"

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan_core.h>

#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"
#include "test_util_ops.h"
#include "wkv/wkv_vulkan.h"

using namespace wkvtest;

namespace {

std::atomic<int> g_messages{0};

VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT sev,
                                          VkDebugUtilsMessageTypeFlagsEXT, const VkDebugUtilsMessengerCallbackDataEXT* d,
                                          void*) {
    if (sev >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
        ++g_messages;
        MESSAGE("validation: " << (d && d->pMessage ? d->pMessage : "?"));
    }
    return VK_FALSE;
}

// The host: instance, device, queue, one command pool, one big host-visible buffer.
struct Host {
    void* lib = nullptr;
    PFN_vkGetInstanceProcAddr gipa = nullptr;
    VkInstance inst = VK_NULL_HANDLE;
    VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
    VkPhysicalDevice phys = VK_NULL_HANDLE;
    VkDevice dev = VK_NULL_HANDLE;
    uint32_t family = 0;
    VkQueue queue = VK_NULL_HANDLE;
    VkCommandPool pool = VK_NULL_HANDLE;
    VkBuffer buf = VK_NULL_HANDLE;
    VkDeviceMemory mem = VK_NULL_HANDLE;
    char* mapped = nullptr;
    uint64_t size = 0;
    bool ok = false;

#define HOST_FN(name) PFN_##name name = nullptr;
    HOST_FN(vkCreateInstance) HOST_FN(vkDestroyInstance) HOST_FN(vkEnumeratePhysicalDevices)
    HOST_FN(vkGetPhysicalDeviceQueueFamilyProperties) HOST_FN(vkGetPhysicalDeviceMemoryProperties)
    HOST_FN(vkCreateDevice) HOST_FN(vkDestroyDevice) HOST_FN(vkGetDeviceQueue) HOST_FN(vkCreateBuffer)
    HOST_FN(vkDestroyBuffer) HOST_FN(vkGetBufferMemoryRequirements) HOST_FN(vkAllocateMemory)
    HOST_FN(vkFreeMemory) HOST_FN(vkBindBufferMemory) HOST_FN(vkMapMemory) HOST_FN(vkCreateCommandPool)
    HOST_FN(vkDestroyCommandPool) HOST_FN(vkAllocateCommandBuffers) HOST_FN(vkBeginCommandBuffer)
    HOST_FN(vkEndCommandBuffer) HOST_FN(vkCmdPipelineBarrier) HOST_FN(vkQueueSubmit) HOST_FN(vkQueueWaitIdle)
    HOST_FN(vkDeviceWaitIdle) HOST_FN(vkEnumerateInstanceLayerProperties)
    HOST_FN(vkCreateDebugUtilsMessengerEXT) HOST_FN(vkDestroyDebugUtilsMessengerEXT)
#undef HOST_FN

    explicit Host(uint64_t bytes) {
        lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) return;
        gipa = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(lib, "vkGetInstanceProcAddr"));
#define LOAD(name) name = reinterpret_cast<PFN_##name>(gipa(inst, #name))
        LOAD(vkCreateInstance);
        LOAD(vkEnumerateInstanceLayerProperties);
        uint32_t nl = 0;
        vkEnumerateInstanceLayerProperties(&nl, nullptr);
        std::vector<VkLayerProperties> layers(nl);
        vkEnumerateInstanceLayerProperties(&nl, layers.data());
        bool validation = false;
        for (auto& l : layers) validation |= std::strcmp(l.layerName, "VK_LAYER_KHRONOS_validation") == 0;
        const char* layer = "VK_LAYER_KHRONOS_validation";
        const char* ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
        VkApplicationInfo app{};
        app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
        app.apiVersion = VK_API_VERSION_1_1;
        VkInstanceCreateInfo ici{};
        ici.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
        ici.pApplicationInfo = &app;
        if (validation) {
            ici.enabledLayerCount = 1;
            ici.ppEnabledLayerNames = &layer;
            ici.enabledExtensionCount = 1;
            ici.ppEnabledExtensionNames = &ext;
        }
        if (vkCreateInstance(&ici, nullptr, &inst) != VK_SUCCESS) return;
        LOAD(vkDestroyInstance); LOAD(vkEnumeratePhysicalDevices); LOAD(vkGetPhysicalDeviceQueueFamilyProperties);
        LOAD(vkGetPhysicalDeviceMemoryProperties); LOAD(vkCreateDevice); LOAD(vkDestroyDevice);
        LOAD(vkGetDeviceQueue); LOAD(vkCreateBuffer); LOAD(vkDestroyBuffer); LOAD(vkGetBufferMemoryRequirements);
        LOAD(vkAllocateMemory); LOAD(vkFreeMemory); LOAD(vkBindBufferMemory); LOAD(vkMapMemory);
        LOAD(vkCreateCommandPool); LOAD(vkDestroyCommandPool); LOAD(vkAllocateCommandBuffers);
        LOAD(vkBeginCommandBuffer); LOAD(vkEndCommandBuffer); LOAD(vkCmdPipelineBarrier); LOAD(vkQueueSubmit);
        LOAD(vkQueueWaitIdle); LOAD(vkDeviceWaitIdle);
        LOAD(vkCreateDebugUtilsMessengerEXT); LOAD(vkDestroyDebugUtilsMessengerEXT);
#undef LOAD
        if (validation && vkCreateDebugUtilsMessengerEXT) {
            VkDebugUtilsMessengerCreateInfoEXT mi{};
            mi.sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT;
            mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
            mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT;
            mi.pfnUserCallback = on_message;
            vkCreateDebugUtilsMessengerEXT(inst, &mi, nullptr, &messenger);
        }
        uint32_t nd = 1;
        if (vkEnumeratePhysicalDevices(inst, &nd, &phys) < 0 || nd == 0) return;
        uint32_t nq = 0;
        vkGetPhysicalDeviceQueueFamilyProperties(phys, &nq, nullptr);
        std::vector<VkQueueFamilyProperties> qf(nq);
        vkGetPhysicalDeviceQueueFamilyProperties(phys, &nq, qf.data());
        family = UINT32_MAX;
        for (uint32_t i = 0; i < nq && family == UINT32_MAX; i++)
            if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) family = i;
        if (family == UINT32_MAX) return;
        float prio = 1.0f;
        VkDeviceQueueCreateInfo qci{};
        qci.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
        qci.queueFamilyIndex = family;
        qci.queueCount = 1;
        qci.pQueuePriorities = &prio;
        VkDeviceCreateInfo dci{};
        dci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
        dci.queueCreateInfoCount = 1;
        dci.pQueueCreateInfos = &qci;
        if (vkCreateDevice(phys, &dci, nullptr, &dev) != VK_SUCCESS) return;
        vkGetDeviceQueue(dev, family, 0, &queue);
        VkCommandPoolCreateInfo pci{};
        pci.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
        pci.queueFamilyIndex = family;
        if (vkCreateCommandPool(dev, &pci, nullptr, &pool) != VK_SUCCESS) return;
        // one host-visible, coherent buffer for every tensor
        size = bytes;
        VkBufferCreateInfo bci{};
        bci.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
        bci.size = bytes;
        bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
        if (vkCreateBuffer(dev, &bci, nullptr, &buf) != VK_SUCCESS) return;
        VkMemoryRequirements req;
        vkGetBufferMemoryRequirements(dev, buf, &req);
        VkPhysicalDeviceMemoryProperties mp;
        vkGetPhysicalDeviceMemoryProperties(phys, &mp);
        const VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
        uint32_t type = UINT32_MAX;
        for (uint32_t i = 0; i < mp.memoryTypeCount && type == UINT32_MAX; i++)
            if ((req.memoryTypeBits & (1u << i)) && (mp.memoryTypes[i].propertyFlags & want) == want) type = i;
        if (type == UINT32_MAX) return;
        VkMemoryAllocateInfo mai{};
        mai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
        mai.allocationSize = req.size;
        mai.memoryTypeIndex = type;
        if (vkAllocateMemory(dev, &mai, nullptr, &mem) != VK_SUCCESS) return;
        if (vkBindBufferMemory(dev, buf, mem, 0) != VK_SUCCESS) return;
        void* p = nullptr;
        if (vkMapMemory(dev, mem, 0, VK_WHOLE_SIZE, 0, &p) != VK_SUCCESS) return;
        mapped = static_cast<char*>(p);
        ok = true;
    }
    ~Host() {
        if (dev) {
            vkDeviceWaitIdle(dev);
            if (buf) vkDestroyBuffer(dev, buf, nullptr);
            if (mem) vkFreeMemory(dev, mem, nullptr);
            if (pool) vkDestroyCommandPool(dev, pool, nullptr);
            vkDestroyDevice(dev, nullptr);
        }
        if (messenger) vkDestroyDebugUtilsMessengerEXT(inst, messenger, nullptr);
        if (inst) vkDestroyInstance(inst, nullptr);
        if (lib) dlclose(lib);
    }

    // Records through `body` into a fresh command buffer between the documented barriers,
    // submits and waits.
    template <class F>
    void run(F&& body) {
        VkCommandBuffer cmd = VK_NULL_HANDLE;
        VkCommandBufferAllocateInfo cai{};
        cai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
        cai.commandPool = pool;
        cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
        cai.commandBufferCount = 1;
        REQUIRE(vkAllocateCommandBuffers(dev, &cai, &cmd) == VK_SUCCESS);
        VkCommandBufferBeginInfo bi{};
        bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
        bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
        REQUIRE(vkBeginCommandBuffer(cmd, &bi) == VK_SUCCESS);
        VkMemoryBarrier mb{};
        mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
        mb.srcAccessMask = VK_ACCESS_HOST_WRITE_BIT;
        mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
        vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_HOST_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0,
                             nullptr, 0, nullptr);
        body(cmd);
        mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
        mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
        vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0,
                             nullptr, 0, nullptr);
        REQUIRE(vkEndCommandBuffer(cmd) == VK_SUCCESS);
        VkSubmitInfo si{};
        si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
        si.commandBufferCount = 1;
        si.pCommandBuffers = &cmd;
        REQUIRE(vkQueueSubmit(queue, 1, &si, VK_NULL_HANDLE) == VK_SUCCESS);
        REQUIRE(vkQueueWaitIdle(queue) == VK_SUCCESS);
    }
};

// Tensors carved out of the host's buffer (float32, contiguous), at 256-byte boundaries.
struct Carver {
    Host& h;
    wkv_buffer* wb;
    uint64_t at = 0;
    struct T {
        wkv_tensor t;
        float* p;
        size_t n;
    };
    T make(std::vector<int64_t> shape) {
        size_t n = 1;
        for (int64_t s : shape) n *= static_cast<size_t>(s);
        shapes.push_back(shape);
        T x;
        x.t = wkv_tensor_make_buffer(wb, at, WKV_DTYPE_F32, static_cast<int32_t>(shape.size()), shapes.back().data());
        x.p = reinterpret_cast<float*>(h.mapped + at);
        x.n = n;
        at += (n * 4 + 255) / 256 * 256;
        REQUIRE(at <= h.size);
        return x;
    }
    std::vector<std::vector<int64_t>> shapes;
    Carver(Host& host, wkv_buffer* b) : h(host), wb(b) { shapes.reserve(64); }
};

void put(const Carver::T& x, const std::vector<double>& v) {
    for (size_t i = 0; i < x.n; i++) x.p[i] = static_cast<float>(v[i]);
}
std::vector<double> get(const Carver::T& x) { return std::vector<double>(x.p, x.p + x.n); }
// The same tensor as host memory (for the CPU backend).
wkv_tensor host_copy(const Carver::T& x, std::vector<float>& store) {
    store.assign(x.p, x.p + x.n);
    wkv_tensor t = x.t;
    t.data = store.data();
    t.byte_offset = 0;
    t.device.type = WKV_DEVICE_CPU;
    t.device.id = 0;
    return t;
}

wkv_context* cpu_ctx() {
    wkv_context_options o{};
    o.struct_size = sizeof o;
    o.backend = WKV_BACKEND_CPU;
    o.cpu_threads = 2;
    wkv_context* c = nullptr;
    REQUIRE(wkv_context_create(&o, &c) == WKV_OK);
    return c;
}

} // namespace

TEST_CASE("vulkan guest mode: the host's device, imported buffers, recorded ops vs the CPU backend") {
    Host host(32u << 20);
    REQUIRE_MESSAGE(host.ok, "could not set up a Vulkan host");
    g_messages = 0;
    wkv_vulkan_guest_options g{};
    g.struct_size = sizeof g;
    g.instance = host.inst;
    g.physical_device = host.phys;
    g.device = host.dev;
    g.queue_family_index = host.family;
    g.queue_index = 0;
    g.get_instance_proc_addr = host.gipa;
    g.api_version = VK_API_VERSION_1_1;
    wkv_context* ctx = nullptr;
    // The guest context goes before the host's device and instance, even when a REQUIRE ends
    // the case early (the host's destructor runs after this guard's).
    struct Release {
        wkv_context*& c;
        ~Release() { wkv_context_destroy(c); }
    } release{ctx};
    {
        const wkv_status st = wkv_vulkan_context_create(nullptr, &g, &ctx);
        INFO(std::string(wkv_last_error(nullptr)));
        REQUIRE(st == WKV_OK);
    }
    CHECK(wkv_context_backend(ctx) == WKV_BACKEND_VULKAN);
    wkv_buffer* wb = nullptr;
    REQUIRE(wkv_vulkan_buffer_import(ctx, host.buf, host.size, &wb) == WKV_OK);
    CHECK(wkv_buffer_size(wb) == host.size);
    wkv_context* cpu = cpu_ctx();
    Carver cv(host, wb);
    Rng rng(test_seed() + 7000);

    SUBCASE("RWKV-6 forward (state stepped in place) and backward, recorded") {
        const int64_t B = 2, T = 21, H = 2, N = 32;
        Rwkv6Data d = random_rwkv6(rng, B, T, H, N, WKV_DECAY_EXP_NEG_EXP, true);
        auto r = cv.make({B, T, H, N}), w = cv.make({B, T, H, N}), k = cv.make({B, T, H, N}), v = cv.make({B, T, H, N});
        auto u = cv.make({H, N}), y = cv.make({B, T, H, N}), s = cv.make({B, H, N, N});
        put(r, d.r); put(w, d.w); put(k, d.k); put(v, d.v); put(u, d.u); put(s, d.s0);
        std::vector<float> hs[8];
        wkv_forward_desc hf{};
        hf.struct_size = sizeof hf;
        hf.op = WKV_OP_RWKV6;
        hf.decay_form = WKV_DECAY_EXP_NEG_EXP;
        hf.r = host_copy(r, hs[0]); hf.w = host_copy(w, hs[1]); hf.k = host_copy(k, hs[2]); hf.v = host_copy(v, hs[3]);
        hf.u = host_copy(u, hs[4]); hf.y = host_copy(y, hs[5]);
        hf.state_in = hf.state_out = host_copy(s, hs[6]);
        REQUIRE(wkv_forward(cpu, &hf) == WKV_OK);
        wkv_forward_desc f = hf;
        f.r = r.t; f.w = w.t; f.k = k.t; f.v = v.t; f.u = u.t; f.y = y.t;
        f.state_in = f.state_out = s.t;
        host.run([&](VkCommandBuffer cmd) {
            const wkv_status st = wkv_vulkan_record_forward(ctx, cmd, &f);
            INFO(std::string(wkv_last_error(ctx)));
            REQUIRE(st == WKV_OK);
        });
        CHECK(rel_err(get(y), std::vector<double>(hs[5].begin(), hs[5].end())) <= 2e-5);
        CHECK(rel_err(get(s), std::vector<double>(hs[6].begin(), hs[6].end())) <= 2e-5);

        // backward from s0 again; the workspace is host memory (the library's device scratch)
        put(s, d.s0);
        hs[6].assign(d.s0.begin(), d.s0.end());
        hf.state_out = f.state_out = wkv_tensor{};
        hf.y = f.y = wkv_tensor{};
        const std::vector<double> dyv = random_normal(rng, d.tok_count());
        auto dy = cv.make({B, T, H, N}), dr = cv.make({B, T, H, N}), dw = cv.make({B, T, H, N});
        auto dk = cv.make({B, T, H, N}), dv = cv.make({B, T, H, N}), du = cv.make({H, N}), ds = cv.make({B, H, N, N});
        put(dy, dyv);
        std::vector<float> hg[7];
        wkv_backward_desc hb{};
        hb.struct_size = sizeof hb;
        hb.forward = &hf;
        hb.dy = host_copy(dy, hg[0]); hb.dr = host_copy(dr, hg[1]); hb.dw = host_copy(dw, hg[2]);
        hb.dk = host_copy(dk, hg[3]); hb.dv = host_copy(dv, hg[4]); hb.du = host_copy(du, hg[5]);
        hb.dstate_in = host_copy(ds, hg[6]);
        size_t bytes = 0;
        REQUIRE(wkv_workspace_size(cpu, &bytes, &hb) == WKV_OK);
        std::vector<unsigned char> ws(bytes);
        hb.workspace = ws.data();
        hb.workspace_size = bytes;
        REQUIRE(wkv_backward(cpu, &hb) == WKV_OK);
        wkv_backward_desc b{};
        b.struct_size = sizeof b;
        b.forward = &f;
        b.dy = dy.t; b.dr = dr.t; b.dw = dw.t; b.dk = dk.t; b.dv = dv.t; b.du = du.t; b.dstate_in = ds.t;
        REQUIRE(wkv_workspace_size(ctx, &bytes, &b) == WKV_OK);
        std::vector<unsigned char> ws2(bytes);
        b.workspace = ws2.data();
        b.workspace_size = bytes;
        host.run([&](VkCommandBuffer cmd) {
            const wkv_status st = wkv_vulkan_record_backward(ctx, cmd, &b);
            INFO(std::string(wkv_last_error(ctx)));
            REQUIRE(st == WKV_OK);
        });
        const Carver::T* outs[6] = {&dr, &dw, &dk, &dv, &du, &ds};
        for (int i = 0; i < 6; i++) {
            INFO("gradient " << i);
            CHECK(rel_err(get(*outs[i]), std::vector<double>(hg[i + 1].begin(), hg[i + 1].end())) <= 5e-5);
        }
    }

    SUBCASE("RWKV-7 forward recorded; RWKV-4 forward through the synchronous API on the guest context") {
        const int64_t B = 1, T = 9, H = 2, N = 64, C = 96;
        Rwkv7Data d7 = random_rwkv7(rng, B, T, H, N, WKV_DECAY_CLAMPW, true);
        Rwkv4Data d4 = random_rwkv4(rng, B, T, C, 2.0, true);
        auto r = cv.make({B, T, H, N}), w = cv.make({B, T, H, N}), k = cv.make({B, T, H, N}), v = cv.make({B, T, H, N});
        auto a = cv.make({B, T, H, N}), bb = cv.make({B, T, H, N}), y = cv.make({B, T, H, N}), s = cv.make({B, H, N, N});
        put(r, d7.r); put(w, d7.w); put(k, d7.k); put(v, d7.v); put(a, d7.a); put(bb, d7.b); put(s, d7.s0);
        auto w4 = cv.make({C}), u4 = cv.make({C}), k4 = cv.make({B, T, C}), v4 = cv.make({B, T, C});
        auto y4 = cv.make({B, T, C}), s4 = cv.make({B, 3, C});
        put(w4, d4.w); put(u4, d4.u); put(k4, d4.k); put(v4, d4.v); put(s4, d4.s0);
        std::vector<float> hs[16];
        wkv_forward_desc h7{};
        h7.struct_size = sizeof h7;
        h7.op = WKV_OP_RWKV7;
        h7.decay_form = WKV_DECAY_CLAMPW;
        h7.r = host_copy(r, hs[0]); h7.w = host_copy(w, hs[1]); h7.k = host_copy(k, hs[2]); h7.v = host_copy(v, hs[3]);
        h7.a = host_copy(a, hs[4]); h7.b = host_copy(bb, hs[5]); h7.y = host_copy(y, hs[6]);
        h7.state_in = h7.state_out = host_copy(s, hs[7]);
        REQUIRE(wkv_forward(cpu, &h7) == WKV_OK);
        wkv_forward_desc h4{};
        h4.struct_size = sizeof h4;
        h4.op = WKV_OP_RWKV4;
        h4.decay_form = WKV_DECAY_EXP_NEG_EXP;
        h4.w = host_copy(w4, hs[8]); h4.u = host_copy(u4, hs[9]); h4.k = host_copy(k4, hs[10]);
        h4.v = host_copy(v4, hs[11]); h4.y = host_copy(y4, hs[12]);
        h4.state_in = h4.state_out = host_copy(s4, hs[13]);
        REQUIRE(wkv_forward(cpu, &h4) == WKV_OK);
        wkv_forward_desc f7 = h7, f4 = h4;
        f7.r = r.t; f7.w = w.t; f7.k = k.t; f7.v = v.t; f7.a = a.t; f7.b = bb.t; f7.y = y.t;
        f7.state_in = f7.state_out = s.t;
        f4.w = w4.t; f4.u = u4.t; f4.k = k4.t; f4.v = v4.t; f4.y = y4.t;
        f4.state_in = f4.state_out = s4.t;
        host.run([&](VkCommandBuffer cmd) { REQUIRE(wkv_vulkan_record_forward(ctx, cmd, &f7) == WKV_OK); });
        std::vector<double> y64, s64;
        ref_forward(d7, y64, s64);
        // against the float64 reference (RWKV-7's CPU path is checked against it elsewhere)
        CHECK(rel_err(get(y), y64) <= 1e-5);
        CHECK(rel_err(get(s), s64) <= 1e-5);
        // the synchronous API on a guest context: submits to the host's queue and waits
        REQUIRE(wkv_forward(ctx, &f4) == WKV_OK);
        CHECK(rel_err(get(y4), std::vector<double>(hs[12].begin(), hs[12].end())) <= 2e-5);
        CHECK(rel_err(get(s4), std::vector<double>(hs[13].begin(), hs[13].end())) <= 2e-5);
    }

    SUBCASE("refusals: host tensors in a recording, import on a non-guest context") {
        const int64_t shape[4] = {1, 1, 1, 8};
        float x[7][8] = {};
        wkv_forward_desc f{};
        f.struct_size = sizeof f;
        f.op = WKV_OP_RWKV7;
        f.decay_form = WKV_DECAY_LOG;
        wkv_tensor* t[7] = {&f.r, &f.w, &f.k, &f.v, &f.a, &f.b, &f.y};
        for (int i = 0; i < 7; i++) *t[i] = wkv_tensor_make(x[i], WKV_DTYPE_F32, 4, shape);
        host.run([&](VkCommandBuffer cmd) {
            CHECK(wkv_vulkan_record_forward(ctx, cmd, &f) == WKV_ERROR_DEVICE_MISMATCH);
            CHECK(std::string(wkv_last_error(ctx)).find("not in a wkv_buffer") != std::string::npos);
        });
        wkv_context_options o{};
        o.struct_size = sizeof o;
        o.backend = WKV_BACKEND_VULKAN;
        wkv_context* own = nullptr;
        REQUIRE(wkv_context_create(&o, &own) == WKV_OK);
        wkv_buffer* nb = nullptr;
        CHECK(wkv_vulkan_buffer_import(own, host.buf, 64, &nb) == WKV_ERROR_INVALID_ARGUMENT);
        CHECK(nb == nullptr);
        wkv_context_destroy(own);
        wkv_context* bad = nullptr;
        wkv_vulkan_guest_options g0{};
        CHECK(wkv_vulkan_context_create(nullptr, &g0, &bad) == WKV_ERROR_INVALID_ARGUMENT);
        CHECK(bad == nullptr);
    }

    wkv_buffer_destroy(wb); // forgets the host's VkBuffer, does not destroy it
    wkv_context_destroy(ctx);
    ctx = nullptr;
    wkv_context_destroy(cpu);
    CHECK(g_messages.load() == 0);
}
