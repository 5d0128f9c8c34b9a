#!/usr/bin/env python3
"""A checkpoint read without libdtensor: make_ckpt saves tensors whose values are a formula of
(tensor id, global index, version) under mpiexec -n 2 (and in one process with 3 devices); this
test parses the safetensors files and the index itself (stdlib + numpy), rebuilds every global
tensor, checks every CRC32C and compares every element with the formula. It also drives
`dtensor ckpt ls/verify/export` and checks the export as standard safetensors.
Usage: test_ckpt_files.py DTENSOR MAKE_CKPT MPIEXEC"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
    import stread
    from stread import SafeTensorsFile, crc32c
except ImportError as e:  # numpy missing: meson's skip code
    print(f"skipping: {e}")
    sys.exit(77)

TOOL = HELPER = MPIEXEC = None
VERSION = 5

# The tensors make_ckpt saves (same table as make_ckpt.c): name -> (id, dtype, global shape).
TENSORS = {
    "layer.0/w": (0, "F32", [13, 7]),
    "emb": (1, "BF16", [11, 6]),
    "table": (2, "I64", [5, 3]),
    "bias": (3, "F64", [9]),
    "scalar": (4, "F32", []),
    "../../escape/me": (5, "I32", [4, 2]),
    "half": (6, "F16", [6, 5]),
    "bytes": (7, "U8", [37]),
    "empty": (8, "F32", [0, 3]),
}

# Tensors saved as explicitly placed pieces with `make_ckpt save --pieces` (same table as
# make_ckpt.c's PSPECS; ids from 20). Their index layout is "".
PIECE_TENSORS = {
    "zero/m": (20, "F32", [50]),
    "zero/v": (21, "BF16", [7, 5]),
    "zero/c": (22, "I64", [4, 3]),
}


def expected(tid, dtype, shape, v):
    """The values make_ckpt writes, recomputed here: element i = formula(tid, i, v)."""
    i = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    if dtype in ("F32", "F64"):
        x = ((i * 3 + tid * 101 + v * 7919) % 65521 - 30000) * 0.25
        x = x.astype("<f4" if dtype == "F32" else "<f8")
    elif dtype == "BF16":
        x = stread.f32_to_bf16_bits(((i + tid * 31 + v * 17) % 251 - 125).astype(np.float32))
    elif dtype == "F16":
        x = ((i * 5 + tid * 31 + v * 17) % 2039 - 1000).astype("<f2")
    elif dtype == "I64":
        x = (i * 1000003 + tid * (1 << 40) + v * (1 << 50) - (1 << 55)).astype("<i8")
    elif dtype == "I32":
        x = (i * 7 + tid * 1000 + v * 100000 - 5000000).astype("<i4")
    elif dtype == "U8":
        x = ((i * 7 + tid * 13 + v * 17) % 256).astype("u1")
    else:
        raise ValueError(dtype)
    return x.reshape(shape)


def same_bits(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype.itemsize == b.dtype.itemsize and \
        a.tobytes() == b.tobytes()


def run(args, env=None, timeout=60):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(args, capture_output=True, text=True, env=e, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def tool(*args):
    return run([TOOL, *args])


def save(d, nproc, devices, version=VERSION, pieces=False):
    cmd = [HELPER, "save", d, str(version)] + (["--pieces"] if pieces else [])
    if nproc > 1:
        cmd = [MPIEXEC, "-n", str(nproc), *cmd]
    rc, out, err = run(cmd, env={"DT_CPU_DEVICES": str(devices)}, timeout=120)
    if rc != 0:
        raise AssertionError(f"make_ckpt save failed ({rc}):\n{out}\n{err}")


def read_index(d):
    with open(os.path.join(d, "dtensor-index.json"), encoding="utf-8") as f:
        return json.load(f)


def rebuild_from_index(d, index, check_crc=True):
    """Every global tensor from the index's slices; checks sizes and (optionally) CRCs."""
    sizes = {f["name"]: f["bytes"] for f in index["files"]}
    raws = {}
    out = {}
    for t in index["tensors"]:
        dt, item = stread.ST_DTYPES[t["dtype"]]
        g = np.zeros(t["shape"], dtype=dt)
        for s in t["slices"]:
            if s["file"] not in raws:
                with open(os.path.join(d, s["file"]), "rb") as f:
                    raws[s["file"]] = f.read()
                assert len(raws[s["file"]]) == sizes[s["file"]], s["file"]
            raw = raws[s["file"]][s["file_offset"]:s["file_offset"] + s["bytes"]]
            assert len(raw) == s["bytes"]
            if check_crc:
                assert crc32c(raw) == s["crc32c"], (t["name"], s)
            box = tuple(slice(o, o + n) for o, n in zip(s["offsets"], s["sizes"]))
            g[box] = np.frombuffer(raw, dtype=dt).reshape(s["sizes"])
        out[t["name"]] = g
    return out


