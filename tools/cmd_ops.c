/* `dtensor ops`: the registered op definitions (name, family, inputs, factor rule, how partial
 * inputs pass, backward) as a table, Markdown for docs/ops.md; and `--validate`, the op
 * validator over every op (or one) for longer runs than the test suite's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *linearity(const dt_op_def *d)
{
    switch (d->linearity) {
    case DT_OP_LINEAR_MULTI: return "multilinear";
    case DT_OP_LINEAR_ADDITIVE: return "additive";
    default: return "-";
    }
}

static void list(int markdown)
{
    if (markdown)
        printf("| op | family | inputs | factor rule | partial inputs | backward | "
               "validated |\n|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < dt_op_count(); i++) {
        const dt_op_def *d = dt_op_definition(dt_op_at(i));
        char nin[16];
        int nmax = d->nin_max > d->nin ? d->nin_max : d->nin;
        snprintf(nin, sizeof nin, nmax > d->nin ? "%d..%d" : "%d", d->nin, nmax);
        const char *rule = d->rule ? d->rule : "per call";
        const char *bw = d->backward ? "yes" : "-";
        if (markdown)
            printf("| `%s` | %s | %s | `%s` | %s | %s | %s |\n", d->name,
                   d->family ? d->family : "-", nin, rule, linearity(d), bw,
                   d->sample ? "yes" : "-");
        else
            printf("%-20s %-14s %-5s %-22s %-12s %-4s %s\n", d->name,
                   d->family ? d->family : "-", nin, rule, linearity(d), bw,
                   d->doc ? d->doc : "");
    }
}

static void report(void *arg, const char *line)
{
    (void)arg;
    fprintf(stderr, "  %s\n", line);
}

int cli_ops(int argc, char **argv)
{
    int markdown = 0, validate = 0, gpu = 0;
    dt_validate_opts o = DT_VALIDATE_OPTS_INIT;
    const char *only = NULL;
    o.cases = 8;
    o.layouts = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--markdown") == 0)
            markdown = 1;
        else if (strcmp(argv[i], "--validate") == 0)
            validate = 1;
        else if (strcmp(argv[i], "--gpu") == 0)
            gpu = 1;
        else if (strcmp(argv[i], "--cases") == 0 && i + 1 < argc)
            o.cases = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            o.seed = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--max-dim") == 0 && i + 1 < argc)
            o.max_dim = atoi(argv[++i]);
        else if (strcmp(argv[i], "--op") == 0 && i + 1 < argc)
            only = argv[++i];
        else
            return cli_usage();
    }
    if (o.cases < 1 || o.max_dim < 1)
        return cli_usage();
    dt_status st = dt_init(NULL, NULL, NULL);
    if (st != DT_OK)
        return cli_fail("init", st);
    if (!validate) {
        list(markdown);
        dt_finalize();
        return CLI_OK;
    }
    o.device_type = gpu ? DT_DEVICE_GPU : DT_DEVICE_CPU;
    o.report = report;
    int64_t failures = 0, cases = 0, checks = 0;
    int rc = CLI_OK;
    for (int i = 0; i < dt_op_count() && rc == CLI_OK; i++) {
        const dt_op *op = dt_op_at(i);
        const char *name = dt_op_definition(op)->name;
        if (only && strcmp(only, name) != 0)
            continue;
        dt_validate_result r;
        st = dt_op_validate(op, &o, &r);
        if (st != DT_OK) {
            rc = cli_fail(name, st);
            break;
        }
        if (dt_client_id() == 0)
            printf("%-20s cases=%lld checks=%lld failures=%lld%s\n", name, (long long)r.cases,
                   (long long)r.checks, (long long)r.failures, r.cases ? "" : " (no sample)");
        failures += r.failures;
        cases += r.cases;
        checks += r.checks;
    }
    if (rc == CLI_OK && dt_client_id() == 0)
        printf("validate: cases=%lld checks=%lld failures=%lld\n", (long long)cases,
               (long long)checks, (long long)failures);
    dt_finalize();
    return rc != CLI_OK ? rc : failures ? CLI_BAD_INPUT : CLI_OK;
}
