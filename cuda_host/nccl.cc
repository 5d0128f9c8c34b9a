/* A stand-in for NCCL in the host build (-Dcuda=host), compiled against NVIDIA's nccl.h: a
 * communicator over the ranks of a test (processes, or one) is a shared-memory segment named by
 * the unique id, holding a byte ring per ordered pair of ranks; send/recv, the collectives
 * (built from them: every rank sends its data to every other one and reduces in rank order),
 * group calls (a call refused inside a group drops the group, as NCCL does) and the datatypes
 * and reduction ops the NCCL transport uses. Work runs on the
 * stream's worker; a peer silent for DT_CUDA_HOST_TIMEOUT seconds, or sizes that do not match,
 * become the communicator's asynchronous error. Never installed. */
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <nccl.h>

#include "cuda_host/fault.h"
#include "cuda_host/stand_in.h"

namespace {

const size_t kRing = 256 * 1024;

struct channel { /* bytes from rank s to rank d: written head, read tail (monotonic) */
    unsigned long long head, tail;
    char pad[48];
    char ring[kRing];
};

struct segment {
    int state; /* 0 new, 1 being set up, 2 ready */
    int nranks, joined;
    char pad[52];
    /* channel[nranks * nranks] follows */
};

channel *chan(segment *s, int src, int dst)
{
    return (channel *)((char *)(s + 1) + sizeof(channel) * ((size_t)src * s->nranks + dst));
}

} // namespace

struct ncclComm {
    segment *seg;
    size_t bytes;
    int nranks, rank;
    ncclResult_t async;
    int aborted; /* ncclCommAbort: in-flight work and an injected asynchronous fault stop */
    int pending; /* its jobs enqueued and not finished (ncclCommAbort waits for these only) */
    char name[64];
};