class Checkpoint(unittest.TestCase):
    """Shared: one checkpoint saved by 2 processes x 2 devices, one by 1 process x 3 devices."""
    NPROC, DEVICES = 2, 2
    PIECES = False

    @classmethod
    def tensors(cls):
        return {**TENSORS, **PIECE_TENSORS} if cls.PIECES else TENSORS

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.parent = os.path.join(cls.tmp.name, "run")
        os.mkdir(cls.parent)
        cls.dir = os.path.join(cls.parent, "ckpt")
        save(cls.dir, cls.NPROC, cls.DEVICES, pieces=cls.PIECES)
        cls.index = read_index(cls.dir)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def data_files(self):
        return [f["name"] for f in self.index["files"]]

    def test_directory_holds_only_data_files_and_index_and_nothing_escapes(self):
        n = len(self.index["files"])
        want = {f"data-{k:05d}-of-{n:05d}.safetensors" for k in range(n)}
        self.assertEqual(set(os.listdir(self.dir)), want | {"dtensor-index.json"})
        self.assertEqual(self.data_files(), sorted(want))
        # The name "../../escape/me" is a key, never a path: nothing beside the checkpoint.
        self.assertEqual(os.listdir(self.parent), ["ckpt"])
        self.assertEqual(os.listdir(self.tmp.name), ["run"])

    def test_index_top_level_fields(self):
        ix = self.index
        self.assertEqual(ix["format"], "dtensor-checkpoint")
        self.assertEqual(ix["format_version"], 2)
        # The index's last member is the CRC32C of every byte of the file before it.
        with open(os.path.join(self.dir, "dtensor-index.json"), "rb") as f:
            raw = f.read()
        self.assertEqual(list(ix)[-1], "index_crc32c")
        at = raw.rindex(b'"index_crc32c": "')
        self.assertEqual(raw[at:], b'"index_crc32c": "%08x"\n}\n' % crc32c(raw[:at]))
        self.assertEqual(ix["checksum"], "crc32c")
        self.assertEqual(ix["num_devices"], self.NPROC * self.DEVICES)
        self.assertEqual(ix["chunk_bytes"] % 4096, 0)
        self.assertEqual([t["name"] for t in ix["tensors"]], list(self.tensors()))
        for t in ix["tensors"]:
            _, dtype, shape = self.tensors()[t["name"]]
            self.assertEqual((t["dtype"], t["shape"]), (dtype, shape), t["name"])
            if t["name"] in PIECE_TENSORS:
                self.assertEqual(t["layout"], "")
                self.assertEqual(t["mesh"], ix["mesh"])
            else:
                self.assertIn("sharding_specs:", t["layout"])

    def test_every_data_file_is_standard_safetensors_with_dcp_sharding_info(self):
        for name in self.data_files():
            st = SafeTensorsFile(os.path.join(self.dir, name))  # strict: raises when not
            self.assertEqual((8 + st.header_len) % 8, 0, name)
            md = st.metadata
            self.assertEqual(md.get("format"), "pt")
            info = json.loads(md["DCP_SHARDING_INFO"])
            self.assertEqual(set(info), set(st.header), name)
            for key, e in st.header.items():
                self.assertEqual(len(info[key]["saved_offsets"]), len(e["shape"]))
                itemsize = stread.ST_DTYPES[e["dtype"]][1]
                self.assertEqual(e["data_offsets"][0] % itemsize, 0, (name, key))
            self.assertGreater(len(st.header), 0, f"{name}: a file with no slices")

    def test_index_agrees_with_file_headers_and_every_crc32c(self):
        files = {f["name"]: f for f in self.index["files"]}
        chunk = self.index["chunk_bytes"]
        headers = {}
        for name, f in files.items():
            path = os.path.join(self.dir, name)
            with open(path, "rb") as fh:
                raw = fh.read()
            st = SafeTensorsFile(path)
            headers[name] = st
            self.assertEqual(len(raw), f["bytes"], name)
            self.assertEqual(f["header_bytes"], 8 + st.header_len, name)
            self.assertEqual(crc32c(raw[:f["header_bytes"]]), f["header_crc32c"], name)
        for t in self.index["tensors"]:
            for s in t["slices"]:
                st = headers[s["file"]]
                e = st.header[s["key"]]
                # A file's further slices of one tensor (pieces) are keyed name#k, and
                # DCP_SHARDING_INFO names their tensor.
                info = json.loads(st.metadata["DCP_SHARDING_INFO"])
                if s["key"] != t["name"]:
                    self.assertRegex(s["key"][len(t["name"]):], r"^#[0-9]+$")
                    self.assertTrue(s["key"].startswith(t["name"]))
                    self.assertEqual(info[s["key"]]["tensor"], t["name"])
                else:
                    self.assertNotIn("tensor", info[s["key"]])
                self.assertEqual(e["dtype"], t["dtype"])
                self.assertEqual(e["shape"], s["sizes"])
                self.assertEqual(e["data_offsets"], s["data_offsets"])
                self.assertEqual(info[s["key"]]["saved_offsets"], s["offsets"])
                self.assertEqual(s["file_offset"], files[s["file"]]["header_bytes"]
                                 + s["data_offsets"][0])
                self.assertEqual(s["bytes"], s["data_offsets"][1] - s["data_offsets"][0])
                raw = bytes(st.raw(s["key"]))
                self.assertEqual(crc32c(raw), s["crc32c"], (t["name"], s["offsets"]))
                chunks = [crc32c(raw[k:k + chunk]) for k in range(0, len(raw), chunk)]
                self.assertEqual(chunks, s["chunk_crc32c"], t["name"])

    def test_slices_tile_every_tensor_exactly(self):
        for t in self.index["tensors"]:
            cover = np.zeros(t["shape"], dtype=np.int64)
            for s in t["slices"]:
                self.assertTrue(all(n > 0 for n in s["sizes"]), f"{t['name']}: empty slice")
                for o, n, g in zip(s["offsets"], s["sizes"], t["shape"]):
                    self.assertTrue(0 <= o and o + n <= g, (t["name"], s))
                box = tuple(slice(o, o + n) for o, n in zip(s["offsets"], s["sizes"]))
                cover[box] += 1
            self.assertTrue((cover == 1).all(), f"{t['name']}: slices overlap or leave gaps")
            if t["shape"] == []:
                self.assertEqual(len(t["slices"]), 1)
            if 0 in t["shape"]:
                self.assertEqual(t["slices"], [])

    def test_replicated_blocks_written_once(self):
        by_name = {t["name"]: t for t in self.index["tensors"]}
        self.assertEqual(len(by_name["table"]["slices"]), 1)
        self.assertEqual(len(by_name["scalar"]["slices"]), 1)
        # One file per saving device.
        devs = [f["device_id"] for f in self.index["files"]]
        self.assertEqual(len(devs), len(set(devs)))

    def test_rebuilt_tensors_equal_written_values_bit_for_bit(self):
        got = rebuild_from_index(self.dir, self.index)
        for name, (tid, dtype, shape) in self.tensors().items():
            want = expected(tid, dtype, shape, VERSION)
            self.assertTrue(same_bits(got[name], want), f"{name}: values differ")

    def test_rebuilt_from_data_files_alone_without_index(self):
        """Only the safetensors headers and DCP_SHARDING_INFO, as torch's DCP reader does."""
        pieces = {}
        for name in os.listdir(self.dir):
            if not name.endswith(".safetensors"):
                continue
            st = SafeTensorsFile(os.path.join(self.dir, name))
            info = json.loads(st.metadata["DCP_SHARDING_INFO"])
            for key in st.header:
                name = info[key].get("tensor", key)
                pieces.setdefault(name, []).append((info[key]["saved_offsets"], st.array(key)))
        for name, (tid, dtype, shape) in self.tensors().items():
            if 0 in shape:
                self.assertNotIn(name, pieces)
                continue
            rank = len(shape)
            gshape = [max(o[d] + a.shape[d] for o, a in pieces[name]) for d in range(rank)]
            self.assertEqual(gshape, shape, name)  # no trailing shard is empty here
            g = np.zeros(shape, dtype=pieces[name][0][1].dtype)
            for o, a in pieces[name]:
                g[tuple(slice(x, x + n) for x, n in zip(o, a.shape))] = a
            self.assertTrue(same_bits(g, expected(tid, dtype, shape, VERSION)), name)

    def test_named_values_in_index(self):
        vals = {v["name"]: v for v in self.index["values"]}
        self.assertEqual(vals["step"], {"name": "step", "type": "i64", "value": VERSION})
        lr = np.frombuffer(bytes.fromhex(vals["lr"]["bits"]), dtype=">f8")[0]
        self.assertEqual(lr, 0.001 * VERSION)
        self.assertEqual(bytes.fromhex(vals["rng"]["hex"]),
                         bytes((VERSION * 7 + i) & 255 for i in range(16)))

    def test_restore_onto_other_device_count_and_layouts(self):
        for devices in (1, 3):
            cmd = [HELPER, "check"] + (["--pieces"] if self.PIECES else []) + [self.dir]
            rc, out, err = run(cmd, env={"DT_CPU_DEVICES": str(devices)})
            self.assertEqual((rc, out.strip().splitlines()[-1:]),
                             (0, [f"result {self.dir} version={VERSION}"]), out + err)


