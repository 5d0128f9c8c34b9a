/* The parsers of DT_* variables (runtime/env.c): MiB counts and 0/1 flags give the default
 * when unset or empty, the value when it parses, and an error naming the variable and the
 * value (never the default) when it does not. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "runtime/env.h"

#define VAR "DT_TEST_ENV_MIB"

static void test_env_mib_unset_or_empty_gives_the_default(void)
{
    uint64_t b = 7;
    unsetenv(VAR);
    DT_ASSERT_OK(dt__env_mib(VAR, 256, 0, 1024, "test", &b));
    CU_ASSERT_EQUAL(b, (uint64_t)256 << 20);
    setenv(VAR, "", 1);
    b = 7;
    DT_ASSERT_OK(dt__env_mib(VAR, 3, 1, 1024, "test", &b));
    CU_ASSERT_EQUAL(b, (uint64_t)3 << 20);
    unsetenv(VAR);
}

static void test_env_mib_reads_numbers_in_range_as_bytes(void)
{
    static const struct {
        const char *text;
        uint64_t bytes;
    } ok[] = {{"0", 0}, {"1", 1048576}, {"64", 67108864}, {"1048576", 1099511627776ull},
              {"007", 7340032}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t b = 1;
        setenv(VAR, ok[i].text, 1);
        DT_ASSERT_OK(dt__env_mib(VAR, 5, 0, 1u << 20, "test", &b));
        CU_ASSERT_EQUAL(b, ok[i].bytes);
    }
    unsetenv(VAR);
}

static void test_env_mib_rejects_unparsable_values_naming_the_variable(void)
{
    static const char *bad[] = {"lots", "12MB", " 12", "-1", "+4", "1.5", "0x10",
                                "99999999999999999999999", "1048577"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t b = 42;
        char want[96];
        setenv(VAR, bad[i], 1);
        DT_ASSERT_FAILS(dt__env_mib(VAR, 5, 0, 1u << 20, "MiB of test", &b),
                        DT_ERR_INVALID_ARGUMENT);
        snprintf(want, sizeof want, VAR "='%s' is not a number of MiB in 0..1048576", bad[i]);
        DT_ASSERT_ERROR_MENTIONS(want);
        DT_ASSERT_ERROR_MENTIONS("(MiB of test)");
        CU_ASSERT_EQUAL(b, 42); /* untouched, not the default */
    }
    setenv(VAR, "0", 1); /* below lo */
    uint64_t b = 42;
    DT_ASSERT_FAILS(dt__env_mib(VAR, 5, 1, 8, "test", &b), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS(VAR "='0' is not a number of MiB in 1..8");
    CU_ASSERT_EQUAL(b, 42);
    unsetenv(VAR);
}

static void test_env_flag_reads_0_and_1_and_rejects_the_rest(void)
{
    int on = -1;
    unsetenv(VAR);
    DT_ASSERT_OK(dt__env_flag(VAR, 1, "test", &on));
    CU_ASSERT_EQUAL(on, 1);
    setenv(VAR, "", 1);
    DT_ASSERT_OK(dt__env_flag(VAR, 0, "test", &on));
    CU_ASSERT_EQUAL(on, 0);
    setenv(VAR, "0", 1);
    DT_ASSERT_OK(dt__env_flag(VAR, 1, "test", &on));
    CU_ASSERT_EQUAL(on, 0);
    setenv(VAR, "1", 1);
    DT_ASSERT_OK(dt__env_flag(VAR, 0, "test", &on));
    CU_ASSERT_EQUAL(on, 1);
    static const char *bad[] = {"yes", "2", "off", "01x", "-0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char want[64];
        on = 9;
        setenv(VAR, bad[i], 1);
        DT_ASSERT_FAILS(dt__env_flag(VAR, 1, "a test flag", &on), DT_ERR_INVALID_ARGUMENT);
        snprintf(want, sizeof want, VAR "='%s' is neither 0 nor 1 (a test flag)", bad[i]);
        DT_ASSERT_ERROR_MENTIONS(want);
        CU_ASSERT_EQUAL(on, 9);
    }
    unsetenv(VAR);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_env_mib_unset_or_empty_gives_the_default),
        DT_TEST(test_env_mib_reads_numbers_in_range_as_bytes),
        DT_TEST(test_env_mib_rejects_unparsable_values_naming_the_variable),
        DT_TEST(test_env_flag_reads_0_and_1_and_rejects_the_rest),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "runtime_env", cases, 0);
}