namespace {

struct op {
    int kind; /* 0 send, 1 recv, 2 allreduce, 3 allgather, 4 reduce_scatter */
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t red;
    int peer;
    ncclComm_t comm;
    cudaStream_t stream;
};

__thread int group_depth;
__thread std::vector<op> *group_ops;
__thread ncclResult_t group_error; /* the first call refused inside the group */

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

double timeout_s()
{
    const char *e = getenv("DT_CUDA_HOST_TIMEOUT");
    double t = e ? atof(e) : 0.0;
    return t > 0 ? t : 60.0;
}

double now()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One transfer in progress: a length word, then the payload, through a ring. */
struct xfer {
    channel *c;
    bool sending;
    char *buf;
    size_t n, done; /* of 8 + n bytes */
    unsigned long long len;
};

/* Moves what the ring allows; true when some bytes moved. */
bool progress(xfer *x)
{
    size_t total = 8 + x->n;
    if (x->done == total)
        return false;
    channel *c = x->c;
    unsigned long long head = __atomic_load_n(&c->head, __ATOMIC_ACQUIRE);
    unsigned long long tail = __atomic_load_n(&c->tail, __ATOMIC_ACQUIRE);
    size_t avail = x->sending ? kRing - (size_t)(head - tail) : (size_t)(head - tail);
    size_t want = total - x->done < avail ? total - x->done : avail;
    if (want == 0)
        return false;
    unsigned long long pos = x->sending ? head : tail;
    for (size_t i = 0; i < want;) {
        size_t at = (size_t)((pos + i) % kRing), run = kRing - at < want - i ? kRing - at : want - i;
        size_t off = x->done + i;
        for (size_t j = 0; j < run;) { /* the length word, then the payload */
            size_t o = off + j;
            char *mine = o < 8 ? (char *)&x->len + o : x->buf + (o - 8);
            size_t k = o < 8 ? (8 - o < run - j ? 8 - o : run - j) : run - j;
            if (x->sending)
                memcpy(c->ring + at + j, mine, k);
            else
                memcpy(mine, c->ring + at + j, k);
            j += k;
        }
        i += run;
    }
    x->done += want;
    if (x->sending)
        __atomic_store_n(&c->head, head + want, __ATOMIC_RELEASE);
    else
        __atomic_store_n(&c->tail, tail + want, __ATOMIC_RELEASE);
    return true;
}

template <typename T> T red2(ncclRedOp_t op, T a, T b)
{
    switch (op) {
    case ncclProd: return a * b;
    case ncclMax: return b > a || b != b ? b : a;
    case ncclMin: return b < a || b != b ? b : a;
    default: return a + b;
    }
}

float to_f(ncclDataType_t t, uint16_t h)
{
    return t == ncclFloat16 ? __half2float(__ushort_as_half(h))
                            : __bfloat162float(__ushort_as_bfloat16(h));
}

uint16_t from_f(ncclDataType_t t, float f)
{
    return t == ncclFloat16 ? __half_as_ushort(__float2half_rn(f))
                            : __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

/* acc op= x for n elements of type t. */
void reduce_into(ncclDataType_t t, ncclRedOp_t op, void *acc, const void *x, size_t n)
{
    ncclRedOp_t o = op == ncclAvg ? ncclSum : op;
    for (size_t i = 0; i < n; i++)
        switch (t) {
        case ncclInt8: ((int8_t *)acc)[i] = red2<int8_t>(o, ((int8_t *)acc)[i], ((const int8_t *)x)[i]); break;
        case ncclUint8: ((uint8_t *)acc)[i] = red2<uint8_t>(o, ((uint8_t *)acc)[i], ((const uint8_t *)x)[i]); break;
        case ncclInt32: ((int32_t *)acc)[i] = red2(o, ((int32_t *)acc)[i], ((const int32_t *)x)[i]); break;
        case ncclUint32: ((uint32_t *)acc)[i] = red2(o, ((uint32_t *)acc)[i], ((const uint32_t *)x)[i]); break;
        case ncclInt64: ((int64_t *)acc)[i] = red2(o, ((int64_t *)acc)[i], ((const int64_t *)x)[i]); break;
        case ncclUint64: ((uint64_t *)acc)[i] = red2(o, ((uint64_t *)acc)[i], ((const uint64_t *)x)[i]); break;
        case ncclFloat32: ((float *)acc)[i] = red2(o, ((float *)acc)[i], ((const float *)x)[i]); break;
        case ncclFloat64: ((double *)acc)[i] = red2(o, ((double *)acc)[i], ((const double *)x)[i]); break;
        default:
            ((uint16_t *)acc)[i] = from_f(t, red2(o, to_f(t, ((uint16_t *)acc)[i]),
                                                  to_f(t, ((const uint16_t *)x)[i])));
        }
}

void divide(ncclDataType_t t, void *acc, size_t n, int k)
{
    for (size_t i = 0; i < n; i++)
        switch (t) {
        case ncclFloat32: ((float *)acc)[i] /= (float)k; break;
        case ncclFloat64: ((double *)acc)[i] /= (double)k; break;
        case ncclFloat16: case ncclBfloat16:
            ((uint16_t *)acc)[i] = from_f(t, to_f(t, ((uint16_t *)acc)[i]) / (float)k); break;
        case ncclInt32: ((int32_t *)acc)[i] /= k; break;
        case ncclInt64: ((int64_t *)acc)[i] /= k; break;
        default: break;
        }
}

/* Runs a group on the stream's worker: every transfer progresses together (so that the order
 * of the calls cannot deadlock), then the reductions. */
struct group_job {
    std::vector<op> ops;
};

/* Enqueues a job on the stream, counting it on each of its communicators. */
void enqueue_job(cudaStream_t stream, group_job *job);

/* A job's end: uncounted from its communicators, then freed. */
void finish(group_job *job)
{
    for (op &o : job->ops)
        __atomic_fetch_sub(&o.comm->pending, 1, __ATOMIC_ACQ_REL);
    delete job;
}

bool any_aborted(const group_job *job)
{
    for (const op &o : job->ops)
        if (__atomic_load_n(&o.comm->aborted, __ATOMIC_ACQUIRE))
            return true;
    return false;
}

void run_group(void *arg)
{
    group_job *job = (group_job *)arg;
    std::vector<xfer> xs;
    std::vector<std::vector<char>> tmp; /* received pieces of the reductions */
    struct pending_reduce {
        op o;
        std::vector<size_t> pieces; /* tmp index per rank (rank == self: none) */
    };
    std::vector<pending_reduce> reds;
    ncclComm_t comm0 = job->ops.empty() ? NULL : job->ops[0].comm;
    for (op &o : job->ops) {
        ncclComm_t c = o.comm;
        size_t es = type_size(o.type), bytes = o.count * es;
        int me = c->rank, n = c->nranks;
        if (o.kind == 0 || o.kind == 1) {
            xfer x = {o.kind == 0 ? chan(c->seg, me, o.peer) : chan(c->seg, o.peer, me),
                      o.kind == 0, o.kind == 0 ? (char *)o.send : (char *)o.recv, bytes, 0,
                      bytes};
            xs.push_back(x);
            continue;
        }
        pending_reduce pr = {o, std::vector<size_t>((size_t)n, (size_t)-1)};
        /* allreduce: all of it to everyone; reduce_scatter: piece r to rank r; allgather:
         * mine to everyone, into recv + rank * bytes */
        for (int r = 0; r < n; r++) {
            if (r == me)
                continue;
            const char *src = (const char *)o.send;
            if (o.kind == 4)
                src += (size_t)r * bytes;
            xs.push_back({chan(c->seg, me, r), true, (char *)src, bytes, 0, bytes});
            char *dst;
            if (o.kind == 3) {
                dst = (char *)o.recv + (size_t)r * bytes;
            } else {
                tmp.emplace_back(bytes);
                pr.pieces[(size_t)r] = tmp.size() - 1;
                dst = NULL; /* set below, once tmp stops moving */
            }
            xs.push_back({chan(c->seg, r, me), false, dst, bytes, 0, bytes});
        }
        reds.push_back(pr);
    }
    /* point the receives of reductions at their buffers */
    {
        size_t ri = 0, xi = 0;
        for (op &o : job->ops) {
            if (o.kind == 0 || o.kind == 1) {
                xi++;
                continue;
            }
            pending_reduce &pr = reds[ri++];
            for (int r = 0; r < o.comm->nranks; r++) {
                if (r == o.comm->rank)
                    continue;
                xi++; /* the send */
                if (o.kind != 3)
                    xs[xi].buf = tmp[pr.pieces[(size_t)r]].data();
                xi++;
            }
        }
    }
    double limit = timeout_s(), last = now();
    for (;;) {
        bool moved = false, all = true;
        for (xfer &x : xs) {
            moved |= progress(&x);
            all &= x.done == 8 + x.n;
        }
        if (all)
            break;
        if (any_aborted(job)) {
            finish(job); /* ncclCommAbort: in-flight work ends unfinished */
            return;
        }
        if (moved) {
            last = now();
        } else if (now() - last > limit) {
            if (comm0)
                __atomic_store_n(&comm0->async, ncclRemoteError, __ATOMIC_RELEASE);
            fprintf(stderr, "cuda-host NCCL: rank %d: no progress for %.0f s\n",
                    comm0 ? comm0->rank : -1, limit);
            finish(job);
            return;
        } else {
            sched_yield();
        }
    }
    for (xfer &x : xs)
        if (!x.sending && x.len != x.n) { /* the peer sent another size */
            __atomic_store_n(&comm0->async, ncclInvalidUsage, __ATOMIC_RELEASE);
            fprintf(stderr, "cuda-host NCCL: rank %d received %llu bytes, expected %zu\n",
                    comm0->rank, x.len, x.n);
        }
    for (pending_reduce &pr : reds) {
        op &o = pr.o;
        size_t es = type_size(o.type), bytes = o.count * es;
        int me = o.comm->rank, n = o.comm->nranks;
        if (o.kind == 3) {
            memmove((char *)o.recv + (size_t)me * bytes, o.send, bytes);
            continue;
        }
        /* in rank order: ((x0 op x1) op x2) ... */
        std::vector<char> acc(bytes);
        for (int r = 0; r < n; r++) {
            const char *x = r == me ? (const char *)o.send + (o.kind == 4 ? (size_t)me * bytes : 0)
                                    : tmp[pr.pieces[(size_t)r]].data();
            if (r == 0)
                memcpy(acc.data(), x, bytes);
            else
                reduce_into(o.type, o.red, acc.data(), x, o.count);
        }
        if (o.red == ncclAvg)
            divide(o.type, acc.data(), o.count, n);
        memcpy(o.recv, acc.data(), bytes);
    }
    finish(job);
}

ncclResult_t submit_one(const op &o)
{
    if (!o.comm)
        return ncclInvalidArgument;
    if (o.kind != 3 && type_size(o.type) == 0)
        return ncclInvalidArgument;
    if ((o.kind == 0 || o.kind == 1) && (o.peer < 0 || o.peer >= o.comm->nranks))
        return ncclInvalidArgument;
    size_t bytes = o.count * type_size(o.type);
    size_t in = o.kind == 4 ? bytes * (size_t)o.comm->nranks : bytes;
    size_t out = o.kind == 3 ? bytes * (size_t)o.comm->nranks : bytes;
    if (bytes && ((o.kind != 1 && !dt__cuh_is_device(o.send, in)) ||
                  (o.kind != 0 && !dt__cuh_is_device(o.recv, out))))
        return ncclInvalidArgument; /* NCCL moves device memory only */
    if (dt__cuh_fault_now("nccl"))
        return ncclUnhandledCudaError;
    if (dt__cuh_fault_now("ncclasync")) { /* accepted; fails on the stream, never completes */
        ncclComm_t c = o.comm;
        __atomic_fetch_add(&c->pending, 1, __ATOMIC_ACQ_REL);
        dt__cuh_enqueue(o.stream, [](void *arg) {
            ncclComm_t cm = (ncclComm_t)arg;
            __atomic_store_n(&cm->async, ncclSystemError, __ATOMIC_RELEASE);
            for (double t0 = now(); !__atomic_load_n(&cm->aborted, __ATOMIC_ACQUIRE) &&
                                    now() - t0 < timeout_s();)
                usleep(1000);
            __atomic_fetch_sub(&cm->pending, 1, __ATOMIC_ACQ_REL);
        }, c);
        return ncclSuccess;
    }
    if (group_depth > 0) {
        if (!group_ops)
            group_ops = new std::vector<op>();
        group_ops->push_back(o);
        return ncclSuccess;
    }
    enqueue_job(o.stream, new group_job{{o}});
    return ncclSuccess;
}

void enqueue_job(cudaStream_t stream, group_job *job)
{
    for (op &o : job->ops)
        __atomic_fetch_add(&o.comm->pending, 1, __ATOMIC_ACQ_REL);
    dt__cuh_enqueue(stream, run_group, job);
}

/* As NCCL: a call refused inside a group is the group's error, which ncclGroupEnd returns
 * after dropping every call of the group (none is issued). */
ncclResult_t submit(const op &o)
{
    ncclResult_t r = submit_one(o);
    if (r != ncclSuccess && group_depth > 0 && group_error == ncclSuccess)
        group_error = r;
    return r;
}

} // namespace

ncclResult_t ncclGetVersion(int *version)
{
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    static int counter;
    memset(uniqueId, 0, sizeof *uniqueId);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(uniqueId->internal, sizeof uniqueId->internal, "/dtcuh-nccl-%d-%d-%ld",
             (int)getpid(), __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED), (long)ts.tv_nsec);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    if (nranks < 1 || rank < 0 || rank >= nranks || strncmp(commId.internal, "/dtcuh-nccl-", 12))
        return ncclInvalidArgument;
    if (dt__cuh_fault_now("ncclinit"))
        return ncclSystemError;
    size_t bytes = sizeof(segment) + sizeof(channel) * (size_t)nranks * (size_t)nranks;
    int fd = shm_open(commId.internal, O_RDWR | O_CREAT, 0600);
    if (fd < 0)
        return ncclSystemError;
    if (ftruncate(fd, (off_t)bytes) != 0) {
        close(fd);
        return ncclSystemError;
    }
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return ncclSystemError;
    segment *s = (segment *)m;
    int zero = 0;
    if (__atomic_compare_exchange_n(&s->state, &zero, 1, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        s->nranks = nranks;
        __atomic_store_n(&s->state, 2, __ATOMIC_RELEASE);
    }
    double start = now(), limit = timeout_s();
    while (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != 2)
        sched_yield();
    if (s->nranks != nranks) {
        munmap(m, bytes);
        return ncclInvalidUsage;
    }
    __atomic_fetch_add(&s->joined, 1, __ATOMIC_ACQ_REL);
    /* as ncclCommInitRank: collective, it returns once every rank joined */
    while (__atomic_load_n(&s->joined, __ATOMIC_ACQUIRE) < nranks) {
        if (now() - start > limit) {
            munmap(m, bytes);
            return ncclRemoteError;
        }
        usleep(100);
    }
    if (rank == 0)
        shm_unlink(commId.internal);
    ncclComm *c = new ncclComm();
    c->seg = s;
    c->bytes = bytes;
    c->nranks = nranks;
    c->rank = rank;
    snprintf(c->name, sizeof c->name, "%s", commId.internal);
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    cudaDeviceSynchronize(); /* the communicator's work is done before it goes */
    munmap(comm->seg, comm->bytes);
    delete comm;
    return ncclSuccess;
}

/* As NCCL's: the communicator's work in flight ends unfinished, without waiting for the rest
 * of the device's work (another communicator's job, which its own abort ends). */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    __atomic_store_n(&comm->aborted, 1, __ATOMIC_RELEASE);
    while (__atomic_load_n(&comm->pending, __ATOMIC_ACQUIRE) > 0)
        usleep(100);
    munmap(comm->seg, comm->bytes);
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!comm)
        return ncclInvalidArgument;
    *asyncError = __atomic_load_n(&comm->async, __ATOMIC_ACQUIRE);
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (cuda-host NCCL stand-in)";
    case ncclSystemError: return "unhandled system error (cuda-host NCCL stand-in)";
    case ncclInvalidArgument: return "invalid argument (cuda-host NCCL stand-in)";
    case ncclInvalidUsage: return "invalid usage (cuda-host NCCL stand-in)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "internal error (cuda-host NCCL stand-in)";
    }
}

ncclResult_t ncclGroupStart()
{
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd()
{
    if (group_depth == 0)
        return ncclInvalidUsage;
    if (--group_depth > 0)
        return ncclSuccess;
    std::vector<op> *ops = group_ops;
    ncclResult_t err = group_error;
    group_ops = NULL;
    group_error = ncclSuccess;
    if (err != ncclSuccess || !ops) {
        delete ops;
        return err;
    }
    /* one job per stream (the transport uses one) */
    group_job *job = new group_job{*ops};
    cudaStream_t s = ops->empty() ? 0 : (*ops)[0].stream;
    delete ops;
    enqueue_job(s, job);
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return submit({0, sendbuff, NULL, count, datatype, ncclSum, peer, comm, stream});
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return submit({1, NULL, recvbuff, count, datatype, ncclSum, peer, comm, stream});
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    return submit({2, sendbuff, recvbuff, count, datatype, op, 0, comm, stream});
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return submit({3, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream});
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    return submit({4, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream});
}