class CheckpointOneProcess(Checkpoint):
    """The same checks on a save by one process holding 3 devices (mesh x=3, y=1)."""
    NPROC, DEVICES = 1, 3


class CheckpointPieces(Checkpoint):
    """The same checks with tensors saved as explicitly placed pieces beside the others
    (several per device, of one tensor too; one device's empty), and the tool on them."""
    PIECES = True

    def test_ls_verify_and_export_of_pieces(self):
        rc, out, err = tool("ckpt", "ls", self.dir)
        self.assertEqual(rc, 0, err)
        lines = out.splitlines()
        for name, (_, dtype, shape) in PIECE_TENSORS.items():
            k = lines.index(f"{name} {dtype.lower()} [{','.join(map(str, shape))}] slices="
                            f"{len(next(t for t in self.index['tensors'] if t['name'] == name)['slices'])}")
            self.assertEqual(lines[k + 1], "  layout: (pieces)")
        self.assertIn("key=zero/v#1", out)
        rc, out, err = tool("ckpt", "verify", self.dir)
        self.assertEqual(rc, 0, err)
        out_dir = os.path.join(tempfile.mkdtemp(dir=self.tmp.name), "hf")
        rc, out, err = tool("ckpt", "export", self.dir, out_dir)
        self.assertEqual(rc, 0, err)
        st = SafeTensorsFile(os.path.join(out_dir, "model.safetensors"))
        self.assertEqual(set(st.header), set(self.tensors()))
        for name, (tid, dtype, shape) in self.tensors().items():
            e = st.header[name]
            self.assertEqual((e["dtype"], e["shape"]), (dtype, shape), name)
            self.assertTrue(same_bits(st.array(name), expected(tid, dtype, shape, VERSION)), name)


