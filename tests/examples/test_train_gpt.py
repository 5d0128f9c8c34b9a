#!/usr/bin/env python3
"""examples/train_gpt on small sizes: the same few steps on the 1x1, 2x1, 1x2 and 2x2 meshes
(1, 2, 2 and 4 processes) give the same losses within rounding and the same parameters; a run
saving through the checkpoint manager (--ckpt-root), stopped after step 3, its newest step
damaged, and resumed with --resume latest on another process count ends bit-identical to an
uninterrupted one (parameters, ZeRO master weights and moments); the result line, the CSV and
the PNG are well formed; bad options fail with one line; the tape (with and without
recomputed blocks) gives the bits of the hand-written backward pass (TRAIN_GPT_MANUAL, the
test-only train_gpt_manual --manual-backward). Checkpoints are read with numpy and
tests/ckpt_py/stread.py (never our C code).
Usage: test_train_gpt.py TRAIN_GPT TRAIN_GPT_MANUAL MPIEXEC MESH_DIR"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import numpy as np
    import test_train_resume
    from test_train_resume import read_checkpoint
except ImportError as e:  # numpy missing: meson's skip code
    print(f"skipping: {e}")
    sys.exit(77)

TRAIN = TRAIN_MANUAL = MPIEXEC = MESHES = None
# One block, width 16, 2 heads (so that model=2 holds one head each), 8 names per batch.
SMALL = ["--layers", "1", "--width", "16", "--heads", "2", "--batch", "8", "--warmup", "2",
         "--eval-every", "3", "--samples", "3", "--quiet"]
STATE = ("master", "exp_avg", "exp_avg_sq", "momentum")
RESULT = re.compile(r"^result heldout_loss=(\d+\.\d{4}) samples=([a-z\-,]*) checkpoint=(\S+) "
                    r"plot=(\S+)$")


def run(procs, devices, args, expect=0, train=None):
    """train_mlp's test runner (mpiexec with `procs` processes, 0: none) on train_gpt (or
    `train`)."""
    test_train_resume.TRAIN, test_train_resume.MPIEXEC = train or TRAIN, MPIEXEC
    return test_train_resume.run(procs, devices, args, expect)


def losses(path):
    """(step, training loss, held-out loss or None) per CSV row."""
    with open(path) as f:
        rows = [line.rstrip("\n").split(",") for line in f][1:]
    return [(int(r[0]), float(r[1]), float(r[2]) if r[2] else None) for r in rows]


class TrainGpt(test_train_resume.ExampleCase):
    PREFIX = "train_gpt_"

    def result(self, out, outdir, checkpoint=None):
        m = RESULT.match(out.strip().splitlines()[-1])
        self.assertIsNotNone(m, out)
        self.assertEqual(m.group(3), checkpoint or os.path.join(outdir, "checkpoint"))
        self.assertEqual(m.group(4), os.path.join(outdir, "curves.png"))
        self.assertEqual(len(m.group(2).split(",")), 3)
        return float(m.group(1))

    def test_meshes_agree_within_rounding(self):
        runs = {"1x1": (0, 1), "2x1": (2, 1), "1x2": (2, 1), "2x2": (4, 1)}
        got = {}
        for name, (procs, devices) in runs.items():
            d = self.path(name)
            out, _ = run(procs, devices, self.mesh(name) + SMALL + ["--steps", "6", "--out", d])
            got[name] = (self.result(out, d), losses(os.path.join(d, "curves.csv")),
                         read_checkpoint(os.path.join(d, "checkpoint"))[0])
        ref_heldout, ref_curve, ref_params = got["1x1"]
        self.assertEqual([s for s, _, _ in ref_curve], list(range(1, 7)))
        for name, (heldout, curve, params) in got.items():
            self.assertAlmostEqual(heldout, ref_heldout, delta=2e-4, msg=name)
            for (s, l, e), (_, rl, re_) in zip(curve, ref_curve):
                self.assertAlmostEqual(l, rl, delta=1e-4 * rl, msg=f"{name} step {s}")
                if re_ is not None:
                    self.assertAlmostEqual(e, re_, delta=1e-4 * re_, msg=f"{name} step {s}")
            self.assertEqual(sorted(params), sorted(ref_params), name)
            # Adam divides by the gradients' root mean square, so a gradient near zero that
            # differs in rounding moves its weight by a visible share of one step (lr 0.004):
            # 1e-4 is 2.5% of one step's largest move.
            # (The optimizer state's shapes follow the mesh: one row per model shard.)
            for p in (p for p in ref_params if p.split("/")[-1] not in STATE):
                np.testing.assert_allclose(params[p], ref_params[p], rtol=1e-3, atol=1e-4,
                                           err_msg=f"{name}: {p}")
        # The loss went down in these few steps (the model learns at all).
        self.assertLess(ref_curve[-1][1], ref_curve[0][1])

    def test_stopped_run_resumes_latest_bit_identical_on_another_process_count(self):
        """Stopped after step 3 with a step saved every step under --ckpt-root; the newest
        step (3) loses a byte of a data file, so --resume latest on 4 processes continues from
        step 2 and ends as the unbroken run."""
        a, b = self.path("a"), self.path("b")
        common = self.mesh("2x2") + SMALL + ["--steps", "6"]
        out, _ = run(2, 2, common + ["--out", a])
        heldout = self.result(out, a)
        root = os.path.join(b, "ckpts")
        managed = ["--ckpt-root", root, "--ckpt-every", "1", "--keep-last", "2"]
        run(2, 2, common + managed + ["--out", b, "--stop-after", "3"])
        step3 = os.path.join(root, "step-0000000003")
        data = sorted(n for n in os.listdir(step3) if n.endswith(".safetensors"))
        victim = os.path.join(step3, data[-1])
        os.truncate(victim, os.path.getsize(victim) - 1)
        out, _ = run(4, 1, common + managed + ["--out", b, "--resume", "latest"])
        last = os.path.join(root, "step-0000000006")
        self.assertEqual(self.result(out, b, last), heldout)
        # The damaged step 3 was set aside by the save of step 3, never deleted.
        self.assertEqual(sorted(os.listdir(root)), ["latest", "step-0000000003.damaged",
                                                    "step-0000000005", "step-0000000006"])
        ta, va = read_checkpoint(os.path.join(a, "checkpoint"))
        tb, vb = read_checkpoint(last)
        self.assertEqual(sorted(ta), sorted(tb))
        self.assertIn("block0/attn/q", ta)
        self.assertIn("block0/attn/q/exp_avg", ta)
        for name in ta:
            self.assertTrue(np.array_equal(ta[name].view(np.uint8), tb[name].view(np.uint8)),
                            name)
        for name in ("train/step", "train/data/epoch", "train/data/batch", "zero/step"):
            self.assertEqual(va[name], vb[name], name)
        self.assertEqual(losses(os.path.join(a, "curves.csv")),
                         losses(os.path.join(b, "curves.csv")))

    def test_stage3_equals_stage1_and_resumes_bit_identical(self):
        """ZeRO stage 3 (a group per block, the head and the embeddings, gathered unit by unit)
        on the 2x2 mesh: the same run as stage 1 bit for bit (no clipping: the norm's summation
        order follows the groups); stopped after step 3 under 2 processes and resumed under 4,
        the same as uninterrupted."""
        a, s3, r = self.path("s1"), self.path("s3"), self.path("r3")
        common = self.mesh("2x2") + SMALL + ["--steps", "6", "--clip", "0"]
        out, _ = run(2, 2, common + ["--out", a, "--stage", "1"])
        heldout = self.result(out, a)
        out, _ = run(2, 2, common + ["--out", s3, "--stage", "3"])
        self.assertEqual(self.result(out, s3), heldout)
        run(2, 2, common + ["--out", r, "--stage", "3", "--stop-after", "3"])
        out, _ = run(4, 1, common + ["--out", r, "--stage", "3", "--resume",
                                     os.path.join(r, "checkpoint")])
        self.assertEqual(self.result(out, r), heldout)
        ta, _ = read_checkpoint(os.path.join(a, "checkpoint"))
        for other in (s3, r):
            tb, _ = read_checkpoint(os.path.join(other, "checkpoint"))
            self.assertEqual(sorted(ta), sorted(tb))
            for name in ta:
                self.assertTrue(np.array_equal(ta[name].view(np.uint8), tb[name].view(np.uint8)),
                                f"{other}: {name}")
        self.assertEqual(losses(os.path.join(a, "curves.csv")),
                         losses(os.path.join(s3, "curves.csv")))

    def test_tape_gives_the_bits_of_the_hand_written_backward(self):
        """The forward pass recorded on the autograd tape (train_gpt), the same with every
        block a recomputed checkpoint segment (--checkpoint-blocks), and the hand-written
        backward pass (train_gpt_manual --manual-backward): the same parameters, optimizer
        state and losses bit for bit, on the 2x2 mesh in f32 (ZeRO stage 1), bf16 (stage 3,
        gathered unit by unit) and f16 (stage 2, dynamic loss scaling), and on 1x1 in f16
        (stage 0)."""
        cases = (("2x2", 2, "f32", "1", ("tape", "ckpt")), ("2x2", 2, "bf16", "3", ("ckpt",)),
                 ("2x2", 2, "f16", "2", ("ckpt",)), ("1x1", 0, "f16", "0", ("tape", "ckpt")))
        for mesh, procs, prec, stage, modes in cases:
            common = self.mesh(mesh) + SMALL + ["--layers", "2", "--steps", "3",
                                                "--precision", prec, "--stage", stage]
            got = {}
            for mode in ("manual",) + modes:
                d = self.path(f"{mesh}-{prec}-{mode}")
                extra = {"manual": ["--manual-backward"], "tape": [],
                         "ckpt": ["--checkpoint-blocks"]}[mode]
                run(procs, 2 if procs else 1, common + extra + ["--out", d],
                    train=TRAIN_MANUAL if mode == "manual" else TRAIN)
                got[mode] = (read_checkpoint(os.path.join(d, "checkpoint"))[0],
                             losses(os.path.join(d, "curves.csv")))
            ref, ref_curve = got.pop("manual")
            self.assertIn("block1/attn/q", ref)
            for mode, (t, curve) in got.items():
                what = f"{mesh} {prec} stage {stage} {mode}"
                self.assertEqual(sorted(t), sorted(ref), what)
                for name in ref:
                    self.assertTrue(np.array_equal(t[name].view(np.uint8),
                                                   ref[name].view(np.uint8)), f"{what}: {name}")
                self.assertEqual(curve, ref_curve, what)

    def test_manual_backward_is_only_in_the_test_program(self):
        """train_gpt has no --manual-backward (unknown option, exit 2); train_gpt_manual runs
        the hand-written pass (the tape holds nothing) and refuses what it cannot do with one
        line: --pipe (exit 2), the Llama variant (exit 1)."""
        _, err = run(0, 1, ["--manual-backward"], expect=2)
        self.assertIn("unknown option '--manual-backward'", err)
        d = self.path("m")
        out, _ = run(0, 1, self.mesh("1x1") + SMALL[:-1] + ["--steps", "1", "--out", d,
                                                            "--manual-backward"],
                     train=TRAIN_MANUAL)
        self.assertIn("tape: at most 0 bytes held", out)
        _, err = run(0, 1, self.mesh("1x1") + ["--pipe", "1", "--manual-backward"], expect=2,
                     train=TRAIN_MANUAL)
        self.assertEqual(err.strip(), "train_gpt: --manual-backward with --pipe is not supported")
        _, err = run(0, 1, self.mesh("1x1") + SMALL + ["--arch", "llama", "--steps", "1",
                                                      "--out", d, "--manual-backward"],
                     expect=1, train=TRAIN_MANUAL)
        self.assertIn("--arch llama has no hand-written backward", err)

    def test_llama_arch_learns_and_its_meshes_agree(self):
        """--arch llama (RMS norms, rotary, SwiGLU, grouped-query attention with 2 kv heads of
        4) on 1x1 and on 2x2 (heads and MLP columns over model): the same losses within
        rounding, and the loss goes down."""
        args = SMALL + ["--arch", "llama", "--heads", "4", "--steps", "6"]
        got = {}
        for name, procs in (("1x1", 0), ("2x2", 2)):
            d = self.path("llama-" + name)
            out, _ = run(procs, 1 if name == "1x1" else 2, self.mesh(name) + args + ["--out", d])
            got[name] = (self.result(out, d), losses(os.path.join(d, "curves.csv")),
                         read_checkpoint(os.path.join(d, "checkpoint"))[0])
        (h1, c1, p1), (h4, c4, p4) = got["1x1"], got["2x2"]
        self.assertIn("block0/mlp/gate", p1)
        self.assertEqual(p1["block0/attn/k"].shape, (16, 8))  # 2 kv heads of 4
        self.assertAlmostEqual(h1, h4, delta=2e-4)
        for (s, l, _), (_, l4, _) in zip(c1, c4):
            self.assertAlmostEqual(l, l4, delta=1e-4 * l, msg=f"step {s}")
        self.assertLess(c1[-1][1], c1[0][1])

    def test_outputs_and_bad_options(self):
        d = self.path("o")
        out, _ = run(0, 2, self.mesh("1x2") + SMALL + ["--steps", "3", "--precision", "bf16",
                                                       "--out", d])
        self.result(out, d)
        with open(os.path.join(d, "curves.png"), "rb") as fh:
            self.assertEqual(fh.read(8), b"\x89PNG\r\n\x1a\n")
        _, err = run(0, 1, ["--steps", "0"], expect=2)
        self.assertEqual(len(err.strip().splitlines()), 1)
        self.assertIn("--steps", err)
        _, err = run(0, 1, ["--arch", "bert"], expect=2)
        self.assertIn("--arch", err)
        _, err = run(0, 1, self.mesh("1x1") + ["--data", self.path("missing.txt")], expect=1)
        self.assertIn("missing.txt", err)


if __name__ == "__main__":
    TRAIN, TRAIN_MANUAL, MPIEXEC, MESHES = sys.argv[1:5]
    test_train_resume.MESHES = MESHES
    unittest.main(argv=sys.argv[:1], verbosity=2)
