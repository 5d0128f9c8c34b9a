/* DT_CPU_WORKERS as dt_init reads it: a value that is neither 0 nor 1 fails dt_init naming
 * it; unset or 1 starts min(local CPU devices, cores) lanes, 0 one (no threads); dt_finalize
 * stops them. Meson runs it with DT_CPU_WORKERS unset and 0. The cases run in order and
 * depend on it (one MPI start per process). */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "runtime/workers.h"

static char *given; /* DT_CPU_WORKERS as meson set it, or NULL */

static void test_bad_cpu_workers_value_fails_init_naming_it(void)
{
    setenv("DT_CPU_WORKERS", "yes", 1);
    DT_ASSERT_FAILS(dt_init(NULL, NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("DT_CPU_WORKERS='yes'");
    CU_ASSERT_EQUAL(dt_is_initialized(), 0);
    CU_ASSERT_EQUAL(dt__workers_lanes(), 1);
    if (given)
        setenv("DT_CPU_WORKERS", given, 1);
    else
        unsetenv("DT_CPU_WORKERS");
}

static void test_lanes_are_the_devices_up_to_the_cores_or_one_when_off(void)
{
    dt_init_opts o = DT_INIT_OPTS_INIT;
    o.cpu_devices = 3;
    o.bind_cores = 0;
    DT_ASSERT_OK(dt_init(NULL, NULL, &o));
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    int want = given && strcmp(given, "0") == 0 ? 1 : (cores < 3 ? cores : 3);
    CU_ASSERT_EQUAL(dt__workers_lanes(), want);
    dt_finalize();
    CU_ASSERT_EQUAL(dt__workers_lanes(), 1);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_bad_cpu_workers_value_fails_init_naming_it),
        DT_TEST(test_lanes_are_the_devices_up_to_the_cores_or_one_when_off),
        DT_TEST_END,
    };
    given = getenv("DT_CPU_WORKERS") ? strdup(getenv("DT_CPU_WORKERS")) : NULL;
    int rc = dt_test_main(argc, argv, "cpu_workers_env", cases, 0);
    free(given);
    return rc;
}
