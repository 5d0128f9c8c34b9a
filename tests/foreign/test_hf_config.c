/* Hugging Face config.json (ckpt/foreign_hf.c): the GPT-2 and Llama-family keys read with
 * their defaults, llama3 rope scaling, Qwen2's implied biases, and a directory the library
 * does not understand refused with a message naming the key; a written config read back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static char dir[256];

/* Writes `text` as dir/config.json. */
static void put(const char *text)
{
    char p[300];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs(text, f);
    fclose(f);
}

/* dt_hf_config_read of `text` fails with `want` and a message holding `key`. */
static void refused(const char *text, dt_status want, const char *key)
{
    dt_hf_config c;
    put(text);
    dt_status st = dt_hf_config_read(dir, &c);
    CU_ASSERT_EQUAL(st, want);
    if (!strstr(dt_last_error(), key))
        fprintf(stderr, "message lacks '%s': %s\n", key, dt_last_error());
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), key));
}

static const char *llama3 =
    "{\"model_type\": \"llama\", \"vocab_size\": 128256, \"hidden_size\": 2048,"
    " \"intermediate_size\": 8192, \"num_hidden_layers\": 16, \"num_attention_heads\": 32,"
    " \"num_key_value_heads\": 8, \"max_position_embeddings\": 131072,"
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, \"hidden_act\": \"silu\","
    " \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0,"
    " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"},"
    " \"tie_word_embeddings\": true, \"bos_token_id\": 128000,"
    " \"eos_token_id\": [128001, 128008, 128009]}";

static void test_hf_config_reads_llama_3_2_with_llama3_rope_scaling(void)
{
    dt_hf_config c;
    put(llama3);
    DT_ASSERT_OK(dt_hf_config_read(dir, &c));
    CU_ASSERT_EQUAL(c.arch, DT_HF_LLAMA);
    CU_ASSERT_STRING_EQUAL(c.model_type, "llama");
    CU_ASSERT_EQUAL(c.vocab, 128256);
    CU_ASSERT_EQUAL(c.hidden, 2048);
    CU_ASSERT_EQUAL(c.intermediate, 8192);
    CU_ASSERT_EQUAL(c.layers, 16);
    CU_ASSERT_EQUAL(c.heads, 32);
    CU_ASSERT_EQUAL(c.kv_heads, 8);
    CU_ASSERT_EQUAL(c.head_dim, 64);
    CU_ASSERT_DOUBLE_EQUAL(c.rope_theta, 500000.0, 0);
    CU_ASSERT_DOUBLE_EQUAL(c.norm_eps, 1e-5, 1e-12);
    CU_ASSERT_EQUAL(c.rope_llama3, 1);
    CU_ASSERT_DOUBLE_EQUAL(c.rope_factor, 32.0, 0);
    CU_ASSERT_EQUAL(c.rope_original_max, 8192);
    CU_ASSERT_EQUAL(c.tie_word_embeddings, 1);
    CU_ASSERT_EQUAL(c.attention_bias, 0);
    CU_ASSERT_EQUAL(c.bos_token_id, 128000);
    CU_ASSERT_EQUAL(c.eos_token_id, 128001);
}

static void test_hf_config_gives_qwen2_its_biases_and_mistral_its_defaults(void)
{
    dt_hf_config c;
    put("{\"model_type\": \"qwen2\", \"vocab_size\": 151936, \"hidden_size\": 896,"
        " \"intermediate_size\": 4864, \"num_hidden_layers\": 24, \"num_attention_heads\": 14,"
        " \"num_key_value_heads\": 2, \"rope_theta\": 1000000.0, \"sliding_window\": 32768,"
        " \"use_sliding_window\": false, \"tie_word_embeddings\": true, \"rope_scaling\": null}");
    DT_ASSERT_OK(dt_hf_config_read(dir, &c));
    CU_ASSERT_EQUAL(c.attention_bias, 1);
    CU_ASSERT_EQUAL(c.head_dim, 64);
    CU_ASSERT_EQUAL(c.rope_llama3, 0);
    put("{\"model_type\": \"mistral\", \"vocab_size\": 32000, \"hidden_size\": 4096,"
        " \"intermediate_size\": 14336, \"num_hidden_layers\": 32, \"num_attention_heads\": 32,"
        " \"num_key_value_heads\": 8, \"head_dim\": 128, \"max_position_embeddings\": 32768}");
    DT_ASSERT_OK(dt_hf_config_read(dir, &c));
    CU_ASSERT_EQUAL(c.arch, DT_HF_LLAMA);
    CU_ASSERT_EQUAL(c.tie_word_embeddings, 0);
    CU_ASSERT_EQUAL(c.attention_bias, 0);
    CU_ASSERT_EQUAL(c.head_dim, 128);
    CU_ASSERT_DOUBLE_EQUAL(c.rope_theta, 10000.0, 0);
    CU_ASSERT_EQUAL(c.eos_token_id, -1);
}

