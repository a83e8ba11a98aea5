"""`phantora trace` end to end: real scripts, run under the real CLI, checked from outside.

Each test starts the CLI as a subprocess (a fresh simulator and fresh rank processes), so these
tests take a few seconds each; they are what users do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from phantora.trace.check import check_chrome_trace, load_chrome_trace

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
SMALL_GPT = ["--layers", "2", "--embd", "256", "--heads", "4", "--seq", "256", "--batch", "4", "--steps", "3"]


def phantora(*args: str, cwd: Path = ROOT, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phantora.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def trace_script(tmp_path: Path, script: str, *script_args: str, options: tuple[str, ...] = (),
                 name: str = "run.json") -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / name
    proc = phantora("trace", *options, "-o", str(out), "--", sys.executable, script, *script_args)
    return proc, out


def events(path: Path) -> list[dict]:
    return load_chrome_trace(path)["traceEvents"]


def kernels(path: Path) -> list[dict]:
    return [e for e in events(path) if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy")]


@pytest.mark.slow
def test_gpt_example_end_to_end(tmp_path):
    proc, out = trace_script(tmp_path, "examples/gpt_train.py", *SMALL_GPT)
    assert proc.returncode == 0, proc.stderr
    step_lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert len(step_lines) == 3 and "ms" in step_lines[0]
    assert "phantora: simulated 1 rank(s)" in proc.stderr and "unknown ops: none" in proc.stderr
    check = check_chrome_trace(out)
    assert check.ok, check.problems
    ks = kernels(out)
    ops = Counter(k["args"]["op"] for k in ks)
    # SDPA took the fused path a real H100 takes (cuDNN), not the math path (bmm + softmax)
    assert ops["aten::_scaled_dot_product_cudnn_attention.default"] == 2 * 3
    assert ops["aten::_scaled_dot_product_cudnn_attention_backward.default"] == 2 * 3
    assert "aten::_softmax.default" not in ops
    assert ops["aten::_fused_adamw_.default"] == 3
    for k in ks:
        assert {"op", "shapes", "dtypes", "flops", "bytes", "estimator"} <= set(k["args"]), k
    assert check.flows == len(ks)  # every kernel is linked to its launch
    counters = [e for e in events(out) if e.get("ph") == "C"]
    assert counters and all(set(c["args"]) == {"allocated", "reserved"} for c in counters)
    names = {e["args"]["name"] for e in events(out) if e.get("name") == "thread_name"}
    assert {"host (aten op launches)", "cuda:0 default stream"} <= names


@pytest.mark.slow
def test_step_time_printed_by_the_script_is_the_simulated_time(tmp_path):
    proc, out = trace_script(tmp_path, "examples/gpt_train.py", *SMALL_GPT)
    assert proc.returncode == 0, proc.stderr
    printed_ms = [float(line.split("time ")[1].split(" ms")[0]) for line in proc.stdout.splitlines()
                  if line.startswith("step ")]
    # Each step runs from the end of torch.cuda.synchronize() to the end of loss.item() (the first
    # host read after it); the script's perf_counter must measure exactly that simulated span.
    host = sorted((e for e in events(out) if e.get("ph") == "X" and e["tid"] == 1), key=lambda e: e["ts"])
    spans = []
    for i, e in enumerate(host):
        if e["name"] == "cudaDeviceSynchronize":
            item = next(h for h in host[i:] if h["name"] == "aten::_local_scalar_dense")
            spans.append((item["ts"] + item["dur"] - e["ts"] - e["dur"]) / 1000)
    assert len(spans) == len(printed_ms) == 3
    for printed, span in zip(printed_ms, spans):
        assert printed == pytest.approx(span, abs=0.006), (printed_ms, spans)


def test_a_container_of_optimizers_marks_one_step_per_training_step(tmp_path):
    # TorchTitan steps an Optimizer subclass that steps one optimizer per model part: the outer
    # step is the training step (the inner ones once marked nothing at all)
    proc, out = trace_script(tmp_path, str(SCRIPTS / "nested_optimizers.py"))
    assert proc.returncode == 0, proc.stderr
    steps = [e["name"] for e in events(out) if e.get("ph") == "X" and e["tid"] == 2]
    assert steps == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]


def test_a_container_of_optimizers_marks_its_steps_after_a_checkpoint_stepped_the_inner_ones(tmp_path):
    # A checkpoint load first steps the inner optimizers alone (DCP's zero step that makes AdamW's
    # state): the first of them was taken as the one whose steps mark training steps, and the
    # container's steps (which step it nested) marked none. TorchTitan resumed from a checkpoint
    # showed 1 step for 10. That zero step marks a step of its own (the load), then one per
    # training step.
    proc, out = trace_script(tmp_path, str(SCRIPTS / "nested_optimizers.py"), "load")
    assert proc.returncode == 0, proc.stderr
    steps = [e["name"] for e in events(out) if e.get("ph") == "X" and e["tid"] == 2]
    assert steps == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]


@pytest.mark.slow
def test_optimizer_steps_are_marked_as_profiler_steps(tmp_path):
    proc, out = trace_script(tmp_path, "examples/gpt_train.py", *SMALL_GPT)
    assert proc.returncode == 0, proc.stderr
    evs = events(out)
    names = {e["tid"]: e["args"]["name"] for e in evs if e.get("name") == "thread_name"}
    assert names[2] == "steps (optimizer.step)"
    steps = sorted((e for e in evs if e.get("ph") == "X" and e["tid"] == 2), key=lambda e: e["ts"])
    assert [s["name"] for s in steps] == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    assert all(s["cat"] == "user_annotation" for s in steps)
    assert steps[0]["ts"] == 0
    for a, b in zip(steps, steps[1:]):  # steps tile the run: each starts where the previous ended
        assert b["ts"] == pytest.approx(a["ts"] + a["dur"], abs=0.002)
    host = [e for e in evs if e.get("ph") == "X" and e["tid"] == 1 and e["cat"] == "cpu_op"]
    adamw = sorted((e for e in host if e["name"] == "aten::_fused_adamw_"), key=lambda e: e["ts"])
    assert len(adamw) == 3
    for step, opt in zip(steps, adamw):
        end = step["ts"] + step["dur"]
        # A step ends when the optimizer's step returns: after its last op, before the next op.
        assert step["ts"] <= opt["ts"] and opt["ts"] + opt["dur"] <= end + 0.002
        # (an op starting at the step's end, within the trace's rounding, is the next step's)
        before = max(e["ts"] + e["dur"] for e in host if e["ts"] < end - 0.002)
        assert end == pytest.approx(before, abs=0.002)


@pytest.mark.slow
def test_activation_checkpointing_recomputes_forward(tmp_path):
    plain, out_plain = trace_script(tmp_path, "examples/gpt_train.py", *SMALL_GPT, name="plain.json")
    ckpt, out_ckpt = trace_script(tmp_path, "examples/gpt_train.py", *SMALL_GPT, "--checkpoint", name="ckpt.json")
    assert plain.returncode == 0 and ckpt.returncode == 0, ckpt.stderr
    fwd = "aten::_scaled_dot_product_cudnn_attention.default"
    assert Counter(k["args"]["op"] for k in kernels(out_ckpt))[fwd] == 2 * Counter(
        k["args"]["op"] for k in kernels(out_plain))[fwd]


@pytest.mark.slow
def test_cnn_example_prefetches_on_a_side_stream(tmp_path):
    proc, out = trace_script(tmp_path, "examples/cnn_train.py", "--batch", "16", "--image", "32", "--steps", "3")
    assert proc.returncode == 0, proc.stderr
    assert "GPU time" in proc.stdout
    check = check_chrome_trace(out)
    assert check.ok, check.problems
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events(out) if e.get("name") == "thread_name"}
    side = [tid for (pid, tid), name in tracks.items() if name.startswith("cuda:0 stream ")]
    assert len(side) == 1
    on_side = [k for k in kernels(out) if k["tid"] == side[0]]
    assert on_side and all(k["args"]["op"] == "aten::_to_copy.default" for k in on_side)
    ops = Counter(k["args"]["op"] for k in kernels(out))
    assert any("convolution" in op for op in ops) and any("_amp_foreach_non_finite_check" in op for op in ops)


@pytest.mark.slow
def test_two_runs_give_identical_traces(tmp_path):
    a, out_a = trace_script(tmp_path, "examples/gpt_train.py", *SMALL_GPT, name="a.json")
    b, out_b = trace_script(tmp_path, "examples/gpt_train.py", *SMALL_GPT, name="b.json")
    assert a.returncode == b.returncode == 0
    assert events(out_a) == events(out_b)
    assert load_chrome_trace(out_a)["metadata"]["started_at"] != "" and len(events(out_a)) > 1000


def test_torch_cuda_api_answers_like_an_h100(tmp_path):
    proc, out = trace_script(tmp_path, str(SCRIPTS / "cuda_api.py"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CUDA_API_OK" in proc.stdout
    assert "tensor(<no data: virtual>, size=(2,), dtype=torch.float32, device='cuda:0')" in proc.stdout
    ev = events(out)
    nvtx = [e["name"] for e in ev if e.get("cat") == "nvtx"]
    assert nvtx == ["my-range", "ctx-range"] or sorted(nvtx) == ["ctx-range", "my-range"]
    # elapsed_time between two events equals the simulated GPU time of the kernels between them
    ms = float(proc.stdout.split("ELAPSED_MS ")[1].split()[0])
    mm = [k for k in kernels(out) if k["args"]["op"] == "aten::mm.default" and k["args"]["shapes"] == [[4096, 4096], [4096, 4096]]]
    first_ten = mm[:10]
    span_ms = (first_ten[-1]["ts"] + first_ten[-1]["dur"] - first_ten[0]["ts"]) / 1000
    assert ms >= span_ms * 0.999 and ms <= span_ms + 0.01, (ms, span_ms)
    assert check_chrome_trace(out).ok


def test_virtual_clock(tmp_path):
    proc, out = trace_script(tmp_path, str(SCRIPTS / "clock.py"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CLOCK_OK" in proc.stdout
    matmul_s = float(proc.stdout.split("MATMUL_S ")[1].split()[0])
    mms = [k for k in kernels(out) if k["args"]["op"] == "aten::mm.default"]
    gpu_s = sum(k["dur"] for k in mms) / 1e6
    # the script's perf_counter measured the five matmuls back to back, plus launch/sync overhead
    assert gpu_s <= matmul_s <= gpu_s + 50e-6, (gpu_s, matmul_s)


def test_script_that_raises_keeps_its_traceback_exit_code_and_trace(tmp_path):
    proc, out = trace_script(tmp_path, str(SCRIPTS / "raises.py"))
    assert proc.returncode == 1
    assert "ValueError: boom from the user script" in proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr
    assert check_chrome_trace(out).ok
    assert len([k for k in kernels(out) if k["args"]["op"] == "aten::mm.default"]) == 3


def test_exit_code_is_the_commands(tmp_path):
    proc, out = trace_script(tmp_path, str(SCRIPTS / "exit3.py"))
    assert proc.returncode == 3
    assert load_chrome_trace(out)["metadata"]["exit_code"] == 3


def test_out_of_memory_raises_torch_oom_at_the_failing_op(tmp_path):
    proc, out = trace_script(tmp_path, str(SCRIPTS / "oom.py"), options=("--vram", "4GiB"))
    assert "CAUGHT CUDA out of memory. Tried to allocate 512.00 MiB" in proc.stdout
    assert "OOM_RECOVERED" in proc.stdout
    assert proc.returncode == 1
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB" in proc.stderr
    assert "phantora: rank 0 ran out of memory on simulated cuda:0" in proc.stderr
    ooms = [e for e in events(out) if e.get("name") == "CUDA out of memory"]
    assert len(ooms) == 2 and check_chrome_trace(out).ok


def test_threads_and_dataloader_workers(tmp_path):
    proc, out = trace_script(tmp_path, str(SCRIPTS / "threads_loader.py"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "THREADS_LOADER_OK" in proc.stdout


def test_unsupported_feature_names_itself(tmp_path):
    proc, _ = trace_script(tmp_path, str(SCRIPTS / "unsupported.py"))
    assert proc.returncode == 1
    assert "phantora does not simulate GPU utilization queries" in proc.stderr


def test_gzip_output(tmp_path):
    proc, out = trace_script(tmp_path, str(SCRIPTS / "exit3.py"), name="run.json.gz")
    assert proc.returncode == 3
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    assert check_chrome_trace(out).ok and kernels(out)


def test_unknown_gpu_lists_the_known_ones(tmp_path):
    proc = phantora("trace", "--gpu", "v100", "-o", str(tmp_path / "x.json"), "--", sys.executable, "-c", "pass")
    assert proc.returncode == 2
    assert "unknown GPU 'v100'" in proc.stderr and "h100-sxm-80gb" in proc.stderr and "b200" in proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_gpu_names_are_case_insensitive_short_or_full(tmp_path):
    for name in ("H200", "h200-sxm-141gb"):
        proc = phantora("trace", "--gpu", name, "-o", str(tmp_path / "x.json"), "--", sys.executable, "-c",
                        "import torch; print(torch.cuda.get_device_name())")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "NVIDIA H200"


def test_missing_command(tmp_path):
    proc = phantora("trace", "-o", str(tmp_path / "x.json"), "--", "no-such-command-xyz")
    assert proc.returncode == 127
    assert "command not found: no-such-command-xyz" in proc.stderr


def test_bad_output_extension(tmp_path):
    proc = phantora("trace", "-o", str(tmp_path / "x.txt"), "--", sys.executable, "-c", "pass")
    assert proc.returncode == 2 and ".json" in proc.stderr


@pytest.mark.parametrize("where, message", [
    ("missing/run.json", "does not exist"),
    ("afile/run.json", "is not a directory"),
    (".", "is a directory"),
    ("/proc/phantora-run.json", "cannot write"),
])
def test_unusable_output_paths_fail_in_one_line_before_any_rank_starts(tmp_path, where, message):
    (tmp_path / "afile").write_text("x")
    marker = tmp_path / "script_ran"
    out = where if where.startswith("/") else str(tmp_path / where)
    proc = phantora("trace", "-o", out, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "missing").exists(), "the missing directory was created"
    assert not marker.exists(), "the command ran although its trace could not be written"


def test_version_and_help():
    from phantora import __version__

    v = phantora("--version")
    assert v.returncode == 0 and __version__ in v.stdout
    h = phantora("trace", "--help")
    assert h.returncode == 0 and "phantora trace -o run.json -- python examples/gpt_train.py" in h.stdout


def test_existing_sitecustomize_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = tmp_path / "x.json"
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "trace", "-o", str(out), "--", sys.executable, "-c",
                           "import os, torch; print(os.environ.get('USER_SITECUSTOMIZE_RAN'), torch.cuda.is_available())"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "True"]


def test_ctrl_c_ends_children_and_writes_a_valid_trace(tmp_path):
    out = tmp_path / "int.json"
    proc = subprocess.Popen([sys.executable, "-m", "phantora.cli", "trace", "-o", str(out), "--", sys.executable,
                             str(SCRIPTS / "slow_forever.py")], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.time() + 120
    line = ""
    while "STARTED" not in line and time.time() < deadline:
        line = proc.stdout.readline()
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    check = check_chrome_trace(out)
    assert check.ok and check.slices > 0
    assert json.loads(json.dumps(load_chrome_trace(out)["metadata"]))["exit_code"] == 130


def test_a_freed_pinned_buffers_address_does_not_make_a_new_tensor_pinned(tmp_path):
    # Before the fix, every one of the 300 fresh pageable tensors reused a freed pinned
    # buffer's address and reported is_pinned(), so the GPT example's pin_memory() was skipped
    # in some runs and two runs of it gave different traces.
    proc, _ = trace_script(tmp_path, str(SCRIPTS / "pinned_reuse.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "PINNED_REUSE wrongly pinned 0" in proc.stdout
