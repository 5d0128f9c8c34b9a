/* Private to ckpt/memckpt*.c: the in-memory checkpoint handle and its helpers. */
#ifndef DTENSOR_CKPT_MEMCKPT_IMPL_H
#define DTENSOR_CKPT_MEMCKPT_IMPL_H

#include <stdint.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/group.h"

/* Beside a file received as a buddy copy: "<file>.buddy" (empty). */
#define MEMCKPT_BUDDY_SUFFIX ".buddy"

/* One file of the buddy copy in flight, mapped. */
typedef struct memckpt_xfer {
    char path[CK_PATH_MAX], part[CK_PATH_MAX + 8];
    void *addr;
    uint64_t len;
    int recv, done;
} memckpt_xfer;

struct dt_memckpt {
    dt__group g;                  /* a duplicate of the mesh's group: the copies' messages */
    int64_t every;
    int keep;
    char job[72];
    char root[CK_PATH_MAX];       /* <dir>/dtensor-mem-<job> */
    uint64_t *dir_ids;            /* per group rank: hash of its root (same host memory) */
    int leader;                   /* lowest rank of this root: makes, prunes, removes it */
    int hosts;                    /* distinct roots */
    int buddy_j, buddy, source;   /* J and the group ranks sent to and received from */
    int buddy_same_host;
    /* the copy in flight */
    int64_t copy_step;
    memckpt_xfer *x;
    int nx;
    MPI_Request *reqs;
    int *peers;                   /* client id of each request's other side */
    int nreq;
    uint64_t own_bytes, buddy_bytes;
    double last_save_seconds;
};

uint64_t dt__memckpt_hash(const char *s);
dt_status dt__memckpt_mkdirs(const char *path);
/* Unmaps and frees the copy's state (unfinished received files removed). */
void dt__memckpt_xfers_free(dt_memckpt *mc);
/* Steps under root, newest first, at most max of them; the count. */
int dt__memckpt_list_steps(const char *root, int64_t *steps, int max);

#endif