static void test_hf_config_reads_gpt2_with_its_defaults(void)
{
    dt_hf_config c;
    put("{\"model_type\": \"gpt2\", \"vocab_size\": 50257, \"n_embd\": 768, \"n_layer\": 12,"
        " \"n_head\": 12, \"n_positions\": 1024, \"n_inner\": null,"
        " \"activation_function\": \"gelu_new\", \"eos_token_id\": 50256}");
    DT_ASSERT_OK(dt_hf_config_read(dir, &c));
    CU_ASSERT_EQUAL(c.arch, DT_HF_GPT2);
    CU_ASSERT_EQUAL(c.intermediate, 4 * 768);
    CU_ASSERT_EQUAL(c.kv_heads, 12);
    CU_ASSERT_EQUAL(c.head_dim, 64);
    CU_ASSERT_EQUAL(c.max_positions, 1024);
    CU_ASSERT_EQUAL(c.tie_word_embeddings, 1);
    CU_ASSERT_DOUBLE_EQUAL(c.norm_eps, 1e-5, 1e-12);
    CU_ASSERT_EQUAL(c.eos_token_id, 50256);
}

static void test_hf_config_refuses_what_it_does_not_understand_naming_the_key(void)
{
    dt_hf_config c;
    char p[300];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    CU_ASSERT_EQUAL(dt_hf_config_read(dir, &c), DT_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "config.json"));
    refused("{\"vocab_size\": 3", DT_ERR_PARSE, "config.json:");
    refused("{\"vocab_size\": 3}", DT_ERR_NOT_FOUND, "\"model_type\"");
    refused("{\"model_type\": \"bert\"}", DT_ERR_UNSUPPORTED, "\"model_type\" \"bert\"");
    refused("{\"model_type\": \"llama\", \"vocab_size\": 8, \"hidden_size\": 8,"
            " \"num_hidden_layers\": 1, \"num_attention_heads\": 2}",
            DT_ERR_NOT_FOUND, "\"intermediate_size\"");
    refused("{\"model_type\": \"llama\", \"vocab_size\": 8, \"hidden_size\": \"8\","
            " \"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2}",
            DT_ERR_PARSE, "\"hidden_size\"");
    refused("{\"model_type\": \"llama\", \"vocab_size\": 8, \"hidden_size\": 8,"
            " \"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 4,"
            " \"num_key_value_heads\": 3}",
            DT_ERR_PARSE, "\"num_key_value_heads\"");
    refused("{\"model_type\": \"llama\", \"vocab_size\": 8, \"hidden_size\": 8,"
            " \"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
            " \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}",
            DT_ERR_UNSUPPORTED, "\"rope_scaling.rope_type\" \"yarn\"");
    refused("{\"model_type\": \"llama\", \"vocab_size\": 8, \"hidden_size\": 8,"
            " \"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
            " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0,"
            " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}}",
            DT_ERR_NOT_FOUND, "\"rope_scaling.original_max_position_embeddings\"");
    refused("{\"model_type\": \"llama\", \"vocab_size\": 8, \"hidden_size\": 8,"
            " \"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
            " \"hidden_act\": \"gelu\"}",
            DT_ERR_UNSUPPORTED, "\"hidden_act\"");
    refused("{\"model_type\": \"llama\", \"vocab_size\": 8, \"hidden_size\": 8,"
            " \"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
            " \"mlp_bias\": true}",
            DT_ERR_UNSUPPORTED, "\"mlp_bias\"");
    refused("{\"model_type\": \"llama\", \"vocab_size\": 8, \"hidden_size\": 8,"
            " \"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
            " \"tie_word_embeddings\": 1}",
            DT_ERR_PARSE, "\"tie_word_embeddings\"");
    refused("{\"model_type\": \"gpt2\", \"vocab_size\": 8, \"n_embd\": 8, \"n_layer\": 1,"
            " \"n_head\": 3}",
            DT_ERR_PARSE, "\"n_head\"");
    refused("{\"model_type\": \"gpt2\", \"vocab_size\": 8, \"n_embd\": 8, \"n_layer\": 1,"
            " \"n_head\": 2, \"activation_function\": \"relu\"}",
            DT_ERR_UNSUPPORTED, "\"activation_function\"");
}

static void test_hf_config_written_reads_back_the_same(void)
{
    dt_hf_config c, d;
    char p[300];
    snprintf(p, sizeof p, "%s/config.json", dir);
    put(llama3);
    DT_ASSERT_OK(dt_hf_config_read(dir, &c));
    DT_ASSERT_OK(dt_hf_config_write(&c, p));
    DT_ASSERT_OK(dt_hf_config_read(p, &d));
    CU_ASSERT_EQUAL(memcmp(&c, &d, sizeof c), 0);
    put("{\"model_type\": \"gpt2\", \"vocab_size\": 96, \"n_embd\": 64, \"n_layer\": 2,"
        " \"n_head\": 4, \"n_positions\": 64}");
    DT_ASSERT_OK(dt_hf_config_read(dir, &c));
    DT_ASSERT_OK(dt_hf_config_write(&c, p));
    DT_ASSERT_OK(dt_hf_config_read(p, &d));
    CU_ASSERT_EQUAL(memcmp(&c, &d, sizeof c), 0);
}

int main(int argc, char **argv)
{
    snprintf(dir, sizeof dir, "/tmp/dt_hf_config_XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    static const dt_test_case cases[] = {
        DT_TEST(test_hf_config_reads_llama_3_2_with_llama3_rope_scaling),
        DT_TEST(test_hf_config_gives_qwen2_its_biases_and_mistral_its_defaults),
        DT_TEST(test_hf_config_reads_gpt2_with_its_defaults),
        DT_TEST(test_hf_config_refuses_what_it_does_not_understand_naming_the_key),
        DT_TEST(test_hf_config_written_reads_back_the_same),
        DT_TEST_END,
    };
    int rc = dt_test_main(argc, argv, "hf_config", cases, 0);
    char p[300];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    rmdir(dir);
    return rc;
}
