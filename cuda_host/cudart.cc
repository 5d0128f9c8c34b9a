/* A stand-in for the CUDA runtime in the host build (-Dcuda=host), compiled against NVIDIA's
 * cuda_runtime_api.h: devices (DT_CUDA_HOST_DEVICES, default 1), device memory in a mapping of
 * its own that only device work can touch (no access while no device work runs), streams as
 * ordered queues run by worker threads, events, and errors of asynchronous work that surface at
 * the next synchronisation. Lives with the tests, never installed. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "cuda_host/exec.h"
#include "cuda_host/fault.h"
#include "cuda_host/stand_in.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

struct CUstream_st {
    int device;
    pthread_mutex_t mu;
    pthread_cond_t cv, idle_cv;
    std::deque<std::function<void()>> q;
    unsigned long long queued, done;
    int quit;
    pthread_t worker;
};

struct CUevent_st {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned long long recorded, completed; /* record count, and the last one that ran */
    struct timespec when;
};

namespace {

const size_t kAlign = 256, kRedzone = 256;

struct device {
    char *base;
    size_t cap;
    std::map<size_t, size_t> blocks; /* offset -> bytes asked for */
    size_t used;
    CUstream_st *legacy;
    cudaError_t sticky;
};

struct {
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    int ndev = -1;
    device dev[16];
    std::set<void *> pinned;
    std::map<std::string, size_t> smem_limit;
    int active; /* device operations running: the device mappings are readable meanwhile */
    int protect;
} g;

__thread int cur_dev;
__thread cudaError_t last_error;

cudaError_t set_error(cudaError_t e)
{
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

void access_begin()
{
    pthread_mutex_lock(&g.mu);
    if (g.active++ == 0 && g.protect)
        for (int d = 0; d < g.ndev; d++)
            mprotect(g.dev[d].base, g.dev[d].cap, PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&g.mu);
}

void access_end()
{
    pthread_mutex_lock(&g.mu);
    if (--g.active == 0 && g.protect)
        for (int d = 0; d < g.ndev; d++)
            mprotect(g.dev[d].base, g.dev[d].cap, PROT_NONE);
    pthread_mutex_unlock(&g.mu);
}

void *worker_main(void *arg)
{
    CUstream_st *s = (CUstream_st *)arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->q.empty() && !s->quit)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->q.empty())
            break;
        std::function<void()> op = std::move(s->q.front());
        s->q.pop_front();
        pthread_mutex_unlock(&s->mu);
        access_begin();
        op();
        access_end();
        pthread_mutex_lock(&s->mu);
        s->done++;
        pthread_cond_broadcast(&s->idle_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

CUstream_st *stream_new(int device)
{
    CUstream_st *s = new CUstream_st();
    s->device = device;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    pthread_create(&s->worker, NULL, worker_main, s);
    return s;
}

void stream_push(CUstream_st *s, std::function<void()> op)
{
    pthread_mutex_lock(&s->mu);
    s->q.push_back(std::move(op));
    s->queued++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void stream_wait(CUstream_st *s)
{
    pthread_mutex_lock(&s->mu);
    while (s->done != s->queued)
        pthread_cond_wait(&s->idle_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

size_t env_size(const char *name, size_t dflt)
{
    const char *e = getenv(name);
    return e && *e ? (size_t)strtoull(e, NULL, 10) : dflt;
}

/* Devices come up on first use. */
bool init()
{
    pthread_mutex_lock(&g.mu);
    if (g.ndev < 0) {
        int n = (int)env_size("DT_CUDA_HOST_DEVICES", 1);
        n = n < 0 ? 0 : (n > 16 ? 16 : n);
        size_t cap = env_size("DT_CUDA_HOST_MEMORY_MB", 2048) << 20;
        const char *p = getenv("DT_CUDA_HOST_PROTECT");
        g.protect = !(p && strcmp(p, "0") == 0);
        for (int d = 0; d < n; d++) {
            void *m = mmap(NULL, cap, g.protect ? PROT_NONE : PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (m == MAP_FAILED) {
                n = d;
                break;
            }
            g.dev[d].base = (char *)m;
            g.dev[d].cap = cap;
            POISON(m, cap);
            g.dev[d].legacy = stream_new(d);
        }
        g.ndev = n;
    }
    pthread_mutex_unlock(&g.mu);
    return g.ndev > 0;
}

/* The device whose mapping holds [p, p + n), and whether an allocation covers it all. */
int device_of(const void *p, size_t n, bool *inside)
{
    const char *c = (const char *)p;
    for (int d = 0; d < g.ndev; d++) {
        device &v = g.dev[d];
        if (c < v.base || c >= v.base + v.cap)
            continue;
        size_t off = (size_t)(c - v.base);
        pthread_mutex_lock(&g.mu);
        auto it = v.blocks.upper_bound(off);
        bool ok = false;
        if (it != v.blocks.begin()) {
            --it;
            ok = off + n <= it->first + it->second;
        }
        pthread_mutex_unlock(&g.mu);
        *inside = ok;
        return d;
    }
    *inside = false;
    return -1;
}

cudaError_t sticky_of(int d)
{
    pthread_mutex_lock(&g.mu);
    cudaError_t e = g.dev[d].sticky;
    pthread_mutex_unlock(&g.mu);
    return e;
}

cudaError_t sync_device(int d)
{
    stream_wait(g.dev[d].legacy);
    /* streams of the device made by cudaStreamCreate are waited for by their users */
    return sticky_of(d);
}

} // namespace

/* ---- fault injection (cuda_host/fault.h) ---------------------------------------------------- */

namespace {

const char *const kSites[] = {"malloc", "mallochost", "memcpy", "memset", "setdevice",
                              "getdevice", "kernel", "cublascreate", "cublas", "nccl",
                              "ncclasync", "ncclinit", "pcibusid"};
const int kNSites = (int)(sizeof kSites / sizeof kSites[0]);
pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;
long fault_left[sizeof kSites / sizeof kSites[0]]; /* calls until the fault, 0: disarmed */
int fault_fired[sizeof kSites / sizeof kSites[0]];
long fault_more[sizeof kSites / sizeof kSites[0]]; /* calls after the fault that fail too */
int fault_armed; /* sites armed: 0 lets every call through without the lock */
pthread_once_t fault_once = PTHREAD_ONCE_INIT;

int site_index(const char *site, size_t len)
{
    for (int i = 0; i < kNSites; i++)
        if (strlen(kSites[i]) == len && strncmp(kSites[i], site, len) == 0)
            return i;
    return -1;
}

/* DT_CUDA_HOST_FAIL=site:N[,site:N...] */
void fault_env()
{
    const char *e = getenv("DT_CUDA_HOST_FAIL");
    for (const char *p = e; p && *p;) {
        const char *colon = strchr(p, ':'), *comma = strchr(p, ',');
        if (!comma)
            comma = p + strlen(p);
        int i = colon && colon < comma ? site_index(p, (size_t)(colon - p)) : -1;
        if (i < 0) {
            fprintf(stderr, "cuda-host: DT_CUDA_HOST_FAIL: bad entry '%.*s' (site:N, sites in "
                    "cuda_host/fault.h)\n", (int)(comma - p), p);
            abort();
        }
        char *end = NULL;
        long nth = strtol(colon + 1, &end, 10);
        if (end && *end == '@') { /* site:N@R: only in the process of world rank R */
            const char *r = getenv("OMPI_COMM_WORLD_RANK");
            if (!r)
                r = getenv("PMI_RANK");
            if (!r || strtol(end + 1, NULL, 10) != strtol(r, NULL, 10))
                nth = 0;
        }
        fault_left[i] = nth;
        fault_more[i] = 0;
        fault_fired[i] = 0;
        if (nth > 0)
            __atomic_fetch_add(&fault_armed, 1, __ATOMIC_RELAXED);
        p = *comma ? comma + 1 : comma;
    }
}

} // namespace

bool dt__cuh_fault_now(const char *site)
{
    pthread_once(&fault_once, fault_env);
    if (__atomic_load_n(&fault_armed, __ATOMIC_RELAXED) == 0)
        return false;
    int i = site_index(site, strlen(site));
    if (i < 0)
        abort(); /* a stand-in asked for a site the table lacks */
    pthread_mutex_lock(&fault_mu);
    bool now = fault_left[i] > 0 && --fault_left[i] == 0;
    if (now && fault_more[i] > 0) {
        fault_more[i]--;
        fault_left[i] = 1; /* the next call fails too */
    } else if (now) {
        __atomic_fetch_sub(&fault_armed, 1, __ATOMIC_RELAXED);
    }
    if (now) {
        fault_fired[i] = 1;
        fprintf(stderr, "cuda-host: injected fault: %s\n", site);
    }
    pthread_mutex_unlock(&fault_mu);
    return now;
}

extern "C" DT__CUH_API int dt__cuh_fail_times(const char *site, long nth, long times)
{
    pthread_once(&fault_once, fault_env);
    int i = site_index(site, strlen(site));
    if (i < 0)
        return -1;
    pthread_mutex_lock(&fault_mu);
    __atomic_fetch_add(&fault_armed, (nth > 0) - (fault_left[i] > 0), __ATOMIC_RELAXED);
    fault_left[i] = nth > 0 ? nth : 0;
    fault_more[i] = nth > 0 && times > 1 ? times - 1 : 0;
    fault_fired[i] = 0;
    pthread_mutex_unlock(&fault_mu);
    return 0;
}

extern "C" DT__CUH_API int dt__cuh_fail(const char *site, long nth)
{
    return dt__cuh_fail_times(site, nth, 1);
}

extern "C" DT__CUH_API int dt__cuh_fail_fired(const char *site)
{
    int i = site_index(site, strlen(site));
    if (i < 0)
        return 0;
    pthread_mutex_lock(&fault_mu);
    int f = fault_fired[i];
    pthread_mutex_unlock(&fault_mu);
    return f;
}

extern "C" DT__CUH_API void dt__cuh_fail_reset_sticky(void)
{
    if (!init())
        return;
    for (int d = 0; d < g.ndev; d++)
        stream_wait(g.dev[d].legacy);
    pthread_mutex_lock(&g.mu);
    for (int d = 0; d < g.ndev; d++)
        g.dev[d].sticky = cudaSuccess;
    pthread_mutex_unlock(&g.mu);
}

/* ---- the executor's side ------------------------------------------------------------------- */

extern "C" size_t dt__cuh_kernel_smem_limit(const char *key)
{
    pthread_mutex_lock(&g.mu);
    auto it = g.smem_limit.find(key);
    size_t lim = it == g.smem_limit.end() ? 48 * 1024 : it->second;
    pthread_mutex_unlock(&g.mu);
    return lim;
}

extern "C" void dt__cuh_launch(const dt__cuh_launch_desc *d, void (*body)(void *), void *closure,
                               void (*destroy)(void *))
{
    unsigned threads = d->block.x * d->block.y * d->block.z;
    cudaError_t e = cudaSuccess;
    if (!init())
        e = cudaErrorNoDevice;
    else if (d->block.x == 0 || d->block.y == 0 || d->block.z == 0 || d->block.x > 1024 ||
             d->block.y > 1024 || d->block.z > 64 || threads > 1024 || d->grid.x == 0 ||
             d->grid.y == 0 || d->grid.z == 0 || d->grid.x > 0x7fffffffu || d->grid.y > 65535 ||
             d->grid.z > 65535)
        e = cudaErrorInvalidConfiguration;
    else if (d->smem > dt__cuh_kernel_smem_limit(d->key))
        e = cudaErrorInvalidValue;
    if (e != cudaSuccess) {
        set_error(e);
        destroy(closure);
        return;
    }
    CUstream_st *s = d->stream ? d->stream : g.dev[cur_dev].legacy;
    if (dt__cuh_fault_now("kernel")) { /* as a kernel that faults: found at the next sync */
        int dev = s->device;
        stream_push(s, [dev]() {
            pthread_mutex_lock(&g.mu);
            if (g.dev[dev].sticky == cudaSuccess)
                g.dev[dev].sticky = cudaErrorLaunchFailure;
            pthread_mutex_unlock(&g.mu);
        });
        destroy(closure);
        return;
    }
    if (d->bad_arg) { /* on a GPU the kernel faults: the device's sticky error, found later */
        int dev = s->device;
        dt__cuh_launch_desc copy = *d;
        stream_push(s, [copy, dev]() {
            fprintf(stderr, "cuda-host: kernel %s (launched at %s:%d): argument %d points "
                    "outside device memory: cudaErrorIllegalAddress at the next "
                    "synchronisation\n", copy.name, copy.file, copy.line, copy.bad_arg);
            pthread_mutex_lock(&g.mu);
            if (g.dev[dev].sticky == cudaSuccess)
                g.dev[dev].sticky = cudaErrorIllegalAddress;
            pthread_mutex_unlock(&g.mu);
        });
        destroy(closure);
        return;
    }
    dt__cuh_launch_desc copy = *d;
    copy.stream = s;
    stream_push(s, [copy, body, closure, destroy]() {
        dt__cuh_run_kernel(&copy, body, closure);
        destroy(closure);
    });
}

extern "C" void dt__cuh_enqueue(cudaStream_t s, void (*fn)(void *), void *arg)
{
    init();
    stream_push(s ? s : g.dev[cur_dev].legacy, [fn, arg]() { fn(arg); });
}

extern "C" int dt__cuh_in_device_memory(const void *p)
{
    return dt__cuh_is_device(p, 1);
}

extern "C" int dt__cuh_is_device(const void *p, size_t n)
{
    if (!init())
        return 0;
    bool inside;
    return device_of(p, n, &inside) >= 0 && inside;
}

/* ---- devices -------------------------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!init()) {
        *count = 0;
        return set_error(cudaErrorNoDevice);
    }
    *count = g.ndev;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (!init())
        return set_error(cudaErrorNoDevice);
    if (device < 0 || device >= g.ndev)
        return set_error(cudaErrorInvalidDevice);
    if (dt__cuh_fault_now("setdevice"))
        return set_error(cudaErrorDevicesUnavailable);
    cur_dev = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    if (!init())
        return set_error(cudaErrorNoDevice);
    if (dt__cuh_fault_now("getdevice"))
        return set_error(cudaErrorDevicesUnavailable);
    *device = cur_dev;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (!init())
        return set_error(cudaErrorNoDevice);
    return set_error(sync_device(cur_dev));
}

cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
    if (!init() || device < 0 || device >= g.ndev)
        return set_error(cudaErrorInvalidDevice);
    if (dt__cuh_fault_now("pcibusid"))
        return set_error(cudaErrorDevicesUnavailable);
    snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", 0x10 + device);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total)
{
    if (!init())
        return set_error(cudaErrorNoDevice);
    pthread_mutex_lock(&g.mu);
    *total = g.dev[cur_dev].cap;
    *free_b = g.dev[cur_dev].cap - g.dev[cur_dev].used;
    pthread_mutex_unlock(&g.mu);
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    return last_error;
}

extern "C" cudaError_t dt__cuh_func_set_attribute(const char *key, enum cudaFuncAttribute attr,
                                                  int value)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
        return cudaSuccess;
    if (value < 0 || value > 227 * 1024)
        return set_error(cudaErrorInvalidValue);
    pthread_mutex_lock(&g.mu);
    g.smem_limit[key] = (size_t)value;
    pthread_mutex_unlock(&g.mu);
    return cudaSuccess;
}

/* ---- memory --------------------------------------------------------------------------------- */

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    if (!init())
        return set_error(cudaErrorNoDevice);
    device &v = g.dev[cur_dev];
    if (dt__cuh_fault_now("malloc"))
        return set_error(cudaErrorMemoryAllocation);
    if (size > v.cap)
        return set_error(cudaErrorMemoryAllocation);
    size_t need = (size + kRedzone + kAlign - 1) / kAlign * kAlign;
    pthread_mutex_lock(&g.mu);
    size_t at = 0;
    for (auto &b : v.blocks) {
        if (b.first - at >= need)
            break;
        at = b.first + (b.second + kRedzone + kAlign - 1) / kAlign * kAlign;
    }
    if (at + need > v.cap) {
        pthread_mutex_unlock(&g.mu);
        return set_error(cudaErrorMemoryAllocation);
    }
    v.blocks[at] = size;
    v.used += need;
    pthread_mutex_unlock(&g.mu);
    UNPOISON(v.base + at, size);
    *devPtr = v.base + at;
    return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr)
{
    if (!devPtr)
        return cudaSuccess;
    if (!init())
        return set_error(cudaErrorNoDevice);
    for (int d = 0; d < g.ndev; d++) {
        device &v = g.dev[d];
        char *c = (char *)devPtr;
        if (c < v.base || c >= v.base + v.cap)
            continue;
        stream_wait(v.legacy); /* cudaFree waits for the device */
        pthread_mutex_lock(&g.mu);
        auto it = v.blocks.find((size_t)(c - v.base));
        if (it == v.blocks.end()) {
            pthread_mutex_unlock(&g.mu);
            return set_error(cudaErrorInvalidValue);
        }
        size_t size = it->second;
        v.used -= (size + kRedzone + kAlign - 1) / kAlign * kAlign;
        v.blocks.erase(it);
        pthread_mutex_unlock(&g.mu);
        POISON(c, size);
        return cudaSuccess;
    }
    return set_error(cudaErrorInvalidValue);
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    if (dt__cuh_fault_now("mallochost"))
        return set_error(cudaErrorMemoryAllocation);
    void *p = malloc(size ? size : 1);
    if (!p)
        return set_error(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&g.mu);
    g.pinned.insert(p);
    pthread_mutex_unlock(&g.mu);
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    (void)flags;
    return cudaMallocHost(pHost, size);
}

cudaError_t cudaFreeHost(void *ptr)
{
    if (!ptr)
        return cudaSuccess;
    pthread_mutex_lock(&g.mu);
    size_t n = g.pinned.erase(ptr);
    pthread_mutex_unlock(&g.mu);
    if (n == 0)
        return set_error(cudaErrorInvalidValue);
    if (init())
        for (int d = 0; d < g.ndev; d++) /* as cudaFreeHost: waits for the work using it */
            stream_wait(g.dev[d].legacy);
    free(ptr);
    return cudaSuccess;
}

namespace {

/* A copy's checks at the call: each side in one allocation of device memory or outside every
 * device mapping, as `kind` says. */
cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, bool *async_ok)
{
    if (!dst || !src)
        return cudaErrorInvalidValue;
    bool din, sin;
    int dd = device_of(dst, n, &din), sd = device_of(src, n, &sin);
    if ((dd >= 0 && !din) || (sd >= 0 && !sin))
        return cudaErrorInvalidValue;
    bool dev_dst = dd >= 0, dev_src = sd >= 0;
    switch (kind) {
    case cudaMemcpyHostToDevice: if (!dev_dst || dev_src) return cudaErrorInvalidValue; break;
    case cudaMemcpyDeviceToHost: if (dev_dst || !dev_src) return cudaErrorInvalidValue; break;
    case cudaMemcpyDeviceToDevice: if (!dev_dst || !dev_src) return cudaErrorInvalidValue; break;
    case cudaMemcpyHostToHost: if (dev_dst || dev_src) return cudaErrorInvalidValue; break;
    case cudaMemcpyDefault: break;
    default: return cudaErrorInvalidMemcpyDirection;
    }
    /* Pageable host memory makes the copy synchronous, as on a GPU. */
    pthread_mutex_lock(&g.mu);
    bool host_pinned = true;
    if (!dev_dst && !g.pinned.count(dst))
        host_pinned = false;
    if (!dev_src && !g.pinned.count((void *)src))
        host_pinned = false;
    pthread_mutex_unlock(&g.mu);
    *async_ok = host_pinned;
    return cudaSuccess;
}

} // namespace

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    if (!init())
        return set_error(cudaErrorNoDevice);
    if (count == 0)
        return cudaSuccess;
    if (dt__cuh_fault_now("memcpy"))
        return set_error(cudaErrorLaunchFailure);
    bool async_ok = false;
    cudaError_t e = check_copy(dst, src, count, kind, &async_ok);
    if (e != cudaSuccess)
        return set_error(e);
    CUstream_st *s = stream ? stream : g.dev[cur_dev].legacy;
    stream_push(s, [dst, src, count]() { memcpy(dst, src, count); });
    if (!async_ok)
        stream_wait(s);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, count, kind, 0);
    if (e != cudaSuccess)
        return e;
    return set_error(sync_device(cur_dev));
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    if (!init())
        return set_error(cudaErrorNoDevice);
    if (count == 0)
        return cudaSuccess;
    if (!dt__cuh_is_device(devPtr, count))
        return set_error(cudaErrorInvalidValue);
    if (dt__cuh_fault_now("memset"))
        return set_error(cudaErrorLaunchFailure);
    stream_push(stream ? stream : g.dev[cur_dev].legacy,
                [devPtr, value, count]() { memset(devPtr, value, count); });
    return cudaSuccess;
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    cudaError_t e = cudaMemsetAsync(devPtr, value, count, 0);
    if (e != cudaSuccess)
        return e;
    return set_error(sync_device(cur_dev));
}

/* ---- streams and events --------------------------------------------------------------------- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    (void)flags;
    if (!init())
        return set_error(cudaErrorNoDevice);
    *pStream = stream_new(cur_dev);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    return cudaStreamCreateWithFlags(pStream, 0);
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s)
        return set_error(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->worker, NULL); /* the queued work still runs, as on a GPU */
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->idle_cv);
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (!init())
        return set_error(cudaErrorNoDevice);
    CUstream_st *st = s ? s : g.dev[cur_dev].legacy;
    stream_wait(st);
    return set_error(sticky_of(st->device));
}

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    if (!init())
        return set_error(cudaErrorNoDevice);
    CUstream_st *st = s ? s : g.dev[cur_dev].legacy;
    pthread_mutex_lock(&st->mu);
    bool idle = st->done == st->queued;
    pthread_mutex_unlock(&st->mu);
    if (sticky_of(st->device) != cudaSuccess)
        return set_error(sticky_of(st->device));
    return idle ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    (void)flags;
    CUevent_st *e = new CUevent_st();
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    *event = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, 0);
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    if (!e)
        return set_error(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&e->mu);
    while (e->completed != e->recorded) /* destroyed while pending: released when it runs */
        pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream)
{
    if (!init())
        return set_error(cudaErrorNoDevice);
    if (!e)
        return set_error(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&e->mu);
    unsigned long long n = ++e->recorded;
    pthread_mutex_unlock(&e->mu);
    stream_push(stream ? stream : g.dev[cur_dev].legacy, [e, n]() {
        pthread_mutex_lock(&e->mu);
        if (n > e->completed)
            e->completed = n;
        clock_gettime(CLOCK_MONOTONIC, &e->when);
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
    });
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    pthread_mutex_lock(&e->mu);
    bool done = e->completed == e->recorded;
    pthread_mutex_unlock(&e->mu);
    return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    pthread_mutex_lock(&e->mu);
    unsigned long long want = e->recorded;
    while (e->completed < want)
        pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    cudaEventSynchronize(start);
    cudaEventSynchronize(end);
    *ms = (float)((double)(end->when.tv_sec - start->when.tv_sec) * 1e3 +
                  (double)(end->when.tv_nsec - start->when.tv_nsec) * 1e-6);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int flags)
{
    (void)flags;
    if (!init())
        return set_error(cudaErrorNoDevice);
    pthread_mutex_lock(&e->mu);
    unsigned long long want = e->recorded; /* the record made before this call */
    pthread_mutex_unlock(&e->mu);
    stream_push(stream ? stream : g.dev[cur_dev].legacy, [e, want]() {
        pthread_mutex_lock(&e->mu);
        while (e->completed < want)
            pthread_cond_wait(&e->cv, &e->mu);
        pthread_mutex_unlock(&e->mu);
    });
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
    if (!init())
        return set_error(cudaErrorNoDevice);
    stream_push(stream ? stream : g.dev[cur_dev].legacy, [fn, userData]() { fn(userData); });
    return cudaSuccess;
}

/* ---- error text ----------------------------------------------------------------------------- */

const char *cudaGetErrorName(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorDevicesUnavailable: return "cudaErrorDevicesUnavailable";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (cuda-host: "
                                   "DT_CUDA_HOST_DEVICES=0)";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorDevicesUnavailable: return "CUDA-capable device(s) is/are busy or unavailable";
    default: return "unknown error";
    }
}
