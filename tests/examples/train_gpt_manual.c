/* train_gpt_manual: examples/train_gpt plus one option, --manual-backward, which makes the
 * gradients with the hand-written backward pass (gpt_manual_backward.c) instead of the
 * autograd tape: the reference of test_train_gpt.py and bench/gpt.sh. Test-only (not
 * installed). The simplest way to be train_gpt in every other respect is to be its code:
 * tests/meson.build compiles examples/train_gpt.c again with its main renamed
 * train_gpt_main and links the example's other objects; this main takes its own option out
 * of argv, installs the hook and hands the rest to train_gpt. */
#include <stdio.h>
#include <string.h>

#include "gpt_manual_backward.h"

int train_gpt_main(int argc, char **argv);

int main(int argc, char **argv)
{
    int n = 0, manual = 0, pipe = 0;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && strcmp(argv[i], "--manual-backward") == 0) {
            manual = 1;
            continue;
        }
        pipe |= i > 0 && strncmp(argv[i], "--pipe", 6) == 0;
        argv[n++] = argv[i];
    }
    argv[n] = NULL;
    if (manual && pipe) { /* the pipeline's stages record on the tape only */
        fprintf(stderr, "train_gpt: --manual-backward with --pipe is not supported\n");
        return 2;
    }
    if (manual)
        gpt__set_backward_hook(gpt_manual_backward);
    return train_gpt_main(n, argv);
}
