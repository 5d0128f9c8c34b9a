/* Status codes (names and texts from the X-macro), per-thread error text, device type names. */
#include <pthread.h>
#include <string.h>

#include "harness.h"

/* The reference: every (code, "DT_<name>", text) of the list, written out by the macro. */
typedef struct ref_status {
    dt_status code;
    const char *name;
    const char *text;
} ref_status;

#define REF_(name, value, text) {(dt_status)(value), "DT_" #name, text},
static const ref_status refs[] = {DT_STATUS_MAP(REF_)};
#undef REF_
#define N_REFS ((int)(sizeof refs / sizeof refs[0]))

static void test_status_name_and_text_match_the_list(void)
{
    CU_ASSERT(N_REFS >= 10);
    for (int i = 0; i < N_REFS; i++) {
        CU_ASSERT_STRING_EQUAL(dt_status_name(refs[i].code), refs[i].name);
        CU_ASSERT_STRING_EQUAL(dt_status_str(refs[i].code), refs[i].text);
    }
    CU_ASSERT_STRING_EQUAL(dt_status_name(DT_OK), "DT_OK");
    CU_ASSERT_STRING_EQUAL(dt_status_name(DT_ERR_COMM), "DT_ERR_COMM");
    CU_ASSERT_EQUAL(DT_OK, 0);
}

static void test_status_codes_names_and_texts_are_distinct(void)
{
    for (int i = 0; i < N_REFS; i++) {
        CU_ASSERT(refs[i].code <= 0);
        CU_ASSERT(strlen(dt_status_str(refs[i].code)) > 0);
        for (int j = i + 1; j < N_REFS; j++) {
            CU_ASSERT_NOT_EQUAL(refs[i].code, refs[j].code);
            CU_ASSERT(strcmp(dt_status_name(refs[i].code), dt_status_name(refs[j].code)) != 0);
            CU_ASSERT(strcmp(dt_status_str(refs[i].code), dt_status_str(refs[j].code)) != 0);
        }
    }
}

static void test_status_groups_follow_the_ranges(void)
{
    /* Misuse -1..-19, local resources -20..-39, communicator -40..-59. */
    CU_ASSERT(DT_ERR_INVALID_ARGUMENT <= -1 && DT_ERR_INVALID_ARGUMENT >= -19);
    CU_ASSERT(DT_ERR_STATE <= -1 && DT_ERR_STATE >= -19);
    CU_ASSERT(DT_ERR_NO_MEMORY <= -20 && DT_ERR_NO_MEMORY >= -39);
    CU_ASSERT(DT_ERR_CUDA <= -20 && DT_ERR_CUDA >= -39);
    CU_ASSERT(DT_ERR_COMM <= -40 && DT_ERR_COMM >= -59);
    CU_ASSERT(DT_ERR_TIMEOUT <= -40 && DT_ERR_TIMEOUT >= -59);
}

static void test_status_unknown_values_get_a_fallback(void)
{
    const int unknown[] = {1, 7, -9, -19, -60, -1000, 123456};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        int listed = 0;
        for (int j = 0; j < N_REFS; j++)
            listed |= (int)refs[j].code == unknown[i];
        if (listed)
            continue; /* a code added to the list later is not unknown */
        CU_ASSERT_STRING_EQUAL(dt_status_name((dt_status)unknown[i]), "DT_UNKNOWN_STATUS");
        CU_ASSERT_STRING_EQUAL(dt_status_str((dt_status)unknown[i]), "unknown status");
    }
}

static void test_last_error_is_set_by_a_failure_and_cleared(void)
{
    dt_device_type t = DT_DEVICE_CPU;
    dt_clear_error();
    CU_ASSERT_STRING_EQUAL(dt_last_error(), "");
    DT_ASSERT_FAILS(dt_device_type_parse("XPU", &t), DT_ERR_PARSE);
    DT_ASSERT_ERROR_MENTIONS("XPU");
    CU_ASSERT_EQUAL(t, DT_DEVICE_CPU); /* output untouched on failure */
    dt_clear_error();
    CU_ASSERT_STRING_EQUAL(dt_last_error(), "");
}

