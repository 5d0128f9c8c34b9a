/* ops/opdef_registry: the registry of op definitions: the built-in tables registered once,
 * users' ops after them, lookups by name and by definition. */
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/record.h"
#include "ops/opdef_impl.h"
#include "runtime/error.h"

struct dt_op {
    dt_op_def def;
    const dt_op_def *src; /* the definition handed to dt_op_register (built-ins: theirs) */
    int index;
    int has_rule;
    dt__rule rule;   /* def.rule parsed (fixed rules) */
    dt__ag_rule tape; /* how the tape runs its calls' backward and replay */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static dt_op **ops;
static int nops, capops;

static dt_status check_name(const char *name)
{
    if (!name || !*name)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_op_register: the definition has no name");
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '.'))
            return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_op_register: name \"%s\": use "
                             "[a-z0-9_.] only", name);
    return DT_OK;
}

static const dt_op *find_locked(const char *name)
{
    for (int i = 0; i < nops; i++)
        if (strcmp(ops[i]->def.name, name) == 0)
            return ops[i];
    return NULL;
}

static dt_status add(const dt_op_def *def, const dt_op **op_out)
{
    if (!def)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_op_register: def is NULL");
    dt_status st = check_name(def->name);
    if (st != DT_OK)
        return st;
    if (!def->cpu && !def->spmd)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_op_register: %s has no CPU kernel",
                         def->name);
    if (!def->rule && !def->rule_fn)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_op_register: %s has no factor rule",
                         def->name);
    int nmax = def->nin_max > def->nin ? def->nin_max : def->nin;
    if (def->nin < 0 || nmax > DT_OP_MAX_IN)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_op_register: %s takes %d inputs (0..%d)",
                         def->name, def->nin, DT_OP_MAX_IN);
    if (def->reduce != DT_REDUCE_SUM && def->reduce != DT_REDUCE_MAX &&
        def->reduce != DT_REDUCE_MIN)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_op_register: %s: reduce must be sum, "
                         "max or min", def->name);
    dt_op *op = calloc(1, sizeof *op);
    if (!op)
        return dt__error(DT_ERR_NO_MEMORY, "dt_op_register: no memory for %s", def->name);
    op->def = *def;
    op->src = def;
    if (def->rule) {
        st = dt__rule_parse(def->name, def->rule, def->nin, &op->rule);
        if (st == DT_OK && op->rule.nin != def->nin && def->nin_max <= def->nin)
            st = dt__error(DT_ERR_INVALID_ARGUMENT, "dt_op_register: %s: its rule has %d "
                           "inputs, the definition %d", def->name, op->rule.nin, def->nin);
        if (st != DT_OK) {
            free(op);
            return st;
        }
        op->has_rule = 1;
    }
    op->tape = (dt__ag_rule){def->name, 0xffu, def->save_out != 0,
                             def->backward ? dt__opdef_backward : NULL, dt__opdef_replay, 0};
    pthread_mutex_lock(&lock);
    if (find_locked(def->name)) {
        pthread_mutex_unlock(&lock);
        free(op);
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_op_register: an op named \"%s\" exists",
                         def->name);
    }
    if (nops == capops) {
        int ncap = capops ? capops * 2 : 128;
        dt_op **n = realloc(ops, (size_t)ncap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&lock);
            free(op);
            return dt__error(DT_ERR_NO_MEMORY, "dt_op_register: no memory for %s", def->name);
        }
        ops = n;
        capops = ncap;
    }
    op->index = nops;
    ops[nops++] = op;
    pthread_mutex_unlock(&lock);
    if (op_out)
        *op_out = op;
    return DT_OK;
}

/* The built-ins' first failure (a definition of ours that does not register). */
static dt_status builtin_st = DT_OK;
static char builtin_msg[256];

static void register_builtins(void)
{
    const dt_op_def *const *tables[] = {dt__defs_core, dt__defs_elem, dt__defs_reduce,
                                        dt__defs_shape, dt__defs_decode, dt__defs_moe};
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
        for (int i = 0; tables[t][i]; i++) {
            dt_status st = add(tables[t][i], NULL);
            if (st != DT_OK && builtin_st == DT_OK) {
                builtin_st = st;
                snprintf(builtin_msg, sizeof builtin_msg, "%s", dt_last_error());
            }
        }
}

dt_status dt_op_register(const dt_op_def *def, const dt_op **op_out)
{
    pthread_once(&once, register_builtins);
    return add(def, op_out);
}

const dt_op *dt_op_find(const char *name)
{
    pthread_once(&once, register_builtins);
    if (!name)
        return NULL;
    pthread_mutex_lock(&lock);
    const dt_op *op = find_locked(name);
    pthread_mutex_unlock(&lock);
    return op;
}

const dt_op_def *dt_op_definition(const dt_op *op)
{
    return op ? &op->def : NULL;
}

int dt_op_count(void)
{
    pthread_once(&once, register_builtins);
    pthread_mutex_lock(&lock);
    int n = nops;
    pthread_mutex_unlock(&lock);
    return n;
}

const dt_op *dt_op_at(int i)
{
    pthread_once(&once, register_builtins);
    pthread_mutex_lock(&lock);
    const dt_op *op = i >= 0 && i < nops ? ops[i] : NULL;
    pthread_mutex_unlock(&lock);
    return op;
}

/* Built-ins never move once registered: a small direct-mapped cache of def -> handle keeps
 * the lookup off the lock. */
#define HCACHE 512
static const dt_op *hcache[HCACHE];

const dt_op *dt__op_builtin(const dt_op_def *def)
{
    pthread_once(&once, register_builtins);
    size_t h = ((uintptr_t)def >> 4) % HCACHE;
    const dt_op *op = __atomic_load_n(&hcache[h], __ATOMIC_ACQUIRE);
    if (op && op->src == def)
        return op;
    op = NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nops && !op; i++)
        if (ops[i]->src == def)
            op = ops[i];
    pthread_mutex_unlock(&lock);
    if (op)
        __atomic_store_n(&hcache[h], op, __ATOMIC_RELEASE);
    return op;
}

dt_status dt__op_builtin_error(const dt_op_def *def)
{
    if (builtin_st != DT_OK)
        return dt__error(builtin_st, "%s", builtin_msg);
    return dt__error(DT_ERR_UNSUPPORTED, "op %s is not registered", def && def->name ?
                     def->name : "?");
}

const dt__rule *dt__op_fixed_rule(const dt_op *op)
{
    return op->has_rule ? &op->rule : NULL;
}

const char *dt__op_name(const dt_op *op)
{
    return op->def.name;
}

const dt__ag_rule *dt__op_tape_rule(const dt_op *op)
{
    return &op->tape;
}

dt_status dt_op_error(dt_status st, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt ? fmt : "", ap);
    va_end(ap);
    return dt__error(st, "%s", msg);
}