class Tool(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = os.path.join(cls.tmp.name, "ckpt")
        save(cls.dir, 2, 2)
        cls.index = read_index(cls.dir)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def copy(self):
        d = tempfile.mkdtemp(dir=self.tmp.name)
        dst = os.path.join(d, "ckpt")
        shutil.copytree(self.dir, dst)
        return dst

    def slice_of(self, name, k):
        t = next(t for t in self.index["tensors"] if t["name"] == name)
        return t["slices"][k]

    def test_ls_lists_tensors_dtypes_shapes_layouts_and_slices(self):
        rc, out, err = tool("ckpt", "ls", self.dir)
        self.assertEqual(rc, 0, err)
        lines = out.splitlines()
        for t in self.index["tensors"]:
            _, dtype, shape = TENSORS[t["name"]]
            head = f"{t['name']} {dtype.lower()} [{','.join(map(str, shape))}] " \
                   f"slices={len(t['slices'])}"
            self.assertIn(head, lines)
            self.assertIn(t["layout"], out)
            for s in t["slices"]:
                off = "[" + ",".join(map(str, s["offsets"])) + "]"
                sz = "[" + ",".join(map(str, s["sizes"])) + "]"
                self.assertTrue(any(f"offsets={off} sizes={sz} file={s['file']}" in l
                                    for l in lines), (t["name"], s))
        self.assertIn(f"step i64 {VERSION}", out)

    def test_verify_passes_on_intact_checkpoint(self):
        rc, out, err = tool("ckpt", "verify", self.dir)
        self.assertEqual(rc, 0, err)
        self.assertIn("ok", out)

    def test_verify_names_every_corrupted_slice(self):
        d = self.copy()
        bad = [("layer.0/w", 1), ("emb", 0)]
        for name, k in bad:
            s = self.slice_of(name, k)
            with open(os.path.join(d, s["file"]), "r+b") as f:
                f.seek(s["file_offset"] + s["bytes"] // 2)
                b = f.read(1)
                f.seek(-1, os.SEEK_CUR)
                f.write(bytes([b[0] ^ 0x40]))
        rc, out, err = tool("ckpt", "verify", d)
        self.assertEqual(rc, 1, out + err)
        for name, k in bad:
            s = self.slice_of(name, k)
            line = [l for l in err.splitlines() if f"'{name}'" in l]
            self.assertTrue(line, f"{name} not named:\n{err}")
            self.assertIn(s["file"], line[0])
            self.assertIn(f"slice {k}", line[0])
        # Untouched tensors are not reported.
        self.assertNotIn("'bias'", err)

    def test_verify_names_file_with_flipped_header_byte(self):
        d = self.copy()
        f0 = self.index["files"][-1]
        with open(os.path.join(d, f0["name"]), "r+b") as f:
            f.seek(20)
            b = f.read(1)
            f.seek(20)
            f.write(bytes([b[0] ^ 0x01]))
        rc, out, err = tool("ckpt", "verify", d)
        self.assertEqual(rc, 1, out + err)
        self.assertIn(f0["name"], err)

    def test_verify_names_truncated_and_missing_files(self):
        d = self.copy()
        names = [f["name"] for f in self.index["files"]]
        with open(os.path.join(d, names[0]), "r+b") as f:
            f.truncate(self.index["files"][0]["bytes"] - 3)
        os.remove(os.path.join(d, names[1]))
        rc, out, err = tool("ckpt", "verify", d)
        self.assertEqual(rc, 1, out + err)
        self.assertIn(names[0], err)
        self.assertIn(names[1], err)

    def test_ls_and_verify_read_previous_checkpoint_left_mid_commit(self):
        """A crash between the commit's two renames leaves only D.dtensor-old."""
        d = os.path.join(tempfile.mkdtemp(dir=self.tmp.name), "ckpt")
        shutil.copytree(self.dir, d + ".dtensor-old")
        rc, out, err = tool("ckpt", "ls", d)
        self.assertEqual(rc, 0, err)
        self.assertIn(f"checkpoint {d}.dtensor-old", out)
        self.assertIn("note:", out)
        rc, out, err = tool("ckpt", "verify", d)
        self.assertEqual(rc, 0, err)

    def test_ls_of_a_manager_root_lists_steps_complete_and_latest(self):
        root = os.path.join(tempfile.mkdtemp(dir=self.tmp.name), "run")
        for step, flags in ((3, []), (5, ["--async"]), (8, ["--async"])):
            rc, out, err = run([MPIEXEC, "-n", "2", HELPER, "save", root, str(step), "--step",
                                *flags], env={"DT_CPU_DEVICES": "2"}, timeout=120)
            self.assertEqual(rc, 0, out + err)
        os.mkdir(os.path.join(root, "step-0000000009.dtensor-tmp"))  # a crashed save
        with open(os.path.join(root, "latest")) as f:
            self.assertEqual(f.read(), "step-0000000008\n")
        rc, out, err = tool("ckpt", "ls", root)
        self.assertEqual(rc, 0, err)
        # make_ckpt keeps the last 2 steps: 3 was removed by the save of 8.
        self.assertEqual(out.splitlines(), [
            f"checkpoint steps under {root}: 3",
            "  step 5 step-0000000005 complete",
            "  step 8 step-0000000008 complete latest",
            "  step 9 step-0000000009 incomplete"])
        self.assertEqual(sorted(os.listdir(root)), ["latest", "step-0000000005",
                                                    "step-0000000008",
                                                    "step-0000000009.dtensor-tmp"])
        for step in (5, 8):  # each step is a checkpoint of its own version, read here
            d = os.path.join(root, f"step-{step:010d}")
            ix = read_index(d)
            self.assertEqual(next(v["value"] for v in ix["values"] if v["name"] == "step"),
                             step)
            got = rebuild_from_index(d, ix)
            for name, (tid, dtype, shape) in TENSORS.items():
                self.assertTrue(same_bits(got[name], expected(tid, dtype, shape, step)), name)

    def manager_root(self, steps):
        root = os.path.join(tempfile.mkdtemp(dir=self.tmp.name), "run")
        for step in steps:
            rc, out, err = run([MPIEXEC, "-n", "2", HELPER, "save", root, str(step), "--step"],
                               env={"DT_CPU_DEVICES": "2"}, timeout=120)
            self.assertEqual(rc, 0, out + err)
        return root

    def test_ls_marks_a_damaged_step_and_the_next_save_sets_it_aside(self):
        root = self.manager_root((5, 8))
        s8 = os.path.join(root, "step-0000000008")
        victim = os.path.join(s8, sorted(f for f in os.listdir(s8)
                                         if f.endswith(".safetensors"))[0])
        size = os.path.getsize(victim)
        os.truncate(victim, size - 3)
        rc, out, err = tool("ckpt", "ls", root)
        self.assertEqual(rc, 0, err)
        lines = out.splitlines()
        self.assertEqual(lines[:3], [f"checkpoint steps under {root}: 2",
                                     "  step 5 step-0000000005 complete latest",
                                     f"  step 8 step-0000000008 damaged: {victim}: {size - 3} "
                                     f"bytes, the index records {size} (truncated)"])
        self.assertTrue(lines[3].startswith("note: latest is step 5: 1 damaged step passed "
                                            "over (the newest, 8: "), lines[3])
        # `ls ROOT/latest` follows the pointer (to the damaged step 8) and says so.
        rc, out, err = tool("ckpt", "ls", os.path.join(root, "latest"))
        self.assertEqual(rc, 0, err)
        lines = out.splitlines()
        self.assertEqual(lines[0], f"{root}/latest -> {s8}")
        self.assertTrue(lines[1].startswith("note: that step is damaged (") and
                        lines[1].endswith("; the latest complete step is 5"), lines[1])
        self.assertEqual(lines[2], f"checkpoint {s8} (format 2)")
        # The next save (make_ckpt keeps 2 steps) leaves the damaged step aside, untouched.
        rc, out, err = run([MPIEXEC, "-n", "2", HELPER, "save", root, "9", "--step"],
                           env={"DT_CPU_DEVICES": "2"}, timeout=120)
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(sorted(os.listdir(root)), ["latest", "step-0000000005",
                                                    "step-0000000008.damaged",
                                                    "step-0000000009"])
        aside = os.path.join(root, "step-0000000008.damaged", os.path.basename(victim))
        self.assertEqual(os.path.getsize(aside), size - 3)
        rc, out, err = tool("ckpt", "ls", root)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.splitlines(), [
            f"checkpoint steps under {root}: 3",
            "  step 5 step-0000000005 complete",
            f"  step 8 step-0000000008.damaged damaged, set aside: {aside}: {size - 3} bytes, "
            f"the index records {size} (truncated)",
            "  step 9 step-0000000009 complete latest"])

    def test_ls_verify_and_export_follow_the_latest_pointer(self):
        root = self.manager_root((3,))
        latest, s3 = os.path.join(root, "latest"), os.path.join(root, "step-0000000003")
        rc, out, err = tool("ckpt", "ls", latest)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.splitlines()[:2], [f"{latest} -> {s3}", f"checkpoint {s3} (format 2)"])
        self.assertIn("step i64 3", out)
        rc, out, err = tool("ckpt", "verify", latest)
        self.assertEqual(rc, 0, err)
        self.assertIn(f"ok: {s3}:", out)
        out_dir = os.path.join(self.tmp.name, "from-latest")
        rc, out, err = tool("ckpt", "export", latest, out_dir)
        self.assertEqual(rc, 0, err)
        st = SafeTensorsFile(os.path.join(out_dir, "model.safetensors"))
        self.assertEqual(st.metadata.get("dtensor.value.step"), "3")
        # A pointer naming a step that is not there: the error says where it points.
        with open(latest, "w") as f:
            f.write("step-0000000007\n")
        rc, out, err = tool("ckpt", "ls", latest)
        self.assertEqual(rc, 1, out + err)
        self.assertIn(f"{latest} names {root}/step-0000000007: DT_ERR_NOT_FOUND", err)
        # A file that is no pointer is refused, naming what was expected.
        with open(latest, "w") as f:
            f.write("garbage\n")
        rc, out, err = tool("ckpt", "ls", latest)
        self.assertEqual(rc, 1, out + err)
        self.assertIn("not a manager's 'latest' pointer", err)

    def test_export_to_a_safetensors_name_writes_that_one_file(self):
        d = tempfile.mkdtemp(dir=self.tmp.name)
        target = os.path.join(d, "out.safetensors")
        rc, out, err = tool("ckpt", "export", self.dir, target)
        self.assertEqual(rc, 0, err)
        self.assertTrue(os.path.isfile(target))
        self.assertEqual(os.listdir(d), ["out.safetensors"])
        st = SafeTensorsFile(target)
        self.check_exported({k: st for k in st.header}, set(TENSORS))
        # Split into several files it cannot be: refused, nothing written.
        other = os.path.join(d, "split.safetensors")
        rc, out, err = tool("ckpt", "export", self.dir, other, "--max-file-bytes", "256")
        self.assertEqual(rc, 1, out + err)
        self.assertIn("give a directory", err)
        # A directory of that name (an older export) is not written into.
        os.mkdir(other)
        rc, out, err = tool("ckpt", "export", self.dir, other)
        self.assertEqual(rc, 1, out + err)
        self.assertIn("is a directory", err)
        self.assertEqual(os.listdir(other), [])
        self.assertEqual(sorted(os.listdir(d)), ["out.safetensors", "split.safetensors"])

    def test_export_into_a_checkpoint_or_a_manager_root_is_refused(self):
        d = self.copy()
        before = sorted(os.listdir(d))
        root = self.manager_root((2,))
        root_before = sorted(os.listdir(root))
        for target in (d, os.path.join(d, "x.safetensors"), root,
                       os.path.join(root, "step-0000000002"),
                       os.path.join(root, "model.safetensors")):
            rc, out, err = tool("ckpt", "export", self.dir, target)
            self.assertEqual(rc, 1, (target, out, err))
            self.assertIn("exporting into it would mix files into it", err)
            rc, out, err = tool("ckpt", "export", "--format", "hf-gpt2", self.dir, target)
            self.assertEqual(rc, 1, (target, out, err))
        self.assertEqual(sorted(os.listdir(d)), before)
        self.assertEqual(sorted(os.listdir(root)), root_before)

    def test_version_1_index_without_checksum_still_opens_but_version_2_needs_it(self):
        d = self.copy()
        path = os.path.join(d, "dtensor-index.json")
        with open(path, "rb") as f:
            raw = f.read()
        at = raw.rindex(b'"index_crc32c": "')
        body = raw[:at].rstrip()[:-1] + b"\n}\n"  # the member and its comma removed
        self.assertEqual(json.loads(body)["format_version"], 2)
        with open(path, "wb") as f:
            f.write(body)
        rc, out, err = tool("ckpt", "verify", d)
        self.assertEqual(rc, 1, out + err)
        self.assertIn("index_crc32c", err)
        with open(path, "wb") as f:
            f.write(body.replace(b'"format_version": 2', b'"format_version": 1'))
        rc, out, err = tool("ckpt", "verify", d)
        self.assertEqual(rc, 0, out + err)
        rc, out, err = tool("ckpt", "ls", d)
        self.assertIn("(format 1)", out)

    def test_export_one_file_is_standard_safetensors_with_global_tensors(self):
        out_dir = os.path.join(tempfile.mkdtemp(dir=self.tmp.name), "hf")
        rc, out, err = tool("ckpt", "export", self.dir, out_dir)
        self.assertEqual(rc, 0, err)
        self.assertEqual(os.listdir(out_dir), ["model.safetensors"])
        st = SafeTensorsFile(os.path.join(out_dir, "model.safetensors"))
        self.assertEqual((8 + st.header_len) % 8, 0)
        self.check_exported({k: st for k in st.header}, set(TENSORS))
        self.assertEqual(st.metadata.get("dtensor.value.step"), str(VERSION))

    def test_export_split_writes_hf_index_json(self):
        out_dir = os.path.join(tempfile.mkdtemp(dir=self.tmp.name), "hf")
        rc, out, err = tool("ckpt", "export", self.dir, out_dir, "--max-file-bytes", "256")
        self.assertEqual(rc, 0, err)
        with open(os.path.join(out_dir, "model.safetensors.index.json")) as f:
            ix = json.load(f)
        files = sorted(set(ix["weight_map"].values()))
        n = len(files)
        self.assertGreater(n, 1)
        self.assertEqual(files, [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)])
        self.assertEqual(set(os.listdir(out_dir)), set(files) | {"model.safetensors.index.json"})
        by_tensor, total = {}, 0
        for name in files:
            st = SafeTensorsFile(os.path.join(out_dir, name))
            self.assertEqual({k for k, v in ix["weight_map"].items() if v == name},
                             set(st.header))
            tensor_bytes = sum(e["data_offsets"][1] - e["data_offsets"][0]
                               for e in st.header.values())
            # Tensors are never split; a file exceeds the limit only to hold a single tensor.
            self.assertTrue(tensor_bytes <= 256 or len(st.header) == 1, name)
            total += tensor_bytes
            by_tensor.update({k: st for k in st.header})
        self.assertEqual(ix["metadata"]["total_size"], total)
        self.check_exported(by_tensor, set(TENSORS))

    def check_exported(self, by_tensor, names):
        self.assertEqual(set(by_tensor), names)
        for name, (tid, dtype, shape) in TENSORS.items():
            e = by_tensor[name].header[name]
            self.assertEqual((e["dtype"], e["shape"]), (dtype, shape), name)
            self.assertTrue(same_bits(by_tensor[name].array(name),
                                      expected(tid, dtype, shape, VERSION)), name)

    def test_export_refuses_corrupt_checkpoint(self):
        d = self.copy()
        s = self.slice_of("layer.0/w", 0)
        with open(os.path.join(d, s["file"]), "r+b") as f:
            f.seek(s["file_offset"])
            b = f.read(1)
            f.seek(s["file_offset"])
            f.write(bytes([b[0] ^ 0x80]))
        never = os.path.join(self.tmp.name, "never")
        rc, out, err = tool("ckpt", "export", d, never)
        self.assertEqual(rc, 1, out + err)
        self.assertIn("layer.0/w", err)
        # Outputs only on success: no safetensors file that looks complete but is not.
        left = os.listdir(never) if os.path.isdir(never) else []
        self.assertEqual([f for f in left if f.endswith((".safetensors", ".json"))], [], left)

    def test_bad_input_exits_1_and_usage_exits_2(self):
        empty = tempfile.mkdtemp(dir=self.tmp.name)
        rc, _, err = tool("ckpt", "ls", empty)
        self.assertEqual(rc, 1)
        self.assertIn(empty, err)
        rc, _, err = tool("ckpt", "verify", os.path.join(empty, "absent"))
        self.assertEqual(rc, 1)
        for args in (["ckpt"], ["ckpt", "ls"], ["ckpt", "frob", self.dir],
                     ["ckpt", "export", self.dir], ["ckpt", "ls", self.dir, "extra"],
                     ["ckpt", "export", self.dir, empty, "--max-file-bytes", "lots"]):
            rc, _, err = tool(*args)
            self.assertEqual(rc, 2, args)


class Crc(unittest.TestCase):
    def test_crc32c_check_values(self):
        self.assertEqual(crc32c(b"123456789"), 0xE3069283)
        self.assertEqual(crc32c(b""), 0)
        self.assertEqual(crc32c(b"\x00" * 32), 0x8A9136AA)  # RFC 3720 B.4
        self.assertEqual(crc32c(b"\xff" * 32), 0x62A8AB43)
        data = bytes(range(256)) * 5 + b"tail"
        self.assertEqual(crc32c(data[100:], crc32c(data[:100])), crc32c(data))


if __name__ == "__main__":
    TOOL, HELPER, MPIEXEC = sys.argv[1:4]
    del sys.argv[1:4]
    unittest.main(verbosity=2)