typedef struct thread_result {
    char seen_at_start[64];
    char own_error[256];
} thread_result;

static void *other_thread(void *arg)
{
    thread_result *r = arg;
    dt_device_type t;
    snprintf(r->seen_at_start, sizeof r->seen_at_start, "%s", dt_last_error());
    dt_device_type_parse("from-the-other-thread", &t);
    snprintf(r->own_error, sizeof r->own_error, "%s", dt_last_error());
    return NULL;
}

static void test_last_error_is_per_thread(void)
{
    dt_device_type t;
    thread_result r;
    memset(&r, 0, sizeof r);
    DT_ASSERT_FAILS(dt_device_type_parse("main-thread-value", &t), DT_ERR_PARSE);
    pthread_t th;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, other_thread, &r), 0);
    pthread_join(th, NULL);
    /* The other thread started with no error and saw only its own. */
    CU_ASSERT_STRING_EQUAL(r.seen_at_start, "");
    CU_ASSERT_PTR_NOT_NULL(strstr(r.own_error, "from-the-other-thread"));
    CU_ASSERT_PTR_NULL(strstr(r.own_error, "main-thread-value"));
    /* This thread's text was not overwritten by the other's failure. */
    DT_ASSERT_ERROR_MENTIONS("main-thread-value");
    CU_ASSERT_PTR_NULL(strstr(dt_last_error(), "from-the-other-thread"));
}

static void test_device_type_names_parse_case_insensitively(void)
{
    dt_device_type t = DT_DEVICE_GPU;
    CU_ASSERT_STRING_EQUAL(dt_device_type_name(DT_DEVICE_CPU), "CPU");
    CU_ASSERT_STRING_EQUAL(dt_device_type_name(DT_DEVICE_GPU), "GPU");
    DT_ASSERT_OK(dt_device_type_parse("cpu", &t));
    CU_ASSERT_EQUAL(t, DT_DEVICE_CPU);
    DT_ASSERT_OK(dt_device_type_parse("Gpu", &t));
    CU_ASSERT_EQUAL(t, DT_DEVICE_GPU);
    CU_ASSERT_STRING_EQUAL(dt_device_type_name(DT_DEVICE_TPU), "TPU");
    CU_ASSERT_STRING_EQUAL(dt_device_type_name(DT_DEVICE_OTHER), "OTHER");
    DT_ASSERT_OK(dt_device_type_parse("tpu", &t));
    CU_ASSERT_EQUAL(t, DT_DEVICE_TPU);
    /* OTHER stands for names the library does not know; it is not itself a name to parse. */
    DT_ASSERT_FAILS(dt_device_type_parse("OTHER", &t), DT_ERR_PARSE);
    DT_ASSERT_OK(dt_device_type_parse("Gpu", &t));
    DT_ASSERT_FAILS(dt_device_type_parse("", &t), DT_ERR_PARSE);
    DT_ASSERT_FAILS(dt_device_type_parse("CPUs", &t), DT_ERR_PARSE);
    DT_ASSERT_FAILS(dt_device_type_parse(NULL, &t), DT_ERR_PARSE);
    CU_ASSERT_EQUAL(t, DT_DEVICE_GPU);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_status_name_and_text_match_the_list),
        DT_TEST(test_status_codes_names_and_texts_are_distinct),
        DT_TEST(test_status_groups_follow_the_ranges),
        DT_TEST(test_status_unknown_values_get_a_fallback),
        DT_TEST(test_last_error_is_set_by_a_failure_and_cleared),
        DT_TEST(test_last_error_is_per_thread),
        DT_TEST(test_device_type_names_parse_case_insensitively),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "runtime_status", cases, 0);
}
