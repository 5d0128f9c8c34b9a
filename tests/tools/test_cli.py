#!/usr/bin/env python3
"""Tests of the `dtensor` command-line tool: outputs checked against hand-worked expectations,
exit codes 0 (success), 1 (bad input, message on stderr), 2 (usage). Standard library only.
Usage: test_cli.py PATH/TO/dtensor"""
import os
import subprocess
import sys
import tempfile
import unittest

TOOL = None


def run(*args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([TOOL, *args], capture_output=True, text=True, env=e, timeout=60)
    return p.returncode, p.stdout, p.stderr


def expanded(dims, n, kind="CPU", name="", short=False):
    """The full mesh string of n devices on task 0: as the runtime names them (YAML, created
    meshes), or as TensorFlow expands the short form |dims|*KIND (short=True: no replica)."""
    ids = ",".join(str(i) for i in range(n))
    task = "/job:localhost/task:0" if short else "/job:localhost/replica:0/task:0"
    devs = ",".join(f"{task}/device:{kind}:{i}" for i in range(n))
    return f"{name}|{dims}|{ids}|{ids}|{devs}"


YAML = """\
meshes:
  - name: train
    device_type: CPU
    dims: {batch: 2, model: 3}
  - name: host
    dims: {x: 4}
"""


class MeshShow(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "meshes.yaml")
        with open(self.path, "w") as f:
            f.write(YAML)

    def tearDown(self):
        self.dir.cleanup()

    def test_yaml_selected_by_name_prints_canonical_string_then_table(self):
        rc, out, err = run("mesh", "show", self.path, "--name", "train")
        self.assertEqual(rc, 0, err)
        lines = out.splitlines()
        self.assertEqual(lines[0], expanded("batch=2,model=3", 6, name="train"))
        # One table row per device: position, device id, then its coordinates.
        rows = [l.split() for l in lines if l.split()[:1] and l.split()[0].isdigit()]
        self.assertEqual([r[:4] for r in rows],
                         [[str(p), str(p), str(p // 3), str(p % 3)] for p in range(6)])

    def test_string_short_form_prints_expanded(self):
        rc, out, err = run("mesh", "show", "--string", "|x=2,y=2|*CPU")
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.splitlines()[0], expanded("x=2,y=2", 4, short=True))

    def test_tpu_mesh_shows_its_type_and_that_it_cannot_hold_tensors(self):
        rc, out, err = run("mesh", "show", "--string", "TPU|x=2|*TPU")
        self.assertEqual(rc, 0, err)
        lines = out.splitlines()
        self.assertEqual(lines[0], expanded("x=2", 2, kind="TPU", name="TPU", short=True))
        self.assertEqual(lines[1], "mesh 'TPU': 2 TPU devices, 1 dims (cannot hold tensors here)")

    def test_empty_mesh_shows_as_empty(self):
        rc, out, err = run("mesh", "show", "--string", "empty_mesh")
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.splitlines(), ["empty_mesh", "the empty mesh: no dims, no devices"])

    def test_full_string_round_trips(self):
        s = expanded("batch=2,model=2", 4, name="m")
        rc, out, _ = run("mesh", "show", "--string", s)
        self.assertEqual((rc, out.splitlines()[0]), (0, s))

    def test_unknown_mesh_name_is_bad_input(self):
        rc, out, err = run("mesh", "show", self.path, "--name", "nope")
        self.assertEqual(rc, 1)
        self.assertIn("nope", err)

    def test_malformed_yaml_names_line_and_column(self):
        bad = os.path.join(self.dir.name, "bad.yaml")
        with open(bad, "w") as f:
            f.write("mesh:\n  name: a\n  dims: {x: 2, x: 3}\n")
        rc, _, err = run("mesh", "show", bad)
        self.assertEqual(rc, 1)
        self.assertIn("bad.yaml:3:", err)

    def test_missing_file_is_bad_input(self):
        rc, _, err = run("mesh", "show", os.path.join(self.dir.name, "absent.yaml"))
        self.assertEqual(rc, 1)
        self.assertIn("absent.yaml", err)

    def test_directory_is_bad_input_that_says_so(self):
        rc, out, err = run("mesh", "show", self.dir.name)
        self.assertEqual((rc, out), (1, ""))
        self.assertIn(f"{self.dir.name}: is a directory, not a mesh file", err)

    def test_file_of_two_meshes_without_name_shows_both(self):
        rc, out, err = run("mesh", "show", self.path)
        self.assertEqual(rc, 0, err)
        lines = out.splitlines()
        self.assertEqual(lines[0], f"{self.path}: 2 meshes: train, host (--name NAME shows one)")
        self.assertIn(expanded("batch=2,model=3", 6, name="train"), lines)
        self.assertIn(expanded("x=4", 4, name="host"), lines)
        self.assertIn("mesh 'train': 6 CPU devices, 2 dims", lines)
        self.assertIn("mesh 'host': 4 CPU devices, 1 dims", lines)
        # The host mesh's table: 4 rows of position, device and x.
        host = lines[lines.index("mesh 'host': 4 CPU devices, 1 dims"):]
        rows = [l.split() for l in host if l.split()[:1] and l.split()[0].isdigit()]
        self.assertEqual([r[:3] for r in rows], [[str(p)] * 3 for p in range(4)])

    def test_second_unnamed_mesh_is_named_as_not_shown(self):
        path = os.path.join(self.dir.name, "unnamed.yaml")
        with open(path, "w") as f:
            f.write("meshes:\n  - {dims: {x: 2}}\n  - {dims: {y: 4}}\n")
        rc, out, err = run("mesh", "show", path)
        self.assertEqual(rc, 0, err)
        lines = out.splitlines()
        self.assertEqual(lines[0], f"{path}: 2 meshes: (unnamed), (unnamed) "
                                   "(--name NAME shows one)")
        self.assertEqual(lines[2], expanded("x=2", 2))
        self.assertEqual(lines[-1], "mesh 2 of 2: unnamed, as an earlier one: not shown (give "
                                    "it a name of its own)")

    def test_usage_errors_exit_2(self):
        for args in (["mesh"], ["mesh", "show"], ["mesh", "frob"], ["nonsense"], []):
            rc, _, err = run(*args)
            self.assertEqual(rc, 2, args)
            self.assertIn("usage", err)


class LayoutShow(unittest.TestCase):
    def test_short_mesh_prints_expanded_layout(self):
        rc, out, err = run("layout", "show", "sharding_specs:x,unsharded, mesh:|x=2,y=2|*CPU")
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.splitlines()[0],
                         "sharding_specs:x,unsharded, mesh:" + expanded("x=2,y=2", 4, short=True))

    def test_placeholder_layout_prints_but_has_no_shards(self):
        text = "sharding_specs:any,x, mesh:|x=2|*CPU"
        rc, out, err = run("layout", "show", text)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.splitlines()[0],
                         "sharding_specs:any,x, mesh:" + expanded("x=2", 2, short=True))
        rc, _, err = run("layout", "show", text, "--shape", "4,4")
        self.assertEqual(rc, 1)
        self.assertIn("placeholder 'any'", err)

    def test_shape_adds_picture_and_shards(self):
        rc, out, err = run("layout", "show", "sharding_specs:x,y, mesh:|x=2,y=2|*CPU",
                           "--shape", "5,3")
        self.assertEqual(rc, 0, err)
        # Shards by hand: rows 5 over 2 -> [0,3) [3,5); cols 3 over 2 -> [0,2) [2,3).
        want = {0: ("[0,0]", "[3,2]"), 1: ("[0,2]", "[3,1]"),
                2: ("[3,0]", "[2,2]"), 3: ("[3,2]", "[2,1]")}
        got = {}
        for l in out.splitlines():
            f = l.split()
            if len(f) == 4 and f[0].isdigit() and f[2].startswith("["):
                got[int(f[0])] = (f[2], f[3])
        self.assertEqual(got, want)

    def test_more_devices_than_present_still_prints(self):
        rc, out, err = run("layout", "show", "sharding_specs:x, mesh:|x=64|*CPU", "--shape", "128")
        self.assertEqual(rc, 0, err)

    def test_bad_layout_is_bad_input(self):
        rc, _, err = run("layout", "show", "sharding_specs:z,unsharded, mesh:|x=2|*CPU")
        self.assertEqual(rc, 1)
        self.assertIn("z", err)

    def test_shape_of_wrong_rank_is_bad_input(self):
        rc, _, err = run("layout", "show", "sharding_specs:x, mesh:|x=2|*CPU", "--shape", "4,4")
        self.assertEqual(rc, 1)

    def test_layout_without_its_mesh_says_the_mesh_is_missing(self):
        rc, out, err = run("layout", "show", "sharding_specs:batch,unsharded")
        self.assertEqual((rc, out), (1, ""))
        self.assertIn("column 31: the mesh is missing: expected ', mesh:MESH' after sharding "
                      "spec 'unsharded'", err)

    def test_shape_size_out_of_range_is_refused(self):
        # strtoll clamps it to INT64_MAX, which was taken for the size.
        rc, out, err = run("layout", "show", "sharding_specs:x,unsharded, mesh:|x=2|*CPU",
                           "--shape", "99999999999999999999,2")
        self.assertEqual((rc, out), (1, ""))
        self.assertIn("--shape '99999999999999999999,2': size 99999999999999999999 is out of "
                      "range (at most 9223372036854775807)", err)

    def test_shape_size_that_is_not_a_number_is_named(self):
        for bad, word in (("4,x", "'x'"), ("-4,2", "'-4'"), ("4,2z", "'2z'")):
            rc, out, err = run("layout", "show", "sharding_specs:x,unsharded, mesh:|x=2|*CPU",
                               "--shape", bad)
            self.assertEqual((rc, out), (1, ""), bad)
            self.assertIn(f"{word} is not a size", err)


class Launch(unittest.TestCase):
    def test_mpiexec_count_option_is_a_usage_error_naming_the_right_one(self):
        for args in (["-n", "2"], ["-n", "2", "--", "prog"], ["-np", "2", "prog"]):
            rc, out, err = run("launch", *args)
            self.assertEqual((rc, out), (2, ""), args)
            self.assertIn(f"dtensor launch: {args[0]} is mpiexec's option: give the count as "
                          "--nproc-per-node N", err)

    def test_no_program_says_it_is_missing(self):
        rc, _, err = run("launch", "--nproc-per-node", "2")
        self.assertEqual(rc, 2)
        self.assertIn("no program given", err)


class Info(unittest.TestCase):
    def test_info_reports_devices_from_environment(self):
        rc, out, err = run("info", env={"DT_CPU_DEVICES": "3", "DT_BIND": "0"})
        self.assertEqual(rc, 0, err)
        self.assertIn("client 0 of 1", out)
        self.assertIn("CPU devices: 3 local, 3 global, ids 0..2", out)
        self.assertRegex(out, r"topology: \d+ packages, \d+ NUMA nodes, [1-9]\d* cores")

    def test_info_rejects_bad_device_count(self):
        rc, _, err = run("info", env={"DT_CPU_DEVICES": "zero"})
        self.assertEqual(rc, 1)
        self.assertIn("DT_CPU_DEVICES", err)


if __name__ == "__main__":
    TOOL = sys.argv.pop(1)
    unittest.main(verbosity=2)
