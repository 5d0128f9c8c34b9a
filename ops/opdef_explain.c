/* ops/opdef_explain: the propagator's explanations (dt_explain_set, DT_EXPLAIN=1): where the
 * lines go, and the text form of a layout spec they print. */
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ops/opdef_impl.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int on = -1; /* -1: not yet read from the environment */
static FILE *stream;
static dt_explain_fn fn;
static void *fn_arg;

int dt_explain_set(int enable, FILE *s, dt_explain_fn f, void *arg)
{
    pthread_mutex_lock(&lock);
    int old = on > 0;
    on = enable != 0;
    stream = s;
    fn = f;
    fn_arg = arg;
    pthread_mutex_unlock(&lock);
    return old;
}

int dt__explain_on(void)
{
    int v = __atomic_load_n(&on, __ATOMIC_RELAXED);
    if (v >= 0)
        return v;
    pthread_mutex_lock(&lock);
    if (on < 0) {
        const char *e = getenv("DT_EXPLAIN");
        on = e && *e && strcmp(e, "0") != 0;
        stream = stderr;
    }
    v = on;
    pthread_mutex_unlock(&lock);
    return v;
}

void dt__explain(const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&lock);
    if (fn)
        fn(fn_arg, line);
    else if (stream)
        fprintf(stream, "%s\n", line);
    pthread_mutex_unlock(&lock);
}

void dt__lspec_text(const dt_mesh *mesh, const dt__lspec *ls, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ls->rank && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", d ? "," : "",
                              ls->spec[d] < 0 ? "-" : dt_mesh_dim_name(mesh, ls->spec[d]));
    if (n < len)
        n += (size_t)snprintf(buf + n, len - n, "]");
    for (int m = 0; m < dt_mesh_rank(mesh) && n < len; m++)
        if (ls->partial[m])
            n += (size_t)snprintf(buf + n, len - n, " partial(%s) %s",
                                  dt_reduce_op_name((dt_reduce_op)(ls->partial[m] - 1)),
                                  dt_mesh_dim_name(mesh, m));
}
