/* generate: text from a Hugging Face model directory (GPT-2, Llama, Qwen2, Mistral) on a
 * mesh, by incremental decoding against a key/value cache laid out on the mesh (heads sharded
 * over `model`), prompts batched, greedy or sampled (docs/generate.md).
 *
 *   generate --model DIR [--prompt TEXT]... [--ids 1,2,3]... [--tokens N] [--mesh FILE]
 *            [--temperature T] [--top-k K] [--top-p P] [--seed S] [--ignore-eos]
 *            [--print-ids] [--logits-out FILE] [--quiet] [--no-bos]
 *
 * Each --prompt (or --ids, token ids) is one row of the batch. Client 0 prints each row's
 * prompt and continuation. --logits-out writes the logits of every prompt position
 * ([rows, n, vocab] f32, the shortest prompt's n) as raw little-endian floats. The run itself
 * is examples/llama/gen.c, shared with `dtensor generate`. */
#include <stdio.h>

#include <dtensor/dtensor.h>

#include "llama/gen.h"
#include "train/job.h"

#define DEFAULT_MESH TRAIN_EXAMPLES_DIR "/meshes/1x1.yaml"

static void fail(void *arg, const char *what, dt_status st, const char *msg)
{
    job_fail(arg, what, st, msg);
}

int main(int argc, char **argv)
{
    job j;
    job_begin(&j, "generate", &argc, &argv);
    gen_opts o;
    int rc = gen_parse(argc, argv, 1, "generate", &o);
    if (!o.mesh)
        o.mesh = DEFAULT_MESH;
    if (rc == 2) {
        if (j.me == 0) {
            printf("usage: generate --model DIR [--prompt TEXT]... [--ids 1,2,3]... [options]\n");
            gen_usage(stdout, "meshes/1x1.yaml");
        }
        rc = 0;
    } else if (rc == 0 && (rc = job_start(&j, o.mesh, NULL, -1)) == 0) {
        dt_mesh *mesh = NULL;
        rc = job_mesh(&j, o.mesh, NULL, -1, &mesh);
        if (rc == 0)
            rc = gen_run(mesh, j.me, &o, stdout, fail, &j);
        dt_mesh_destroy(mesh);
    }
    return job_end(&j, rc);
}
